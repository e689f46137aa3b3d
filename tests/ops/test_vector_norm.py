"""aten.linalg_vector_norm on Vulkan against eager: ord 2, 1, +-inf, 0, 3 and 0.5, any
set of dims, keepdim, fp16, NaN, long reductions, size-0 dims, resize; F.normalize
lowered whole."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.harness import check_op

NORM = "aten.linalg_vector_norm.default"
# fp16 data, fp32 accumulation, one rounding of the result: an fp16 ulp (~1e-3
# relative) of eager's (which also accumulates in fp32).
FP16_TOL = dict(rtol=2e-3, atol=2e-3)
INF = float("inf")


def _norms(dims, keepdim=False):
    return lambda x: {str(o): torch.linalg.vector_norm(x, o, dims, keepdim)
                      for o in (2, 1, INF, -INF, 0, 3, 0.5)}


@pytest.mark.parametrize("shape,dims,keepdim", [
    ((5, 3, 7), None, False), ((5, 3, 7), -1, True), ((5, 3, 7), (0, 2), False),
    ((5, 3, 7), (1,), True), ((29,), 0, False), ((2, 3, 1, 5, 1, 3), (1, 3, 5), False),
    ((3, 4097), 1, False), ((1, 70000), None, True),
])
def test_vector_norm(shape, dims, keepdim):
    torch.manual_seed(0)
    x = torch.randn(shape)
    x.view(-1)[::5] = 0.0  # ord 0 counts nonzeros
    check_op(_norms(dims, keepdim), (x,), ops=[NORM], rtol=1e-5, atol=1e-5)


def test_vector_norm_fp16_and_nan():
    torch.manual_seed(0)
    check_op(_norms(-1), (torch.randn(4, 3, 33).half(),), ops=[NORM], **FP16_TOL)
    x = torch.randn(3, 5)
    x[1, 2] = float("nan")
    check_op(_norms(1), (x,), ops=[NORM])


def test_vector_norm_empty():
    # Sums over an empty dim are 0; ATen raises for +-inf, which stays on the CPU.
    check_op(lambda x: (torch.linalg.vector_norm(x, 2, 1), torch.linalg.vector_norm(x, 1, 1),
                        torch.linalg.vector_norm(x, 0, 1)), (torch.randn(3, 0),), ops=[NORM])


def test_normalize_lowers_whole():
    torch.manual_seed(0)
    program = check_op(lambda x: (F.normalize(x, dim=-1), F.normalize(x, p=1, dim=0)),
                       (torch.randn(6, 17),), ops=[NORM, "aten.div.Tensor"])
    report = program.methods["forward"].report
    assert not report.cpu_nodes, str(report)


def test_vector_norm_resize():
    # (F.normalize of a dynamic batch also has expands of symbolic sizes, which are
    # not this op's.)
    torch.manual_seed(0)
    n = Dim("n", min=1, max=32)
    check_op(lambda x: (torch.linalg.vector_norm(x, 2, -1, True),
                        torch.linalg.vector_norm(x, INF, 0)),
             (torch.randn(6, 17),), ops=[NORM], dynamic_shapes=({0: n},),
             resize_inputs=[(torch.randn(32, 17),), (torch.randn(1, 17),)])
