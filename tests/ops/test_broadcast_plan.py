"""The broadcast plan of binary_op/ternary_op (vkdelegate/kernels/broadcast.py)
against numpy's broadcasting: offsets, merged rank, padding, errors. Torch-free."""
import itertools

import numpy as np
import pytest

from vkdelegate.kernels.broadcast import MAX_PLAN_DIMS, broadcast_plan, \
    plan_record
from vkdelegate.errors import VkDelegateError


def _offsets(plan, ndim):
    """Offsets per operand for every output index, computed as broadcast_plan.h does
    from the padded record (so the record's layout is checked too)."""
    rec = np.frombuffer(plan_record(plan, ndim), dtype=np.int32).reshape(-1, 4)
    sizes = rec[0:2].ravel()
    strides = [rec[2 + 2 * k:4 + 2 * k].ravel() for k in range(3)]
    numel = int(rec[8, 0])
    out = np.zeros((3, numel), dtype=np.int64)
    for i in range(numel):
        rem = i
        for d in range(ndim):
            if d == ndim - 1:
                c = rem
            else:
                c, rem = rem % sizes[d], rem // sizes[d]
            for k in range(3):
                out[k, i] += c * strides[k][d]
    return out


def _expected(out_shape, shape):
    """numpy's answer: which element of a contiguous operand each output reads."""
    return np.broadcast_to(np.arange(int(np.prod(shape))).reshape(shape),
                           out_shape).ravel()


SHAPES = [
    ((3, 5, 7), [(3, 5, 7), (3, 5, 7)]),           # same shape: flat
    ((1, 5, 11, 3), [(1, 5, 11, 3), (5, 1, 1)]),    # per-channel bias
    ((3, 5, 7), [(3, 5, 7), ()]),                   # scalar operand
    ((7, 5, 3), [(7, 1, 3), (5, 1), (7, 5, 3)]),    # ternary, broadcast middle / last
    ((2, 3, 5, 7, 1, 3), [(2, 1, 5, 1, 1, 3), (3, 1, 7, 1, 1)]),  # rank 6, alternating
    ((5, 1, 3), [(5, 1, 3), (1, 1, 3)]),            # size-1 output dim
    ((1, 1), [(1, 1), (1,)]),                       # one element
    ((), [(), ()]),                                 # 0-d
    ((0, 3), [(0, 3), (1, 3)]),                     # empty
]


@pytest.mark.parametrize("out_shape, shapes", SHAPES, ids=str)
def test_offsets_match_numpy(out_shape, shapes):
    plan = broadcast_plan(out_shape, shapes)
    assert plan.numel == int(np.prod(out_shape))
    for ndim in range(plan.ndim, MAX_PLAN_DIMS + 1):  # padding with size-1 dims is exact
        got = _offsets(plan, ndim)
        for k, shape in enumerate(shapes):
            np.testing.assert_array_equal(got[k], _expected(out_shape, shape))


@pytest.mark.parametrize("out_shape, shapes, ndim", [
    ((3, 5, 7), [(3, 5, 7), (3, 5, 7)], 1),
    ((3, 5, 7), [(3, 5, 7), (1,)], 1),
    ((1, 96, 112, 112), [(1, 96, 112, 112), (1, 96, 1, 1)], 2),
    ((1, 96, 112, 112), [(1, 96, 112, 112), (1, 96, 112, 112), (96, 1, 1)], 2),
    ((4, 96, 7, 7), [(4, 96, 7, 7), (4, 96, 1, 1)], 2),
    ((4, 96, 7, 7), [(4, 96, 7, 7), (1, 96, 1, 1)], 3),
    ((2, 3, 5, 7, 1, 3), [(2, 1, 5, 1, 1, 3), (3, 1, 7, 1, 1)], 5),
    ((5, 1, 1, 3), [(5, 1, 1, 3), (5, 1, 1, 1)], 2),
    ((), [(), ()], 1),
])
def test_merged_rank(out_shape, shapes, ndim):
    assert broadcast_plan(out_shape, shapes).ndim == ndim


def test_random_shapes_match_numpy():
    rng = np.random.default_rng(0)
    for _ in range(60):
        rank = int(rng.integers(0, 6))
        out_shape = tuple(int(s) for s in rng.choice([1, 2, 3, 5], size=rank))
        shapes = []
        for _k in range(3):
            keep = int(rng.integers(0, rank + 1))
            shape = tuple(s if rng.random() < 0.6 else 1 for s in out_shape[rank - keep:])
            shapes.append(shape)
        plan = broadcast_plan(out_shape, shapes)
        got = _offsets(plan, plan.ndim)
        for k, shape in enumerate(shapes):
            np.testing.assert_array_equal(got[k], _expected(out_shape, shape),
                                          err_msg=f"{out_shape} {shapes}")


def test_resize_never_needs_more_dims():
    """Shrinking sizes as torch.export programs do (an operand dim follows the output's
    or stays 1) keeps the plan within the rank the node was built for."""
    built = (6, 5, 4)
    ndim = broadcast_plan(built, [built, (5, 1)]).ndim
    for n, m, k in itertools.product((1, 2, 6), (1, 5), (1, 3, 4)):
        plan = broadcast_plan((n, m, k), [(n, m, k), (m, 1)])
        assert plan.ndim <= ndim
        got = _offsets(plan, ndim)
        np.testing.assert_array_equal(got[1], _expected((n, m, k), (m, 1)))


def test_errors():
    with pytest.raises(VkDelegateError, match="do not broadcast"):
        broadcast_plan((3, 5), [(3, 4)])
    with pytest.raises(VkDelegateError, match="more dims"):
        broadcast_plan((5,), [(2, 5)])
    # An operand shrinking where the output does not needs a dim more than built for.
    wide = broadcast_plan((4, 5), [(4, 5), (4, 5)])
    assert wide.ndim == 1
    with pytest.raises(VkDelegateError, match="built for 1"):
        plan_record(broadcast_plan((4, 5), [(4, 5), (1, 5)]), wide.ndim)
