"""aten.mm.default on Vulkan against eager: run-time and constant (prepacked) second
operands, fp32 and fp16, prime shapes, resize of the row count."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op


class _ConstWeight(torch.nn.Module):
    def __init__(self, k, n, dtype):
        super().__init__()
        self.register_buffer("w", torch.randn(k, n).to(dtype))

    def forward(self, x):
        return torch.mm(x, self.w)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
def test_runtime_operands(dtype, tol):
    torch.manual_seed(0)
    check_op(torch.mm, (torch.randn(37, 29).to(dtype), torch.randn(29, 11).to(dtype)),
             ops=["aten.mm.default"], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
def test_constant_weight(dtype, tol):
    torch.manual_seed(1)
    check_op(_ConstWeight(29, 13, dtype), (torch.randn(7, 29).to(dtype),),
             ops=["aten.mm.default"], rtol=tol, atol=tol)


def test_resize_rows():
    torch.manual_seed(2)
    m = Dim("m", min=1, max=37)
    check_op(_ConstWeight(5, 3, torch.float32), (torch.randn(37, 5),),
             ops=["aten.mm.default"], dynamic_shapes={"x": {0: m}},
             resize_inputs=[(torch.randn(2, 5),), (torch.randn(1, 5),)])
