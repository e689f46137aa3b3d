"""Structural mutations of the VALUES of real lowered blobs: ``load_delegate`` and one
``execute`` either work or raise VkDelegateError, within a few seconds, and never
allocate past the load limits.

Seeds: the three ExecuTorch-written blobs in tests/data/et_vk and a small CNN lowered by
our builder (conv, relu, max and average pooling, view, permute, addmm, softmax). Each
mutation decodes the blob, changes one to three values (a tensor swapped for an Int,
dims changed, huge ints in IntLists and Ints, a ValueList pointing at itself or at
another list, a dtype changed, two values swapped) and writes it back. Seeded, so a
failure reproduces; the examples are few and small to bound the run time.
"""
import json
import random
import time
from pathlib import Path

import numpy as np
import pytest

from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits
from vkdelegate.runtime import load_delegate
from vkdelegate.serialization import vkgraph as g
from vkdelegate.serialization.blob import read_blob, write_blob

DATA = Path(__file__).resolve().parents[1] / "data" / "et_vk"
#: Small enough that a mutated dim cannot make a load allocate much.
LIMITS = LoadLimits(max_device_bytes=64 << 20, max_tensor_bytes=16 << 20)
HUGE = [0, -1, 65537, (1 << 28), (1 << 31) - 1, 1 << 31, 1 << 40, -(1 << 63),
        (1 << 63) - 1]
DIMS = [0, 1, 2, 3, 65537, 1 << 28, 0xFFFFFFFF]


def _et_seeds():
    for path in sorted(DATA.glob("*.bin")):
        named = {k: bytes.fromhex(v) for k, v in
                 json.loads(path.with_suffix(".named.json").read_text()).items()}
        yield path.stem, path.read_bytes(), named


def _cnn_seed():
    torch = pytest.importorskip("torch")
    from tests.serialization.export_helpers import build

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8 * 2 * 2, 5)

        def forward(self, x):
            y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
            y = torch.nn.functional.avg_pool2d(y, 2)
            return torch.softmax(self.fc(y.flatten(1)), -1)

    torch.manual_seed(0)
    part = build(Net().eval(), (torch.randn(1, 3, 8, 8),))
    return "cnn", part.blob, part.named_data


def _mutate(graph: g.VkGraph, rng: random.Random) -> str:
    """Change one value of ``graph`` in place; returns what was done."""
    values = graph.values
    vid = rng.randrange(len(values))
    v = values[vid]
    kind = rng.randrange(7)
    if kind == 0 and isinstance(v, g.VkTensor):
        values[vid] = g.Int(rng.choice(HUGE))
        return f"tensor {vid} -> Int"
    if kind in (0, 1) and isinstance(v, g.VkTensor) and v.dims:
        v.dims = list(v.dims)
        v.dims[rng.randrange(len(v.dims))] = rng.choice(DIMS + [d + 1 for d in v.dims])
        return f"tensor {vid} dims -> {v.dims}"
    if kind == 2 and isinstance(v, g.IntList) and v.items:
        v.items = list(v.items)
        v.items[rng.randrange(len(v.items))] = rng.choice(HUGE)
        return f"IntList {vid} -> {v.items}"
    if kind == 2 and isinstance(v, g.Int):
        values[vid] = g.Int(rng.choice(HUGE))
        return f"Int {vid} -> {values[vid].int_val}"
    if kind == 3:
        lists = [i for i, x in enumerate(values) if isinstance(x, g.ValueList)]
        target = rng.choice(lists) if lists else vid
        values[target] = g.ValueList(list(getattr(values[target], "items", [])) +
                                     [rng.choice([target] + lists)])
        return f"ValueList {target} -> {values[target].items}"
    if kind == 4 and isinstance(v, g.VkTensor):
        v.datatype = rng.choice(list(g.DTYPE_NAMES))
        return f"tensor {vid} dtype -> {v.datatype.name}"
    if kind == 5:
        other = rng.randrange(len(values))
        values[vid], values[other] = values[other], values[vid]
        return f"swap {vid} <-> {other}"
    values[vid] = rng.choice([g.Null(), g.Int(rng.choice(HUGE)), g.Double(float("inf")),
                              g.IntList([rng.choice(HUGE)]), g.Bool(True)])
    return f"value {vid} -> {values[vid]}"


def _inputs(graph: g.VkGraph) -> list:
    arrays = []
    for vid in graph.input_ids:
        t = graph.values[vid]
        arrays.append(np.ones(t.dims, g.DTYPE_NAMES[t.datatype])
                      if isinstance(t, g.VkTensor) and t.datatype in g.DTYPE_NAMES
                      else np.ones(1, np.float32))
    return arrays


def _outcome(blob: bytes, named: dict) -> str:
    """'ran', 'refused' (VkDelegateError); any other exception fails the test."""
    try:
        with load_delegate(blob, named, limits=LIMITS, timeout_s=5.0) as graph:
            graph.execute(_inputs(graph.graph))
    except VkDelegateError as exc:
        assert str(exc), "error without a message"
        return "refused"
    return "ran"


@pytest.mark.parametrize("seed", [1, 2])
def test_value_mutations_raise_only_our_error(vk_device, seed):
    seeds = list(_et_seeds()) + [_cnn_seed()]
    rng = random.Random(20260901 + seed)
    outcomes = []
    for name, blob, named in seeds:
        assert _outcome(blob, named) == "ran", name
        for _ in range(12):
            decoded = read_blob(blob)
            graph = decoded.graph
            done = [_mutate(graph, rng) for _ in range(rng.randint(1, 3))]
            try:
                mutated = write_blob(graph, bytes(decoded.constants_section))
            except VkDelegateError:
                continue  # not representable in the schema (e.g. an int past int64)
            start = time.perf_counter()
            try:
                outcomes.append(_outcome(mutated, named))
            except Exception as exc:  # noqa: BLE001 - the point of the test
                pytest.fail(f"{name} with {done}: {type(exc).__name__}: {exc}")
            assert time.perf_counter() - start < 10, f"{name} with {done} took too long"
    # Most structural mutations must be caught: an all-"ran" run would check nothing.
    assert outcomes.count("refused") > len(outcomes) // 3, outcomes
