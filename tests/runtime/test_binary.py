"""aten.add.Tensor / aten.sub.Tensor on the device vs numpy (broadcasting, alpha, dtypes)."""
import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand

TOL = {"float32": 1e-5, "float16": 2e-3}


def _expected(op, a, b, alpha, dtype):
    sign = 1 if op == "aten.add.Tensor" else -1
    if dtype in TOL:
        return (a.astype(np.float64) + sign * alpha * np.asarray(b, np.float64)).astype(dtype)
    wide = a.astype(np.int64) + sign * int(alpha) * np.asarray(b).astype(np.int64)
    return wide.astype(dtype)  # ATen integer arithmetic wraps


def _run(device, op, a, b, alpha, dtype, out_shape=None):
    m = GraphMaker()
    ia = m.input(a.shape, dtype)
    ib = m.input(b.shape, dtype)
    out_shape = np.broadcast_shapes(a.shape, b.shape) if out_shape is None else out_shape
    out = m.op(op, [ia, ib, m.scalar(alpha)], out_shape, dtype)
    m.output(out)
    with m.build(device) as graph:
        return graph.execute([a, b])[0]


def _check(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    if dtype in TOL:
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shapes", [
    ((113,), (113,)),
    ((5, 7), (7,)),                    # broadcast on the leading axis
    ((5, 7), (5, 1)),                  # on the last axis
    ((3, 1, 11), (1, 7, 1)),           # on both sides
    ((2, 3, 1, 5, 1, 7), (3, 5, 1, 1)),  # rank 6 vs rank 4
    ((1,), (3, 29)),
    ((0, 5), (5,)),                    # empty
    ((), (3,)),                        # 0-d
])
@pytest.mark.parametrize("op", ["aten.add.Tensor", "aten.sub.Tensor"])
def test_broadcasting_fp32(vk_device, op, shapes):
    rng = np.random.default_rng(1)
    a, b = rand(rng, shapes[0]), rand(rng, shapes[1])
    _check(_run(vk_device, op, a, b, 1.0, "float32"), _expected(op, a, b, 1.0, "float32"),
           "float32")


@pytest.mark.parametrize("dtype,alpha", [("float32", 2.5), ("float16", -0.5),
                                         ("int32", 3), ("int8", 7), ("uint8", 2)])
@pytest.mark.parametrize("op", ["aten.add.Tensor", "aten.sub.Tensor"])
def test_dtypes_and_alpha(vk_device, op, dtype, alpha):
    rng = np.random.default_rng(2)
    a, b = rand(rng, (7, 37), dtype), rand(rng, (37,), dtype)
    _check(_run(vk_device, op, a, b, alpha, dtype), _expected(op, a, b, alpha, dtype), dtype)


def test_scalar_other_is_a_constant(vk_device):
    # x + 3 exports as add.Tensor(x, 3): the scalar becomes a 0-d constant tensor.
    rng = np.random.default_rng(3)
    x = rand(rng, (11, 3))
    m = GraphMaker()
    ix = m.input(x.shape)
    out = m.op("aten.add.Tensor", [ix, m.scalar(3.0), m.scalar(2.0)], x.shape)
    m.output(out)
    with m.build(vk_device) as graph:
        np.testing.assert_allclose(graph.execute([x])[0], x + 6.0, rtol=1e-6)


def test_constant_operand(vk_device):
    rng = np.random.default_rng(4)
    x, w = rand(rng, (5, 13)), rand(rng, (13,))
    m = GraphMaker()
    ix = m.input(x.shape)
    out = m.op("aten.sub.Tensor", [ix, m.constant(w), m.scalar(1)], x.shape)
    m.output(out)
    for staging in (False, True):
        with m.build(vk_device, staging=staging) as graph:
            np.testing.assert_allclose(graph.execute([x])[0], x - w, rtol=1e-6)
