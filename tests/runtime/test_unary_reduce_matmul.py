"""Unary ops, aten.sum.dim_IntList and aten.mm.default on the device vs numpy."""
import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand

NUMPY_UNARY = {
    "aten.relu.default": lambda x: np.maximum(x, 0),
    "aten.neg.default": np.negative,
    "aten.abs.default": np.abs,
    "aten.sigmoid.default": lambda x: 1 / (1 + np.exp(-x)),
    "aten.tanh.default": np.tanh,
    "aten.exp.default": np.exp,
    "aten.sqrt.default": np.sqrt,
    "aten.sin.default": np.sin,
    "aten.cos.default": np.cos,
}


def _unary(device, op, x):
    m = GraphMaker()
    ix = m.input(x.shape, x.dtype.name)
    m.output(m.op(op, [ix], x.shape, x.dtype.name))
    with m.build(device) as graph:
        return graph.execute([x])[0]


@pytest.mark.parametrize("op", sorted(NUMPY_UNARY))
def test_unary_fp32(vk_device, op):
    rng = np.random.default_rng(5)
    x = (3 * rand(rng, (7, 29))).astype(np.float32)
    x[0, :4] = [0.0, -60.0, 60.0, -0.0]  # tanh/sigmoid/exp edges
    with np.errstate(all="ignore"):
        want = NUMPY_UNARY[op](x.astype(np.float64)).astype(np.float32)
    got = _unary(vk_device, op, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # NaN == NaN here


@pytest.mark.parametrize("dtype", ["float16", "int32", "int8"])
@pytest.mark.parametrize("op", ["aten.relu.default", "aten.neg.default", "aten.abs.default"])
def test_unary_other_dtypes(vk_device, op, dtype):
    rng = np.random.default_rng(6)
    x = rand(rng, (3, 5, 11), dtype)
    if dtype == "int8":
        x.flat[0] = -128  # abs/neg of -128 wrap to -128, as in ATen
    want = NUMPY_UNARY[op](x)
    np.testing.assert_array_equal(_unary(vk_device, op, x), want)


def _sum(device, x, dims, keepdim):
    want = x.astype(np.float64).sum(axis=tuple(dims) if dims else None,
                                    keepdims=keepdim).astype(x.dtype)
    m = GraphMaker()
    ix = m.input(x.shape, x.dtype.name)
    out = m.op("aten.sum.dim_IntList", [ix, m.scalar(list(dims)), m.scalar(keepdim),
                                        m.scalar(None)], want.shape, x.dtype.name)
    m.output(out)
    with m.build(device) as graph:
        return graph.execute([x])[0], want


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("shape,dims", [
    ((113,), [0]),
    ((7, 11), [1]),
    ((7, 11), [0]),
    ((3, 5, 7, 11), [0, 2]),
    ((3, 5, 7, 11), [-1, 1]),
    ((2, 3, 5, 1, 7, 3), [0, 3, 5]),
    ((5, 7), []),                     # all dims
    ((0, 3), [0]),                    # empty reduction -> zeros
])
def test_sum_dims(vk_device, shape, dims, keepdim):
    x = rand(np.random.default_rng(7), shape)
    got, want = _sum(vk_device, x, dims, keepdim)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sum_fp16_accumulates_in_fp32(vk_device):
    x = np.full((4099,), 0.1, dtype=np.float16)  # an fp16 accumulator would stall at 256
    got, want = _sum(vk_device, x, [0], False)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3)


