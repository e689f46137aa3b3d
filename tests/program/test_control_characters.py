"""Strings of a program file's manifest (method, input, state and value names, dtypes,
glue op names) reach error messages and ``vkdelegate inspect`` with their control
characters escaped (``vkdelegate.errors.printable``), and a wrapped torch error keeps
its first line (``first_line``): one message, one line. The blob side and the inspect
finding: tests/serialization/test_control_characters.py."""
from pathlib import Path

import numpy as np
import pytest

import vkdelegate
from vkdelegate import VkDelegateError
from vkdelegate.cli import main

from . import crafted

ODD = "\x1c\n\x00"
FINDINGS = Path(__file__).resolve().parents[2] / "fuzz" / "findings"


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


def test_inspect_escapes_the_partition_report(tmp_path, capsys):
    m = crafted.manifest()
    m["methods"]["forward"]["report"] = {
        "num_partitions": 1,
        "decisions": [["n" + ODD, "aten.sort.default" + ODD, ["why" + ODD], None]]}
    path = crafted.write_raw(tmp_path / "p.vkp", m)
    assert main(["inspect", path]) == 0
    out, err = capsys.readouterr()
    assert err == "" and all(line.isprintable() for line in out.split("\n"))
    assert "'why\\x1c\\n\\x00'" in out
    # A malformed report is one error line.
    m["methods"]["forward"]["report"] = {"num_partitions": 1, "decisions": [[1]]}
    path = crafted.write_raw(tmp_path / "q.vkp", m)
    assert main(["inspect", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "malformed partition report" in err[0] and "q.vkp" in err[0], err


def test_a_failing_glue_op_names_its_output_escaped(tmp_path):
    m = crafted.manifest()
    nodes = m["methods"]["forward"]["plan"]["nodes"]
    nodes[2]["out"] = "sort" + ODD  # aten.sort.default, then asked for dim 5 of 2
    nodes[2]["args"].append(5)
    nodes[3]["args"][0] = {"v": "sort" + ODD}
    with vkdelegate.load(crafted.write_raw(tmp_path / "p.vkp", m)) as program:
        message = _message(lambda: program.run("forward", crafted.example()))
    assert message.startswith("CPU op aten.sort.default (node 'sort\\x1c\\n\\x00') failed: "
                              "IndexError: Dimension out of range")


def test_torch_error_of_a_glue_op_gives_one_line():
    """fuzz/findings/program-cpu-op-error-multiline.vkp (program target, the message
    check): torch's error for a list where aten.add takes a tensor runs over several
    lines (position, value, declaration); the message keeps its first, the chain the
    rest."""
    with vkdelegate.load(FINDINGS / "program-cpu-op-error-multiline.vkp") as program:
        runner = program.runner("forward")
        with pytest.raises(VkDelegateError) as info:
            runner.call_flat([np.ones((3, 9), np.float32)])
    assert str(info.value) == ("CPU op aten.add.Tensor (node getitem_2) failed: "
                               "RuntimeError: aten::add() Expected a value of type "
                               "'Tensor' for argument 'self' but instead found type 'list'.")
    assert "Declaration: aten::add.Tensor" in str(info.value.__cause__)


def test_tensor_reference_fields_are_escaped():
    """fuzz/findings/program-state-segment-control-char.vkp (program target, 2026-12-05:
    a state's tensor reference whose segment is a string holding control characters,
    echoed raw by the host budget's check)."""
    message = _message(lambda: vkdelegate.load(
        FINDINGS / "program-state-segment-control-char.vkp"))
    assert "tensor reference segment must be an int, got " in message
    from vkdelegate.backend.host_budget import tensor_ref_bytes

    for ref in ({"segment": "a\x1cb", "dtype": "float32", "shape": [1]},
                {"segment": 0, "dtype": "float32", "shape": ["\x1c\n"]}, "x\x1c\n"):
        _message(lambda: tensor_ref_bytes(ref, "state 'b'"))


def test_value_reference_errors_are_escaped():
    from vkdelegate.backend.plan_check import check_arg

    for arg in ("v\x1c\n", {"v": 1, "x": "\x1c"}):
        _message(lambda: check_arg(arg, "plan.nodes[0].args[0]", refs_only=True))
