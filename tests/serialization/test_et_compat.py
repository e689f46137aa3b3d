"""Our reader and ``vkdelegate inspect`` agree with ExecuTorch's own Vulkan deserializer.

Fixture blobs in tests/data/et_vk were written by ExecuTorch 1.5.1's VulkanPartitioner
and come with what ET's deserializer reported (generate.py). When ``executorch`` is
importable the same comparison also runs live on freshly lowered models.
"""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from vkdelegate.backend.reference import ReferenceGraph
from vkdelegate.cli import main
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob, write_blob


DATA = Path(__file__).resolve().parents[1] / "data" / "et_vk"
FIXTURES = sorted(p.stem for p in DATA.glob("*.bin"))


def our_report(blob: bytes) -> dict:
    g = read_blob(blob).graph
    return {"value_count": len(g.values),
            "value_kinds": [type(v).__name__ for v in g.values],
            "op_names": [op.name for op in g.chain],
            "op_args": [list(op.args) for op in g.chain],
            "input_ids": list(g.input_ids), "output_ids": list(g.output_ids),
            "constant_count": len(g.constants)}


def test_fixtures_present():
    assert len(FIXTURES) >= 3, "run tests/data/et_vk/generate.py"


@pytest.mark.parametrize("name", FIXTURES)
def test_reader_matches_et_report(name):
    expected = json.loads((DATA / f"{name}.json").read_text())
    expected.pop("generator")
    assert our_report((DATA / f"{name}.bin").read_bytes()) == expected


@pytest.mark.parametrize("name", FIXTURES)
def test_inspect_json_matches_et_report(name, capsys):
    expected = json.loads((DATA / f"{name}.json").read_text())
    assert main(["inspect", "--json", str(DATA / f"{name}.bin")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["graph"]["value_count"] == expected["value_count"]
    assert [op["name"] for op in doc["chain"]] == expected["op_names"]
    assert doc["graph"]["input_ids"] == expected["input_ids"]
    assert doc["graph"]["output_ids"] == expected["output_ids"]


@pytest.mark.parametrize("name", FIXTURES)
def test_et_blob_rewrites_to_an_equal_graph(name):
    blob = read_blob((DATA / f"{name}.bin").read_bytes())
    again = read_blob(write_blob(blob.graph, bytes(blob.constants_section)))
    assert again.graph == blob.graph
    # ET-VK sets per-tensor placement and staging dtypes: make sure those were read.
    tensors = [v for v in blob.graph.values if isinstance(v, vk.VkTensor)]
    assert any(t.storage_type != vk.VkStorageType.DEFAULT_STORAGE for t in tensors)


@pytest.mark.parametrize("name", FIXTURES)
def test_et_blob_runs_like_eager(name):
    """Executing the decoded ET blob with ATen ops gives the model's eager outputs:
    dtypes, dims, arg order, constants (named) and io ids were all read right."""
    gen = _load_generator()
    blob = read_blob((DATA / f"{name}.bin").read_bytes())
    named = {k: bytes.fromhex(v) for k, v in
             json.loads((DATA / f"{name}.named.json").read_text()).items()}
    inputs = list(gen.MODELS[name][1])
    ref = ReferenceGraph.from_graph(blob.graph, lambda i: blob.constant_bytes(i, named))
    got = [torch.from_numpy(out) for out in ref.execute([x.numpy() for x in inputs])]
    expected = gen.build_model(name)(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def _load_generator():
    spec = importlib.util.spec_from_file_location("et_vk_generate", DATA / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", FIXTURES)
def test_live_et_lowering_matches(name):
    pytest.importorskip("executorch.backends.vulkan.partitioner.vulkan_partitioner",
                        reason="executorch (1.5.1) is not installed; the fixture tests "
                               "above cover the comparison")
    gen = _load_generator()
    for blob in gen.lower(gen.build_model(name), gen.MODELS[name][1]):
        expected = gen.et_report(blob)
        assert our_report(blob) == expected
