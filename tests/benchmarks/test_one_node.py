"""The one-node benchmark graphs (benchmarks/one_node.py and the per-family scripts):
every case has its op's schema arity, the bytes it counts are the tensors' bytes, and
small cases run on the device with the values numpy computes, so the scripts time the
op they name."""
import contextlib
import io
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cnn_ops  # noqa: E402
import elementwise_ops  # noqa: E402
import movement_ops  # noqa: E402
from one_node import OneNode, main, measure  # noqa: E402

from vkdelegate.backend.reference import resolve  # noqa: E402
from vkdelegate.runtime import DelegateGraph  # noqa: E402
from vkdelegate.serialization import vkgraph as g  # noqa: E402

SCRIPTS = {"cnn_ops": cnn_ops, "elementwise_ops": elementwise_ops,
           "movement_ops": movement_ops}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_cases_match_their_op_schemas(script):
    names = []
    for make in SCRIPTS[script].CASES:
        node = make()
        names.append(node.name)
        (call,) = node.built.chain
        schema = resolve(call.name)._schema.arguments
        assert len(call.args) == len(schema) + 1, node.name  # the output id last
        assert node.moved > 0 or node.flops, node.name
    assert len(set(names)) == len(names)


def test_moved_counts_inputs_and_all_outputs_not_constants():
    node = OneNode("x").input((3, 5, 7)).input((1, 5, 1), "int64", high=4)
    node.constant((11,)).arg(1)
    node.graph("aten.add.Tensor", [((3, 5, 7), "float32"), ((3, 5, 7), "bool")],
               graph_outputs=1)
    assert node.moved == 4 * 105 + 8 * 5 + 4 * 105 + 1 * 105
    # ids: inputs 0, 1, constant 2, alpha 3, outputs 4, 5 in ValueList 6 (the last arg)
    assert node.built.input_ids == [0, 1] and node.built.output_ids == [4]
    assert node.built.chain[0].args[-1] == 6
    assert node.built.values[6] == g.ValueList([4, 5])
    assert node.arrays[1].dtype == np.int64 and node.arrays[1].max() < 4
    assert [type(node.built.values[i]).__name__ for i in node.args] == \
        ["VkTensor", "VkTensor", "VkTensor", "Int"]
    assert node.built.values[node.args[2]].constant_id == 0
    assert node.constant_bytes(0) == node.consts[0] and len(node.consts[0]) == 44


def test_scalar_kinds():
    node = OneNode().arg(None).arg(True).arg(3).arg(0.5).arg("tanh").arg([1, 2])
    node.arg([2.0, 2.0])
    kinds = [type(v) for v in node.values]
    assert kinds == [g.Null, g.Bool, g.Int, g.Double, g.String, g.IntList, g.DoubleList]


def _case(module, name):
    return next(n for n in (make() for make in module.CASES) if n.name == name)


def _run(node, device):
    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        return dg.execute(node.arrays)


def test_softmax_case_computes_softmax(vk_device):
    node = _case(elementwise_ops, "softmax 1x1000 (logits)")
    x = node.arrays[0].astype(np.float64)
    want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    np.testing.assert_allclose(_run(node, vk_device)[0], want, rtol=1e-4, atol=1e-6)


def test_gather_case_computes_gather(vk_device):
    node = _case(movement_ops, "gather dim 1 of 64x1000, 64x5")
    x, index = node.arrays
    np.testing.assert_array_equal(_run(node, vk_device)[0],
                                  np.take_along_axis(x, index, axis=1))
    assert node.moved == 4 * (64 * 5 + 64 * 5) + 8 * 64 * 5  # read, written, index


def test_linear_case_computes_linear(vk_device):
    node = _case(cnn_ops, "linear 1x1280 -> 1000")
    w = np.frombuffer(node.consts[0], np.float32).reshape(1000, 1280)
    b = np.frombuffer(node.consts[1], np.float32)
    want = node.arrays[0].astype(np.float64) @ w.T + b
    np.testing.assert_allclose(_run(node, vk_device)[0], want, rtol=1e-4, atol=1e-4)
    assert node.flops == 2 * 1280 * 1000


def test_main_prints_one_row_per_selected_case(vk_device):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(elementwise_ops.CASES, "test", ["--runs", "1", "--filter",
                                                    "softmax 1x1000"]) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("device: ")
    rows = [line for line in lines if line.startswith("softmax")]
    assert len(rows) == 1 and rows[0].endswith(tuple("0123456789"))
    ms, cpu_ms = measure(_case(elementwise_ops, "softmax 1x1000 (logits)"), vk_device, 2)
    assert ms > 0 and cpu_ms >= 0 and math.isfinite(ms)
    with pytest.raises(SystemExit):
        main(elementwise_ops.CASES, "test", ["--runs", "0"])
