"""Delegate blob round trip: every value kind, the header byte for byte, the layout,
and constant lookup."""
import struct

import pytest

from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob, write_blob
from vkdelegate.serialization.header import BlobHeader

from .graphs import every_kind_graph

CONSTANTS = bytes(range(256)) * 2  # 512 bytes; constant 0 is [0, 120), shader [128, 132)


def test_every_value_kind_round_trips():
    graph = every_kind_graph()
    blob = read_blob(write_blob(graph, CONSTANTS))
    assert blob.graph == graph
    # Kinds survive exactly: Bool stays Bool, Int stays Int (no True == 1 confusion).
    assert [type(v) for v in blob.graph.values] == [type(v) for v in graph.values]
    assert blob.graph.values[3].bool_val is True
    assert blob.graph.values[13].bool_val is False
    assert bytes(blob.constants_section) == CONSTANTS


def test_rewrite_is_byte_identical():
    data = write_blob(every_kind_graph(), CONSTANTS)
    assert write_blob(read_blob(data).graph, CONSTANTS) == data


def test_header_bytes_match_the_layout_table():
    graph = every_kind_graph()
    data = write_blob(graph, CONSTANTS)
    fb_size = struct.unpack_from("<I", data, 14)[0]
    constants_offset = (32 + fb_size + 15) // 16 * 16
    expected = (b"\x00\x00\x00\x00" + b"VH00" + (30).to_bytes(2, "little")
                + (32).to_bytes(4, "little") + fb_size.to_bytes(4, "little")
                + constants_offset.to_bytes(4, "little")
                + len(CONSTANTS).to_bytes(8, "little"))
    assert len(expected) == 30
    assert data[:30] == expected
    assert data[30:32] == b"\0\0"                       # header padded to 32
    assert data[32 + 4:32 + 8] == b"VK00"               # flatbuffer file identifier
    assert data[32 + fb_size:constants_offset] == bytes(constants_offset - 32 - fb_size)
    assert data[constants_offset:] == CONSTANTS
    assert len(data) == constants_offset + len(CONSTANTS)
    assert BlobHeader.from_bytes(data) == BlobHeader(32, fb_size, constants_offset, len(CONSTANTS))


def test_constant_bytes_inline_and_named():
    blob = read_blob(write_blob(every_kind_graph(), CONSTANTS))
    assert bytes(blob.constant_bytes(0)) == CONSTANTS[:120]
    assert blob.constant_bytes(1, {"k" * 64: b"ab"}) == b"ab"


@pytest.mark.parametrize("call, message", [
    (lambda b: b.constant_bytes(2), "constant id 2 out of range: the graph has 2 constants"),
    (lambda b: b.constant_bytes(-1), "constant id -1 out of range"),
    (lambda b: b.constant_bytes(1), "constant 1: named data 'kkkk"),
    (lambda b: b.constant_bytes(1, {"k" * 64: b"abc"}), "has 3 bytes, the graph expects 2"),
])
def test_constant_bytes_errors_name_the_constant(call, message):
    blob = read_blob(write_blob(every_kind_graph(), CONSTANTS))
    with pytest.raises(VkDelegateError, match=message.replace("(", r"\(")):
        call(blob)


def test_inline_constant_outside_section_is_rejected():
    graph = every_kind_graph()
    with pytest.raises(VkDelegateError, match=r"constant 0: bytes \[0, 120\) lie outside "
                                              r"the 100-byte constants section"):
        write_blob(graph, CONSTANTS[:100])
    # The same check on read: shrink the recorded constants size in a valid blob.
    data = bytearray(write_blob(graph, CONSTANTS))
    data[22:30] = (100).to_bytes(8, "little")
    with pytest.raises(VkDelegateError, match="constant 0: bytes"):
        read_blob(bytes(data))


@pytest.mark.parametrize("value, message", [
    (vk.VkTensor(vk.VkDataType.FLOAT32, [1 << 32]), "value 0 .VkTensor. dims: 4294967296 does not fit in uint32"),
    (vk.Int(1 << 63), "value 0 .Int.: 9223372036854775808 does not fit in int64"),
    (vk.ValueList([1.5]), "expected an integer, got 1.5"),
    ("not a value", "value 0: str is not a GraphTypes member"),
])
def test_writer_rejects_values_that_do_not_fit(value, message):
    with pytest.raises(VkDelegateError, match=message):
        write_blob(vk.VkGraph(values=[value]))


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[:20], "delegate blob is 20 bytes, shorter than its 30-byte VH00 header"),
    (lambda d: d[:4] + b"VH01" + d[8:], r"magic at byte 4 is b'VH01', expected b'VH00'"),
    (lambda d: d[:8] + b"\x20\x00" + d[10:], "header length at byte 8 is 32, expected 30"),
    (lambda d: d[:14] + (1 << 20).to_bytes(4, "little") + d[18:], "flatbuffer region"),
    (lambda d: d[:22] + (1 << 40).to_bytes(8, "little") + d[30:], "constants region"),
    (lambda d: d[:36] + b"XX00" + d[40:], r"file identifier is b'XX00', expected b'VK00' \(at byte 36\)"),
])
def test_reader_names_the_problem(mutate, message):
    data = write_blob(every_kind_graph(), CONSTANTS)
    with pytest.raises(VkDelegateError, match=message):
        read_blob(mutate(data))


@pytest.mark.parametrize("graph, message", [
    (vk.VkGraph(values=[vk.Null()], input_ids=[1]), "input_ids.0. refers to value id 1, but the graph has 1 values"),
    (vk.VkGraph(values=[vk.Null()], output_ids=[0, 5]), "output_ids.1. refers to value id 5"),
    (vk.VkGraph(values=[vk.Null()], chain=[vk.OperatorCall(3, "aten.relu.default", [0, 9])]),
     r"node 3 \(aten.relu.default, chain\[0\]\) arg 1 refers to value id 9"),
    (vk.VkGraph(values=[vk.ValueList([0, 2])]), r"value 0 \(ValueList\) item 1 refers to value id 2"),
    (vk.VkGraph(values=[vk.Null()], chain=[vk.OperatorCall(2, "aten.relu.default", [])]),
     r"node 2 \(aten.relu.default, chain\[0\]\) has no args; its output value id must be the last arg"),
    (vk.VkGraph(values=[vk.Null()], chain=[vk.OperatorCall(4, "", [0])]),
     r"chain\[0\] \(node 4\) has no operator name"),
    (vk.VkGraph(values=[vk.VkTensor(vk.VkDataType.BOOL, [1], constant_id=0)]),
     "value 0 .VkTensor. has constant_id 0, but the graph has 0 constants"),
])
def test_ids_out_of_range_are_rejected_on_read(graph, message):
    data = write_blob(graph)  # the writer does not police ids: a reader must
    with pytest.raises(VkDelegateError, match=message):
        read_blob(data)
