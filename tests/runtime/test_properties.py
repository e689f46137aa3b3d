"""Property tests: random broadcast pairs for add/sub and random dim sets for sum,
checked against numpy on seeded random data."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.graphs import GraphMaker, rand

shapes = st.lists(st.integers(1, 5), min_size=0, max_size=6).map(tuple)


@st.composite
def broadcast_pair(draw):
    out = draw(shapes)
    def operand():
        rank = draw(st.integers(0, len(out)))
        dims = out[len(out) - rank:]
        return tuple(1 if draw(st.booleans()) else d for d in dims)
    return operand(), operand()


@settings(max_examples=30, deadline=None)
@given(pair=broadcast_pair(), alpha=st.sampled_from([1.0, -2.0, 0.5]),
       op=st.sampled_from(["aten.add.Tensor", "aten.sub.Tensor"]), seed=st.integers(0, 99))
def test_add_sub_broadcast(vk_device, pair, alpha, op, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(rng, pair[0]), rand(rng, pair[1])
    sign = 1 if op == "aten.add.Tensor" else -1
    want = (a.astype(np.float64) + sign * alpha * b).astype(np.float32)
    m = GraphMaker()
    ia, ib = m.input(a.shape), m.input(b.shape)
    m.output(m.op(op, [ia, ib, m.scalar(alpha)], want.shape))
    with m.build(vk_device) as graph:
        got = graph.execute([a, b])[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(shape=shapes.filter(len), data=st.data(), keepdim=st.booleans(),
       seed=st.integers(0, 99))
def test_sum_any_dims(vk_device, shape, data, keepdim, seed):
    dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=3,
                              unique_by=lambda d: d % len(shape)))
    x = rand(np.random.default_rng(seed), shape)
    axis = tuple(d % len(shape) for d in dims) if dims else None
    want = x.astype(np.float64).sum(axis=axis, keepdims=keepdim).astype(np.float32)
    m = GraphMaker()
    ix = m.input(shape)
    m.output(m.op("aten.sum.dim_IntList", [ix, m.scalar(dims), m.scalar(keepdim),
                                           m.scalar(None)], want.shape))
    with m.build(vk_device) as graph:
        got = graph.execute([x])[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
