"""Strings of a program file's manifest (method, input and state names, dtypes, glue op
names) reach error messages and ``vkdelegate inspect`` with their control characters
escaped (``vkdelegate.errors.printable``): one message, one line. The blob side and
the fuzz finding: tests/serialization/test_control_characters.py."""
import pytest

import vkdelegate
from vkdelegate import VkDelegateError
from vkdelegate.cli import main

from . import crafted

ODD = "\x1c\n\x00"


def _message(call) -> str:
    with pytest.raises(VkDelegateError) as info:
        call()
    message = str(info.value)
    assert message.isprintable() and len(message.splitlines()) == 1, message
    return message


def test_method_and_input_names_are_escaped_in_call_errors(tmp_path):
    m = crafted.manifest()
    m["methods"]["fwd" + ODD] = m["methods"].pop("forward")
    m["methods"]["fwd" + ODD]["plan"]["inputs"][0]["name"] = "x" + ODD
    with vkdelegate.load(crafted.write_raw(tmp_path / "p.vkp", m)) as program:
        message = _message(lambda: program.run("fwd" + ODD))
    assert message == ("'fwd\\x1c\\n\\x00' takes 1 input(s) ('x\\x1c\\n\\x00'); missing "
                       "'x\\x1c\\n\\x00'")


def test_normal_names_read_as_before(tmp_path):
    with vkdelegate.load(crafted.write_raw(tmp_path / "p.vkp", crafted.manifest())) as p:
        assert _message(lambda: p.run("forward")) == "forward takes 1 input(s) (x); missing x"


def test_glue_op_name_is_escaped_in_the_refusal(tmp_path):
    m = crafted.manifest()
    m["methods"]["forward"]["plan"]["nodes"][2]["op"] = "aten.sort.default" + ODD
    path = crafted.write_raw(tmp_path / "p.vkp", m)
    assert "calls 'aten.sort.default\\x1c\\n\\x00', which a program's CPU part may not " \
           "call" in _message(lambda: vkdelegate.load(path))


def test_state_dtype_is_escaped(tmp_path):
    m = crafted.manifest()
    m["initial_state"]["count"]["dtype"] = "float32" + ODD
    path = crafted.write_raw(tmp_path / "p.vkp", m)
    assert "dtype 'float32\\x1c\\n\\x00' not allowed" in _message(lambda: vkdelegate.load(path))


def test_inspect_escapes_method_input_and_state_strings(tmp_path, capsys):
    m = crafted.manifest()
    plan = m["methods"]["forward"]["plan"]
    plan["inputs"][0].update(name="x" + ODD, dtype="float32" + ODD)
    m["methods"]["fwd" + ODD] = m["methods"].pop("forward")
    m["initial_state"]["count" + ODD] = dict(m["initial_state"].pop("count"),
                                             dtype="float32" + ODD)
    path = crafted.write_raw(tmp_path / "p.vkp", m)
    assert main(["inspect", path]) == 0
    out, err = capsys.readouterr()
    assert err == "" and all(line.isprintable() for line in out.split("\n"))
    assert "  'fwd\\x1c\\n\\x00'('x\\x1c\\n\\x00': 'float32\\x1c\\n\\x00'[3, 4])" in out
    assert "  'count\\x1c\\n\\x00': 'float32\\x1c\\n\\x00'[4]" in out
    assert main(["inspect", path, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and all(line.isprintable() for line in out.split("\n"))
