"""``vkdelegate inspect``: text and JSON output, and exit status 2 with one error line."""
import json
import subprocess
import sys

import pytest

from vkdelegate.cli import main
from vkdelegate.serialization.blob import write_blob

from .graphs import every_kind_graph

CONSTANTS = bytes(range(256)) * 2


@pytest.fixture
def blob_path(tmp_path):
    path = tmp_path / "g.vkblob"
    path.write_bytes(write_blob(every_kind_graph(), CONSTANTS))
    return path


def test_text_output(blob_path, capsys):
    assert main(["inspect", str(blob_path)]) == 0
    out = capsys.readouterr().out
    size = blob_path.stat().st_size
    fb_size = int.from_bytes(blob_path.read_bytes()[14:18], "little")
    assert f"delegate blob, {size} bytes" in out
    assert f"flatbuffer 32 {fb_size}" in {" ".join(line.split()) for line in out.splitlines()}
    assert "15 values, 2 ops, inputs [4, 10], outputs [11, 11, 8]" in out
    # Rows compared with runs of spaces collapsed: tabulate's column widths may vary.
    lines = {" ".join(line.split()) for line in out.splitlines()}
    assert "4 VkTensor float32 [2, 3, 5] 0 -1" in lines
    assert "11 VkTensor int64 [7] -1 3 TEXTURE_3D/PACKED_INT8_CONV2D" in lines
    assert "5 IntList [1, -2, 9223372036854775807]" in lines
    assert "6 DoubleList [0.5, inf, -0.0]" in lines
    assert ("0 aten.add.Tensor %4:float32[2,3,5] c0, %4:float32[2,3,5] c0, "
            "-9223372036854775808 -> %11:int64[7]") in lines
    assert ("5 aten.split_with_sizes.default %11:int64[7], [1, -2, 9223372036854775807], 0 "
            "-> [%4:float32[2,3,5] c0, %11:int64[7]]") in lines
    assert "Constants: 2 (122 bytes); inline 1 (120 bytes), named 1 (2 bytes)" in out


def test_json_output(blob_path, capsys):
    assert main(["inspect", "--json", str(blob_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    graph = every_kind_graph()
    assert doc["header"]["flatbuffer_offset"] == 32
    assert doc["header"]["constants_size"] == len(CONSTANTS)
    assert doc["graph"]["value_count"] == len(graph.values)
    assert [v["kind"] for v in doc["values"]] == [type(v).__name__ for v in graph.values]
    assert doc["values"][6]["items"] == [0.5, "inf", -0.0]   # JSON has no inf
    assert doc["values"][11]["mem_obj_id"] == 3
    assert doc["values"][11]["memory_layout"] == "PACKED_INT8_CONV2D"
    assert [op["args"] for op in doc["chain"]] == [op.args for op in graph.chain]
    assert doc["constants"]["inline"] == {"count": 1, "bytes": 120}
    assert doc["constants"]["named"] == {"count": 1, "bytes": 2}
    assert doc["constants"]["items"][1]["named_key"] == "k" * 64


@pytest.mark.parametrize("content, message", [
    (None, "cannot read {path}: No such file or directory"),
    (b"\0\0\0\0VH00", "delegate blob is 8 bytes, shorter than its 30-byte VH00 header"),
    (b"PK\3\4" + bytes(60), "{path}: not a delegate blob, program file or .pte (bytes 4..8 "
                            "are b'\\x00\\x00\\x00\\x00', a blob's b'VH00'; bytes 0..8 "
                            "b'PK\\x03\\x04\\x00\\x00\\x00\\x00', a program file's "
                            "b'VKDPROG1')"),
])
def test_errors_are_one_line_and_status_2(tmp_path, capsys, content, message):
    path = tmp_path / "bad.bin"
    if content is not None:
        path.write_bytes(content)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"vkdelegate inspect: error: {message.format(path=path)}\n"


def test_truncated_blob_names_the_region(blob_path, capsys):
    blob_path.write_bytes(blob_path.read_bytes()[:200])
    assert main(["inspect", str(blob_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vkdelegate inspect: error: VH00 header: flatbuffer region [32, ")
    assert err.count("\n") == 1


def test_subprocess_exit_codes(blob_path, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "vkdelegate", "inspect", str(blob_path)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "Op chain" in ok.stdout
    bad = tmp_path / "bad.bin"
    bad.write_bytes(blob_path.read_bytes()[:40])
    res = subprocess.run([sys.executable, "-m", "vkdelegate", "inspect", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.startswith("vkdelegate inspect: error: ") and res.stderr.count("\n") == 1
    assert "Traceback" not in res.stderr


def test_program_file_lists_its_blobs(blob_path, tmp_path, capsys):
    from vkdelegate.serialization import program_file

    path = tmp_path / "p.vkprog"
    manifest = {"methods": {"forward": {"delegates": [{"blob": 1, "named_data": {}}]}}}
    program_file.write_program(path, manifest, [b"not a blob" * 4, blob_path.read_bytes()])
    assert main(["inspect", "--json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [b["label"] for b in doc["blobs"]] == [f"{path} method 'forward' delegate 0"]
    assert doc["blobs"][-1]["graph"]["value_count"] == len(every_kind_graph().values)


def test_value_id_out_of_range_is_one_line(tmp_path, capsys):
    from vkdelegate.serialization import vkgraph as vk

    path = tmp_path / "ids.bin"
    path.write_bytes(write_blob(vk.VkGraph(values=[vk.Null()], output_ids=[0, 3])))
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err == ("vkdelegate inspect: error: output_ids[1] refers to "
                                       "value id 3, but the graph has 1 values (ids 0..0)\n")


@pytest.mark.parametrize("content,text", [
    (b"", "is empty (0 bytes), not a delegate blob or program file"),
    (b"\0\0\0\0VH", "is 6 bytes, too short for a header (a delegate blob's VH00 header "
                    "is 30 bytes)"),
])
def test_empty_and_short_files(tmp_path, capsys, content, text):
    path = tmp_path / "f.bin"
    path.write_bytes(content)
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err == f"vkdelegate inspect: error: {path} {text}\n"
