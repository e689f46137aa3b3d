"""Our reader and ``vkdelegate inspect`` agree with ExecuTorch's own Vulkan deserializer.

Fixture blobs in tests/data/et_vk were written by ExecuTorch 1.5.1's VulkanPartitioner
and come with what ET's deserializer reported (generate.py). The same comparison also
runs live: generate.py runs in ExecuTorch's own environment (.venv-et, see
tests/program/pte_fixtures.py: skipped without it, a failure under CI) and writes fresh
blobs, reports and ET-VK's registry op names, which must all be in our registry or in
vkdelegate/ops/et_vk_registry.py's NOT_RUN list (docs/OPS.md).
"""
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.program.pte_fixtures import need_et_python
from vkdelegate.backend.reference import ReferenceGraph
from vkdelegate.ops.et_vk_registry import NOT_RUN, blob_name
from vkdelegate.ops.registry import load_all
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


@pytest.fixture(scope="module")
def live_dir(tmp_path_factory) -> Path:
    """Fresh blobs and reports from generate.py run in ExecuTorch's environment."""
    python = need_et_python()
    out = tmp_path_factory.mktemp("et_vk_live")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([python, str(DATA / "generate.py"), str(out)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_live_et_lowering_matches(live_dir, name):
    expected = json.loads((live_dir / f"{name}.json").read_text())
    expected.pop("generator")
    assert our_report((live_dir / f"{name}.bin").read_bytes()) == expected


def test_et_registry_is_run_or_listed(live_dir):
    """Every op ET-VK's partitioner may delegate is in our registry or in NOT_RUN (with
    its reason), and NOT_RUN names only ops of ET's registry."""
    et_ops = set(json.loads((live_dir / "et_ops.json").read_text()))
    assert len(et_ops) > 100
    ours = set(load_all())
    ephemeral = {"aten._assert_scalar.default",
                 "aten.sym_constrain_range_for_size.default"}
    unaccounted = sorted(op for op in et_ops - set(NOT_RUN) - ephemeral
                         if blob_name(op) not in ours)
    assert not unaccounted, f"add to vkdelegate/ops/et_vk_registry.py: {unaccounted}"
    assert not set(NOT_RUN) - et_ops, sorted(set(NOT_RUN) - et_ops)
