"""aten.sum.dim_IntList on Vulkan against eager: any set of dims, keepdim both ways,
negative dims, all dims, fp16 accumulating in fp32, empty reductions, resize."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("shape,dims", [
    ((113,), [0]), ((7, 11), [1]), ((7, 11), [0]), ((3, 5, 7, 11), [0, 2]),
    ((3, 5, 7, 11), [-1, 1]), ((2, 3, 5, 1, 7, 3), [0, 3, 5]), ((0, 3), [0]),
])
def test_dims(shape, dims, keepdim):
    torch.manual_seed(0)
    check_op(lambda x: x.sum(dim=dims, keepdim=keepdim), (torch.randn(shape),),
             ops=["aten.sum.dim_IntList"])


def test_fp16():
    torch.manual_seed(1)
    check_op(lambda x: x.sum(dim=1), (torch.rand(5, 1031).half(),),
             ops=["aten.sum.dim_IntList"], rtol=2e-3, atol=2e-2)


def test_resize():
    torch.manual_seed(2)
    n = Dim("n", min=1, max=29)
    check_op(lambda x: x.sum(dim=[0, 2], keepdim=True), (torch.randn(29, 3, 7),),
             ops=["aten.sum.dim_IntList"], dynamic_shapes=({0: n},),
             resize_inputs=[(torch.randn(5, 3, 7),), (torch.randn(1, 3, 7),)])
