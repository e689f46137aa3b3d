"""A residual ``aten.add.Tensor`` after a convolution fuses into ``vkdelegate.conv_add``
(passes/fuse_conv_add.py): pointwise (conv2d.glsl's POINTWISE path on llvmpipe, the
implicit GEMM on GPUs and when forced here), general and depthwise convolutions, the
conv_with_clamp form (clamp, then add), either operand order, batch > 1, fp16, dynamic
sizes; eager is the reference, the add is gone from the delegate, and the CPU kernel
(reference executor) agrees. Adds the pass must leave alone (alpha != 1, broadcasting,
a convolution read twice) stay as they were."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops import coverage
from tests.ops.harness import check_op, delegated_nodes
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.kernels.conv_pointwise import LAST_SUM as LAST_SUM_DEFAULT

FUSED = custom_ops.CONV_ADD.name
ADD = "aten.add.Tensor"


class _Block(torch.nn.Module):
    """skip + [relu6](conv(x)), the skip being x itself or a second convolution."""

    def __init__(self, cin, cout, k, relu6=False, swap=False, skip_conv=False, **kw):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, **kw)
        self.skip = torch.nn.Conv2d(cin, cout, 1) if skip_conv else None
        self.relu6, self.swap = relu6, swap

    def forward(self, x):
        y = self.conv(x)
        y = F.relu6(y) if self.relu6 else y
        skip = self.skip(x) if self.skip is not None else x
        return skip + y if self.swap else y + skip


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


# (input shape, Conv2d args, kwargs)
CASES = {
    "pointwise": ((2, 8, 7, 5), (8, 8, 1), {}),
    "pointwise_aligned_swapped": ((1, 12, 4, 4), (12, 12, 1), {"swap": True}),
    "pointwise_relu6_long_k": ((2, 96, 3, 3), (96, 96, 1), {"relu6": True}),
    "k3_padded": ((2, 4, 9, 11), (4, 4, 3), {"padding": 1}),
    "depthwise_s1": ((1, 6, 8, 7), (6, 6, 3), {"padding": 1, "groups": 6}),
    "skip_is_a_convolution": ((1, 5, 6, 6), (5, 9, 1), {"skip_conv": True}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("gemm", [False, True], ids=["default", "gemm"])
def test_add_fuses_into_the_convolution(case, dtype, gemm, monkeypatch):
    if gemm:  # the GPUs' implicit GEMM for pointwise convolutions, forced on llvmpipe
        from vkdelegate.kernels import conv_pointwise
        monkeypatch.setattr(conv_pointwise, "use_gemm", lambda info: True)
    _check_fused(case, dtype)


def _check_fused(case, dtype):
    """``case``'s block against eager, its add fused into the convolution; the program."""
    shape, (cin, cout, k), kw = case
    torch.manual_seed(0)
    module = _Block(cin, cout, k, **kw).to(dtype)
    # fp16: eager rounds the convolution to fp16 before the add, we add in fp32 and
    # round once: the difference is within two fp16 ulps of the output.
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else {}
    program = check_op(module, (torch.randn(shape).to(dtype),), ops=[FUSED], **tol)
    assert ADD not in _ops(program), _ops(program)
    return program


# The pointwise GEMM's split form (kernels/conv_pointwise.py split_k): the residual is
# added by the reduction pass (LAST_SUM: by the last split of each block), after the
# clamp. (input shape, Conv2d args, kwargs)
SPLIT_CASES = {
    "relu6_batch3_14x14": ((3, 72, 14, 14), (72, 72, 1), {"relu6": True}),
    "skip_conv_7x7_uneven_ic_oc45": ((1, 200, 7, 7), (200, 45, 1), {"skip_conv": True}),
    "swapped_batch1_7x7": ((1, 96, 7, 7), (96, 96, 1), {"swap": True}),
}


@pytest.mark.parametrize("case", SPLIT_CASES.values(), ids=SPLIT_CASES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("first", ["conv2d_pw", "conv2d_pw_tiled"])
@pytest.mark.parametrize("last_sum", [False, True], ids=["two_pass", "last_sum"])
def test_add_fuses_into_the_split_pointwise_gemm(case, dtype, first, last_sum, monkeypatch):
    from tests.ops.harness import spy_dispatches
    from vkdelegate.kernels import conv_pointwise
    monkeypatch.setattr(conv_pointwise, "LAST_SUM", last_sum)
    if last_sum and not LAST_SUM_DEFAULT:  # a form the lowering does not pick yet:
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # its variants undeclared
    monkeypatch.setattr(conv_pointwise, "use_gemm", lambda info: True)
    monkeypatch.setattr(conv_pointwise, "TILED", first == "conv2d_pw_tiled")
    monkeypatch.setattr(conv_pointwise, "TILED_ALIGNED", True)
    monkeypatch.setattr(conv_pointwise, "SPLIT_K", True)
    monkeypatch.setattr(conv_pointwise, "SPLIT_WORKGROUPS", 1 << 20)
    monkeypatch.setattr(conv_pointwise, "TILED_SPLIT_BELOW", 1 << 20)
    monkeypatch.setattr(conv_pointwise, "TILED_MIN_SPLIT_K", 16)
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "SPLIT_OUT" in d,
                                                          "RESIDUAL" in d))
    _check_fused(case, dtype)
    kw = case[2]
    # The fused node's two passes (and skip_conv's plain convolution's, no residual);
    # LAST_SUM's one pass, whose split sums end in its own epilogue.
    fused = [(first, True, False), ("conv2d_pw_reduce", False, True)]
    plain = [(first, True, False), ("conv2d_pw_reduce", False, False)]
    if last_sum:
        fused, plain = [(first, True, True)], [(first, True, False)]
    assert seen == (plain + fused if kw.get("skip_conv") else fused), seen


def test_dynamic_sizes():
    torch.manual_seed(0)
    module = _Block(8, 8, 1, relu6=True)
    n, h = Dim("n", max=4), Dim("h", min=2, max=16)
    check_op(module, (torch.randn(2, 8, 9, 5),), ops=[FUSED],
             dynamic_shapes=({0: n, 2: h},),
             resize_inputs=[(torch.randn(1, 8, 3, 5),), (torch.randn(4, 8, 16, 5),)])


def test_reference_executor_runs_the_fusion():
    torch.manual_seed(0)
    module = _Block(6, 6, 1, relu6=True).eval()
    x = torch.randn(2, 6, 5, 7)
    program = to_backend(torch.export.export(module, (x,)),
                         VulkanPartitioner({"executor": "reference"}))
    assert FUSED in {d.op for d in program.report.decisions}
    torch.testing.assert_close(program(x), module(x), rtol=1e-5, atol=1e-5)


class _NotFusable(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.conv, self.kind = torch.nn.Conv2d(4, 4, 1), kind

    def forward(self, x):
        y = self.conv(x)
        if self.kind == "alpha":
            return torch.add(y, x, alpha=2)
        if self.kind == "broadcast":
            return y + x[:, :, :1, :]
        return y + x, y * 2  # "read_twice": the convolution has a second reader


@pytest.mark.parametrize("kind", ["alpha", "broadcast", "read_twice"])
def test_adds_that_are_not_fused(kind):
    torch.manual_seed(0)
    program = check_op(_NotFusable(kind), (torch.randn(1, 4, 5, 6),),
                       ops=[ADD, "aten.convolution.default"])
    assert FUSED not in _ops(program)
