"""schema.fbs and the Python writer/reader agree.

Three independent checks: the field slots, union order and enum values parsed from
schema.fbs match what the Python code uses; flatc compiles a JSON document with
schema.fbs and our reader decodes flatc's binary; and Python code that flatc generates
from schema.fbs reads our writer's output.
"""
import dataclasses
import enum
import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.flatbuffer_reader import graph_from_flatbuffer
from vkdelegate.serialization.flatbuffer_writer import graph_to_flatbuffer
from vkdelegate.serialization.schema_slots import TABLE_FIELDS

from .graphs import every_kind_graph

SCHEMA = Path(__file__).resolve().parents[2] / "vkdelegate" / "schema" / "schema.fbs"
needs_flatc = pytest.mark.skipif(shutil.which("flatc") is None, reason="flatc not installed")


def _schema_text() -> str:
    return re.sub(r"//[^\n]*", "", SCHEMA.read_text())


def _blocks(kind: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in
            re.finditer(kind + r"\s+(\w+)\s*(?::\s*\w+\s*)?\{([^}]*)\}", _schema_text())}


def test_header_lines():
    text = _schema_text()
    assert re.search(r'namespace\s+vkgraph\s*;', text)
    assert re.search(r'file_identifier\s+"VK00"\s*;', text)
    assert re.search(r'root_type\s+VkGraph\s*;', text)


def test_table_fields_and_slots_match_schema():
    unions = set(_blocks("union"))
    parsed = {}
    for name, body in _blocks("table").items():
        fields = []
        for fname, ftype in re.findall(r"(\w+)\s*:\s*([\w\[\]]+)", body):
            fields += [f"{fname}_type", fname] if ftype in unions else [fname]
        parsed[name] = tuple(fields)
    assert parsed == TABLE_FIELDS


def test_dataclass_fields_follow_schema_order():
    for cls in [vk.OperatorCall, vk.VkTensor, vk.VkBytes, vk.VkGraph, *vk.GRAPH_TYPES]:
        names = tuple(f.name for f in dataclasses.fields(cls))
        assert names == TABLE_FIELDS[cls.__name__], cls.__name__


def test_union_order_matches_schema():
    members = [m.strip() for m in _blocks("union")["GraphTypes"].split(",") if m.strip()]
    assert members == [cls.__name__ for cls in vk.GRAPH_TYPES]


@pytest.mark.parametrize("enum_cls", [vk.VkDataType, vk.VkStorageType, vk.VkMemoryLayout])
def test_enum_values_match_schema(enum_cls: type[enum.IntEnum]):
    body = _blocks("enum")[enum_cls.__name__]
    parsed = {n: int(v) for n, v in re.findall(r"(\w+)\s*=\s*(\d+)", body)}
    assert parsed == {m.name: m.value for m in enum_cls}


def _to_json(graph: vk.VkGraph) -> dict:
    """flatc's JSON for ``graph``, written independently of our writer."""
    def value(v):
        d = {k: (x.name if isinstance(x, enum.Enum) else x)
             for k, x in dataclasses.asdict(v).items()}
        return {"value_type": type(v).__name__, "value": d}

    def vbytes(b):
        d = {"offset": b.offset, "length": b.length}
        if b.named_key is not None:
            d["named_key"] = b.named_key
        return d

    return {
        "version": graph.version,
        "chain": [dataclasses.asdict(op) for op in graph.chain],
        "values": [value(v) for v in graph.values],
        "input_ids": graph.input_ids, "output_ids": graph.output_ids,
        "constants": [vbytes(b) for b in graph.constants],
        "shaders": [vbytes(b) for b in graph.shaders],
        "storage_type_override": graph.storage_type_override.name,
        "memory_layout_override": graph.memory_layout_override.name,
    }


def _finite_graph() -> vk.VkGraph:
    # JSON has no inf; flatc would reject it.
    graph = every_kind_graph()
    graph.values[6] = vk.DoubleList([0.5, 1e300, -0.0])
    return graph


@needs_flatc
def test_reader_decodes_flatc_binary(tmp_path):
    graph = _finite_graph()
    (tmp_path / "g.json").write_text(json.dumps(_to_json(graph)))
    subprocess.run(["flatc", "--binary", "-o", str(tmp_path), str(SCHEMA),
                    str(tmp_path / "g.json")], check=True, capture_output=True)
    assert graph_from_flatbuffer((tmp_path / "g.bin").read_bytes()) == graph


@needs_flatc
def test_flatc_generated_python_reads_our_output(tmp_path, monkeypatch):
    subprocess.run(["flatc", "--python", "-o", str(tmp_path), str(SCHEMA)],
                   check=True, capture_output=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "vkgraph" or m.startswith("vkgraph.")]:
        monkeypatch.delitem(sys.modules, name)
    gen = {n: getattr(importlib.import_module(f"vkgraph.{n}"), n)
           for n in ["VkGraph", "VkTensor", "IntList", "BoolList", "String", "Int", "Bool",
                     "Double", "ValueList", "SymInt", "DoubleList"]}
    graph = every_kind_graph()
    buf = graph_to_flatbuffer(graph)
    assert gen["VkGraph"].VkGraphBufferHasIdentifier(buf, 0)
    root = gen["VkGraph"].GetRootAs(buf, 0)
    assert root.Version().decode() == graph.version
    assert root.ValuesLength() == len(graph.values)
    assert [root.InputIds(i) for i in range(root.InputIdsLength())] == graph.input_ids
    assert [root.OutputIds(i) for i in range(root.OutputIdsLength())] == graph.output_ids
    assert root.StorageTypeOverride() == graph.storage_type_override
    assert root.MemoryLayoutOverride() == graph.memory_layout_override
    for i, op in enumerate(graph.chain):
        g = root.Chain(i)
        assert (g.NodeId(), g.Name().decode(), list(g.ArgsAsNumpy())) == (op.node_id, op.name, op.args)
    for i, c in enumerate(graph.constants):
        g = root.Constants(i)
        key = g.NamedKey()
        assert (g.Offset(), g.Length(), key.decode() if key else None) == (c.offset, c.length, c.named_key)
    for vid, v in enumerate(graph.values):
        gv = root.Values(vid)
        assert gv.ValueType() == vk.GRAPH_TYPES.index(type(v)) + 1, vid
        if isinstance(v, vk.Null):
            continue
        cls = gen[type(v).__name__]
        t = cls()
        t.Init(gv.Value().Bytes, gv.Value().Pos)
        if isinstance(v, vk.VkTensor):
            got = (t.Datatype(), [t.Dims(j) for j in range(t.DimsLength())], t.ConstantId(),
                   t.MemObjId(), t.StorageType(), t.MemoryLayout(), t.StagingDatatype())
            assert got == (v.datatype, v.dims, v.constant_id, v.mem_obj_id, v.storage_type,
                           v.memory_layout, v.staging_datatype), vid
        elif isinstance(v, (vk.IntList, vk.DoubleList, vk.BoolList, vk.ValueList)):
            assert [t.Items(j) for j in range(t.ItemsLength())] == v.items, vid
        elif isinstance(v, vk.String):
            assert t.StringVal().decode() == v.string_val
        else:
            field = dataclasses.fields(v)[0].name
            getter = "".join(p.capitalize() for p in field.split("_"))
            assert getattr(t, getter)() == getattr(v, field), vid
