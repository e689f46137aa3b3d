"""softmax / log_softmax on Vulkan against eager: every dim (negative too), ranks 0..6,
fp16, large magnitudes (the max shift), NaN and -inf rows, size-0/1 dims, resize."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op

OPS = ["aten._softmax.default", "aten._log_softmax.default"]
# fp16 data, fp32 math, one rounding: eager rounds the same results, but exp/log of
# fp16 inputs differ by an fp16 ulp (~1e-3 relative; log_softmax values reach ~10).
FP16_TOL = dict(rtol=2e-3, atol=4e-3)


def _both(dim):
    return lambda t: (t.softmax(dim), t.log_softmax(dim))


@pytest.mark.parametrize("shape,dim", [
    ((3, 5, 7), 0), ((3, 5, 7), 1), ((3, 5, 7), -1), ((29,), 0), ((), 0), ((), -1),
    ((2, 3, 1, 5, 1, 3), 3), ((2, 3, 1, 5, 1, 3), -4), ((4, 1), 1), ((0, 3), 1),
    ((3, 0), 1),
])
def test_dims_and_shapes(shape, dim):
    torch.manual_seed(0)
    check_op(_both(dim), (torch.randn(shape) * 3,), ops=OPS)


def test_fp16():
    torch.manual_seed(0)
    check_op(_both(-1), (torch.randn(5, 3, 11).half() * 4,), ops=OPS, **FP16_TOL)


def test_large_magnitudes_and_special_rows():
    # Without the max shift exp(1000) overflows; NaN rows and all -inf rows are NaN.
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1000.0, 999.0, -1000.0, 0.0],
                      [-inf, 0.0, 1.0, -inf],
                      [nan, 0.0, 1.0, 2.0],
                      [-inf, -inf, -inf, -inf],
                      [88.0, 89.0, 90.0, 91.0]])
    check_op(_both(1), (x,), ops=OPS)


def test_resize():
    torch.manual_seed(0)
    n, m = Dim("n", min=1, max=16), Dim("m", min=1, max=40)
    check_op(lambda t: (t.softmax(-1), t.log_softmax(0)), (torch.randn(13, 29),),
             ops=OPS, dynamic_shapes=({0: n, 1: m},),
             resize_inputs=[(torch.randn(1, 3),), (torch.randn(16, 40),),
                            (torch.randn(7, 1),)])
