"""Binary and ternary ops through each broadcast-plan path on Vulkan, against eager:
the flat path (no operand broadcasts: plan rank 1, no division) and the general path
(plan rank > 1), broadcasting on each axis, and resizes that cross between them."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op
from vkdelegate.runtime.builder import NodeBuilder

RANK4 = (3, 5, 7, 11)


@pytest.fixture
def plan_ranks(monkeypatch):
    """The NDIM specialization constant (id 3) of every binary_op/ternary_op dispatch
    built during the test, in build order."""
    ranks = []
    original = NodeBuilder.dispatch

    def spy(self, shader, defines, *args, spec_constants=(), **kw):
        if shader in ("binary_op", "ternary_op"):
            ranks.append(spec_constants[0])
        return original(self, shader, defines, *args, spec_constants=spec_constants, **kw)

    monkeypatch.setattr(NodeBuilder, "dispatch", spy)
    return ranks


def test_flat_path_same_shapes_and_scalar(plan_ranks):
    torch.manual_seed(0)
    a, b = torch.randn(RANK4), torch.randn(RANK4)
    check_op(lambda x, y: (x + y, x * 3.0, torch.where(x > y, x, y)), (a, b),
             ops=["aten.add.Tensor", "aten.mul.Tensor", "aten.gt.Tensor",
                  "aten.where.self"])
    assert plan_ranks == [1, 1, 1, 1]


@pytest.mark.parametrize("axis", range(4))
def test_general_path_broadcast_each_axis(axis, plan_ranks):
    torch.manual_seed(axis)
    shape = list(RANK4)
    shape[axis] = 1
    a, b = torch.randn(RANK4), torch.randn(shape)
    c = torch.rand(shape[1:]) > 0.5
    check_op(lambda x, y, m: (x - y, torch.where(m, y, x)), (a, b, c),
             ops=["aten.sub.Tensor", "aten.where.self"])
    # Outer axis 0 broadcast merges the inner three dims: 2 plan dims; an inner axis
    # splits the dims around it: 3 (2 when it is the last, the ternary's mask adds one).
    assert plan_ranks[0] == (2 if axis in (0, 3) else 3)
    assert plan_ranks[1] > 1


def test_int_division_through_general_path(plan_ranks):
    torch.manual_seed(0)
    a = torch.randint(-50, 50, (5, 7, 3), dtype=torch.int32)
    b = torch.randint(1, 9, (7, 1), dtype=torch.int32) * torch.tensor([1, -1, 1, -1, 1, -1, 1],
                                                                     dtype=torch.int32)[:, None]
    check_op(lambda x, y: (torch.div(x, y, rounding_mode="floor"), x % y), (a, b),
             ops=["aten.div.Tensor_mode", "aten.remainder.Tensor"])
    assert plan_ranks == [3, 3]


def test_flat_path_after_resize(plan_ranks):
    """Operands of the same symbolic sizes keep the flat path through resizes."""
    torch.manual_seed(0)
    n, m = Dim("n", min=1, max=16), Dim("m", min=1, max=16)
    shape = (11, 3, 13)
    check_op(lambda x, y, c: torch.clamp(x * y, y, c), (torch.randn(shape),
                                                       torch.randn(shape), torch.randn(shape)),
             ops=["aten.mul.Tensor", "aten.clamp.Tensor"],
             dynamic_shapes=({0: n, 2: m}, {0: n, 2: m}, {0: n, 2: m}),
             resize_inputs=[(torch.randn(2, 3, 5), torch.randn(2, 3, 5),
                             torch.randn(2, 3, 5)),
                            (torch.randn(1, 3, 1), torch.randn(1, 3, 1),
                             torch.randn(1, 3, 1))])
    assert set(plan_ranks) == {1}


def test_resize_across_the_boundary(plan_ranks):
    """Built broadcasting (rank-2 plan), resized to where nothing broadcasts (the plan
    shrinks to one dim, padded) and back."""
    torch.manual_seed(0)
    n = Dim("n", min=1, max=16)
    check_op(lambda x, y, c: (x + y, torch.where(c, x, y)),
             (torch.randn(13, 7), torch.randn(1, 7), torch.rand(13, 1) > 0.5),
             ops=["aten.add.Tensor", "aten.where.self"],
             dynamic_shapes=({0: n}, None, {0: n}),
             resize_inputs=[(torch.randn(1, 7), torch.randn(1, 7), torch.rand(1, 1) > 0.5),
                            (torch.randn(5, 7), torch.randn(1, 7), torch.rand(5, 1) > 0.5)])
    assert plan_ranks[0] == 2 and plan_ranks[1] == 2


def test_fp16_broadcast_rank6():
    torch.manual_seed(0)
    a = torch.randn(2, 3, 5, 1, 7, 3).half()
    b = torch.randn(3, 1, 4, 1, 3).half()
    # fp16 result of one rounding of an exact fp32 product: half an fp16 ulp.
    check_op(lambda x, y: x * y, (a, b), ops=["aten.mul.Tensor"], rtol=1e-3, atol=1e-3)
