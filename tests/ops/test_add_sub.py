"""aten.add.Tensor / aten.sub.Tensor on Vulkan against eager: every claimed dtype,
alpha, broadcasting on every axis, Python-scalar operands, empty tensors, resize."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op

FP16_TOL = dict(rtol=2e-3, atol=2e-3)


def _data(dtype, shape):
    if dtype in (torch.int32, torch.int8):
        return torch.randint(-100, 100, shape, dtype=dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 255, shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("dtype,alpha", [(torch.float32, 2.5), (torch.float16, -0.5),
                                         (torch.int32, 3), (torch.int8, 7),
                                         (torch.uint8, 2)])
@pytest.mark.parametrize("fn,op", [(torch.add, "aten.add.Tensor"),
                                   (torch.sub, "aten.sub.Tensor")])
def test_dtypes_alpha(fn, op, dtype, alpha):
    torch.manual_seed(0)
    tol = FP16_TOL if dtype == torch.float16 else {}
    # int8/uint8 results overflow and wrap, as in eager.
    check_op(lambda a, b: fn(a, b, alpha=alpha),
             (_data(dtype, (7, 37)), _data(dtype, (37,))), ops=[op], **tol)


@pytest.mark.parametrize("shapes", [
    ((5, 7), (5, 1)), ((5, 7), (1, 7)), ((3, 1, 11), (1, 7, 1)),
    ((2, 3, 1, 5, 1, 7), (3, 5, 1, 1)), ((1,), (3, 29)), ((0, 5), (5,)), ((113,), ()),
])
def test_broadcasting(shapes):
    torch.manual_seed(1)
    check_op(torch.add, tuple(torch.randn(s) for s in shapes), ops=["aten.add.Tensor"])


def test_python_scalar_operand():
    torch.manual_seed(2)
    # the two ops' own kernels: unfused (a chain of them is one fused node)
    check_op(lambda x: (x + 3) - 0.5, (torch.randn(11, 3),),
             ops=["aten.add.Tensor", "aten.sub.Tensor"], options={"fuse_elementwise": False})


def test_resize():
    torch.manual_seed(3)
    n = Dim("n", min=1, max=37)
    check_op(lambda a, b: torch.sub(a, b, alpha=0.5), (torch.randn(37, 5), torch.randn(37, 1)),
             ops=["aten.sub.Tensor"], dynamic_shapes=({0: n}, {0: n}),
             resize_inputs=[(torch.randn(3, 5), torch.randn(3, 1)),
                            (torch.randn(1, 5), torch.randn(1, 1))])
