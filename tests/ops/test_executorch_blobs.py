"""Blobs written by ExecuTorch 1.5.1's VulkanPartitioner (tests/data/et_vk, made by its
generate.py with seeded weights) run on our runtime and match eager PyTorch: ET's value
layout, named constants and its own op names (et_vk.prepack, *_copy ops) included."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from vkdelegate.runtime import DelegateGraph
from vkdelegate.serialization.blob import read_blob

DATA = Path(__file__).resolve().parents[1] / "data" / "et_vk"


def _generator():
    spec = importlib.util.spec_from_file_location("et_vk_generate", DATA / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


@pytest.mark.parametrize("name", ["conv_split_cat", "linear_relu_add",
                                  "reduce_view_permute"])
def test_executorch_blob_runs_and_matches_eager(vk_device, name):
    gen = _generator()
    blob = read_blob((DATA / f"{name}.bin").read_bytes())
    named = {k: bytes.fromhex(v) for k, v in
             json.loads((DATA / f"{name}.named.json").read_text()).items()}
    inputs = list(gen.MODELS[name][1])
    with DelegateGraph(blob.graph, lambda i: blob.constant_bytes(i, named),
                       device=vk_device) as graph:
        got = graph.execute([t.numpy() for t in inputs])
    expected = gen.build_model(name)(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e.detach().numpy(), rtol=1e-5, atol=1e-5)
