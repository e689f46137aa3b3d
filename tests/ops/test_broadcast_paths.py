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


def test_cpu_drivers_take_chunks_of_the_innermost_plan_dim(monkeypatch):
    """On CPU drivers a binary_op / ternary_op / fused_elementwise invocation computes
    CHUNK (specialization constant 4) consecutive elements of the innermost plan dim
    (kernels/broadcast.chunk_for: 8, or the power of two covering a shorter dim; 1 on
    GPUs), walking the plan once for them. Values against eager for innermost dims
    that are not multiples of the chunk (5, 11, 3), broadcasting along the innermost
    dim (stride 0) and outside it, a scalar operand, a fused chain, and a resize of
    the innermost dim itself. Bit-equal to eager on CPU drivers; GPUs may contract
    the fused chain's x * col + row into one fused multiply-add (one rounding instead
    of two; the H200 does), so one ulp of tolerance there."""
    from vkdelegate.runtime.device import default_device
    seen = []
    original = NodeBuilder.dispatch

    def spy(self, shader, defines, *args, spec_constants=(), **kw):
        if shader in ("binary_op", "ternary_op", "fused_elementwise"):
            seen.append((shader, tuple(spec_constants)))
        return original(self, shader, defines, *args, spec_constants=spec_constants, **kw)
    monkeypatch.setattr(NodeBuilder, "dispatch", spy)

    def fn(x, row, col, c):
        return (x + row, x * col, torch.where(x > 0, row, col), x - 2.5,
                torch.relu(x * col + row) * 0.5)
    torch.manual_seed(0)
    n = Dim("n", min=2, max=11)
    x, row, col = torch.randn(3, 5, 11), torch.randn(11), torch.randn(3, 5, 1)
    exact = default_device().info.type == "cpu"
    check_op(fn, (x, row, col, torch.randn(3)), rtol=0 if exact else 2.0 ** -23,
             atol=0 if exact else 2.0 ** -24,
             ops=["aten.add.Tensor", "aten.mul.Tensor", "aten.where.self",
                  "aten.sub.Tensor"],
             dynamic_shapes=({2: n}, {0: n}, None, None),
             resize_inputs=[(torch.randn(3, 5, 6), torch.randn(6), col, torch.randn(3)),
                            (torch.randn(3, 5, 3), torch.randn(3), col, torch.randn(3))])
    cpu = default_device().info.type == "cpu"
    chunks = {c[1] for _, c in seen}
    assert chunks == ({8} if cpu else {1}), seen
    assert {shader for shader, _ in seen} == {"binary_op", "ternary_op",
                                              "fused_elementwise"}, seen
