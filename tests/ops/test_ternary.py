"""where.self and clamp.Tensor on Vulkan against eager: dtypes, broadcasting of all
three operands, scalar branches (scalar_tensor), absent bounds, NaN, resize."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op

NAN = float("nan")


def _data(dtype, shape):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype == torch.int32:
        return torch.randint(-9, 9, shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool],
                         ids=str)
def test_where(dtype):
    torch.manual_seed(0)
    c = torch.rand(3, 1, 5) > 0.5
    x, y = _data(dtype, (7, 1)), _data(dtype, (1, 7, 5))
    check_op(lambda m, a, b: (torch.where(m, a, b), torch.where(m, b, a)), (c, x, y),
             ops=["aten.where.self"])


def test_where_with_scalar_branch_and_promotion():
    torch.manual_seed(0)
    x, i = torch.randn(4, 6), torch.randint(-5, 5, (6,), dtype=torch.int32)
    check_op(lambda a, n: {"zero": torch.where(a > 0, a, 0.0),
                           "mixed": torch.where(a < 0, n, a)}, (x, i),
             ops=["aten.where.self"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
def test_clamp_tensor(dtype):
    torch.manual_seed(0)
    x, lo, hi = _data(dtype, (3, 5, 7)), _data(dtype, (5, 1)), _data(dtype, (7,))
    check_op(lambda a, b, c: {"both": torch.clamp(a, b, c), "min": torch.clamp(a, min=b),
                              "max": torch.clamp(a, max=c)}, (x, lo, hi),
             ops=["aten.clamp.Tensor"])


def test_clamp_tensor_nan():
    x = torch.tensor([NAN, 1.0, 5.0, -5.0, 0.0])
    lo = torch.tensor([0.0, NAN, 1.0, -1.0, 2.0])
    hi = torch.tensor([1.0, 2.0, NAN, 1.0, 1.0])  # last: min > max gives max
    check_op(lambda a, b, c: torch.clamp(a, b, c), (x, lo, hi), ops=["aten.clamp.Tensor"])


def test_resize():
    torch.manual_seed(0)
    n = Dim("n", min=1, max=32)
    check_op(lambda c, a, b: torch.where(c, a, b),
             (torch.rand(4, 29) > 0.5, torch.randn(4, 29), torch.randn(1, 29)),
             ops=["aten.where.self"], dynamic_shapes=({1: n}, {1: n}, {1: n}),
             resize_inputs=[(torch.rand(4, 2) > 0.5, torch.randn(4, 2), torch.randn(1, 2))])
