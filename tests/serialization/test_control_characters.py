"""Strings read from an untrusted file reach error messages and ``vkdelegate inspect``
with their control characters escaped (``vkdelegate.errors.printable``), so one message
stays one line: found by the inspect fuzz target, fuzz/findings/
program-op-name-control-char.vkp (an op name holding \\x1c, which str.splitlines splits
on, echoed raw by the node-args check)."""
import json
from pathlib import Path

import pytest

from tests.runtime.graphs import GraphMaker
from vkdelegate.backend.reference import load_reference
from vkdelegate.cli import main
from vkdelegate.errors import VkDelegateError, printable
from vkdelegate.runtime import load_delegate
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob, write_blob

FINDING = (Path(__file__).resolve().parents[2] / "fuzz" / "findings"
           / "program-op-name-control-char.vkp")
F32 = vk.VkDataType.FLOAT32
BAD = "aten.relu.default\x1c\n\x00"


@pytest.mark.parametrize("char", ["\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029",
                                  "\n", "\r", "\x0b", "\x0c", "\x00", "\t", "\x1b",
                                  "\x7f"])
def test_printable_escapes_what_would_split_or_garble_a_line(char):
    text = f"op{char}name"
    assert printable(text) == repr(text)
    assert printable(text).isprintable() and len(f"x {printable(text)} y".splitlines()) == 1


@pytest.mark.parametrize("name", ["aten.add.Tensor", "sym_size.int", "args_0", "b_count",
                                  "größe", "a b", ""])
def test_printable_leaves_normal_names_alone(name):
    assert printable(name) == name


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_saved_finding_gives_one_error_line_with_the_name_escaped(capsys, extra):
    assert main(["inspect", str(FINDING), *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.endswith("\n")
    assert err[:-1].isprintable()
    assert err.startswith("vkdelegate inspect: error: node 257 "
                          "('vkdelegate.fused_eleme\\x1c\\x00\\x00\\x00VK00")
    assert "chain[0]) has no args; its output value id must be the last arg" in err


def test_node_without_args_names_the_op_escaped():
    graph = vk.VkGraph(values=[vk.VkTensor(F32, [2])],
                       chain=[vk.OperatorCall(3, "bad\x1cop", [])])
    with pytest.raises(VkDelegateError) as info:
        read_blob(write_blob(graph))
    assert str(info.value) == ("node 3 ('bad\\x1cop', chain[0]) has no args; its output "
                               "value id must be the last arg")


def _relu_blob(name: str) -> bytes:
    m = GraphMaker()
    x = m.input((3, 4))
    m.output(m.op(name, [x], (3, 4)))
    return m.blob()


def test_unknown_op_name_is_escaped_at_load(vk_device):
    with pytest.raises(VkDelegateError) as info:
        load_delegate(_relu_blob(BAD))
    assert str(info.value) == ("operator 'aten.relu.default\\x1c\\n\\x00' is not "
                               "supported by the vkdelegate runtime")
    with pytest.raises(VkDelegateError) as info:
        load_reference(_relu_blob(BAD))
    message = str(info.value)
    assert message.isprintable() and "calls 'aten.relu.default\\x1c\\n\\x00', which" in message


def test_unknown_normal_op_name_reads_as_before(vk_device):
    with pytest.raises(VkDelegateError, match=r"^operator aten\.nope\.default is not "
                                              r"supported by the vkdelegate runtime$"):
        load_delegate(_relu_blob("aten.nope.default"))


def test_inspect_table_escapes_the_blob_strings(tmp_path, capsys):
    graph = vk.VkGraph(
        values=[vk.VkTensor(F32, [4]), vk.String("tan\x1ch\n"),
                vk.VkTensor(F32, [4], constant_id=0), vk.VkTensor(F32, [4])],
        chain=[vk.OperatorCall(0, BAD, [0, 1, 2, 3])], input_ids=[0], output_ids=[3],
        constants=[vk.VkBytes(vk.NAMED_OFFSET, 16, "w\x1ckey\x00")])
    path = tmp_path / "strings.bin"
    path.write_bytes(write_blob(graph))
    assert main(["inspect", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and all(line.isprintable() for line in out.split("\n"))
    for text in (BAD, "tan\x1ch\n", "w\x1ckey\x00"):
        assert repr(text) in out
    assert main(["inspect", str(path), "--json"]) == 0
    out, _ = capsys.readouterr()
    doc = json.loads(out)  # JSON escapes them itself and keeps the file's strings
    assert doc["chain"][0]["name"] == BAD
    assert doc["values"][1]["value"] == "tan\x1ch\n"
    assert doc["constants"]["items"][0]["named_key"] == "w\x1ckey\x00"