@pytest.mark.parametrize("constant_weight", [False, True])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("float16", 1e-2)])
def test_mm(vk_device, dtype, tol, constant_weight):
    rng = np.random.default_rng(8)
    a, w = rand(rng, (37, 29), dtype), rand(rng, (29, 11), dtype)
    want = (a.astype(np.float64) @ w.astype(np.float64)).astype(dtype)
    m = GraphMaker()
    ia = m.input(a.shape, dtype)
    iw = m.constant(w) if constant_weight else m.input(w.shape, dtype)
    m.output(m.op("aten.mm.default", [ia, iw], want.shape, dtype))
    with m.build(vk_device) as graph:
        got = graph.execute([a] if constant_weight else [a, w])[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("rows_max,cols,reg", [(41, 19, "1"), (131, 67, "4")])
@pytest.mark.parametrize("constant_weight", [False, True])
def test_tiled_mm_with_resize(vk_device, monkeypatch, constant_weight, rows_max, cols, reg):
    # lavapipe is a CPU device and normally gets the simple shader: force the tiled
    # one (the GPU path) and check it on shapes that are not multiples of the tile,
    # with one and with 4 x 4 outputs per invocation.
    from vkdelegate.kernels import gemm
    # No tile-table row: the portable choice (the GEMM core has tests/ops/test_gemm_core).
    monkeypatch.setattr(gemm, "tiles_for", lambda device_type: None)
    monkeypatch.setattr(gemm, "use_tiled", lambda info, m, n, k=0: True)
    monkeypatch.setattr(gemm, "register_block", lambda m, n: int(reg))
    rng = np.random.default_rng(9)
    w = rand(rng, (37, cols))
    m = GraphMaker()
    ia = m.input((rows_max, 37))
    iw = m.constant(w) if constant_weight else m.input(w.shape)
    m.output(m.op("aten.mm.default", [ia, iw], (rows_max, cols)))
    with m.build(vk_device) as graph:
        pipeline = graph.dispatches[0].pipeline
        assert pipeline.name == "matmul_tiled" and dict(pipeline.defines)["REG"] == reg
        for rows in (rows_max, 17, 1):
            a = rand(rng, (rows, 37))
            got = graph.execute([a] if constant_weight else [a, w])[0]
            np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
        assert graph.recordings == 1


@pytest.fixture
def force_cooperative_sum(monkeypatch):
    # lavapipe is a CPU device and keeps one invocation per output for sums up to
    # rows.THREAD_MAX: force the cooperative form (the GPU path) to test it here.
    from vkdelegate.kernels import rows
    monkeypatch.setattr(rows, "cooperative", lambda info, reduced: True)


@pytest.mark.parametrize("shape,dims,keepdim", [
    ((3, 1031), [1], False),
    ((517, 2, 3), [0, 2], True),
    ((5, 0, 300), [0, 2], False),     # empty reduction -> zeros
    ((100003,), [], False),           # everything to one value
    ((7, 5), [0], False),             # fewer elements than invocations
])
def test_sum_cooperative(vk_device, force_cooperative_sum, shape, dims, keepdim):
    x = rand(np.random.default_rng(30), shape)
    got, want = _sum(vk_device, x, dims, keepdim)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_sum_cooperative_resize(vk_device, force_cooperative_sum):
    m = GraphMaker()
    ix = m.input((7, 1031))
    m.output(m.op("aten.sum.dim_IntList", [ix, m.scalar([1]), m.scalar(False),
                                           m.scalar(None)], (7,)))
    rng = np.random.default_rng(31)
    with m.build(vk_device) as graph:
        assert "WG_REDUCE" in dict(graph.dispatches[0].pipeline.defines)
        for shape in ((7, 1031), (2, 5), (1, 1000), (7, 1031)):
            x = rand(rng, shape)
            np.testing.assert_allclose(graph.execute([x])[0], x.sum(axis=1, dtype=np.float64),
                                       rtol=1e-5, atol=1e-4)
        assert graph.recordings == 1


def test_sum_longer_than_llvmpipe_loop_limit(vk_device):
    # llvmpipe ends a shader loop after 65535 iterations; a sum this long must still
    # see every element (the op switches to the cooperative form past THREAD_MAX).
    from vkdelegate.kernels.rows import THREAD_MAX
    n = THREAD_MAX + 4099
    got, want = _sum(vk_device, np.ones((1, n), np.float32), [1], False)
    assert got.tolist() == [float(n)]
    x = rand(np.random.default_rng(32), (1, n))
    got, want = _sum(vk_device, x, [1], False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("table", [True, False], ids=["tile_table", "portable"])
def test_mm_longer_k_than_llvmpipe_loop_limit(vk_device, monkeypatch, table):
    # K past 65535 iterations would be cut short by llvmpipe in the simple shader:
    # the op takes a form looping K / 16 times there: the GEMM core (llvmpipe's row of
    # the tile table), or the tiled shader where the table has no row.
    from vkdelegate.kernels import gemm
    if not table:
        monkeypatch.setattr(gemm, "tiles_for", lambda device_type: None)
    k = 65535 + 37
    rng = np.random.default_rng(33)
    a, w = rand(rng, (2, k)), rand(rng, (k, 3))
    m = GraphMaker()
    ia, iw = m.input(a.shape), m.input(w.shape)
    m.output(m.op("aten.mm.default", [ia, iw], (2, 3)))
    with m.build(vk_device) as graph:
        assert graph.dispatches[0].pipeline.name == ("gemm" if table else "matmul_tiled")
        got = graph.execute([a, w])[0]
    np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)
