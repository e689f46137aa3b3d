"""The fuse_rms_norm lowering pass and et_vk.rms_norm: HF Llama's RMSNorm (fp32, and
fp16 with its fp32 upcast) becomes one node on Vulkan; patterns it must not fuse stay
correct; the reference executor runs the norm graphs."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.ops.harness import FnModule, assert_matches_eager, check_op
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops

FUSED = "et_vk.rms_norm.default"


class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm.forward, verbatim."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _ops(program):
    return [d.op for d in program.methods["forward"].report.decisions]


@pytest.mark.parametrize("n", [64, 4097])
def test_llama_rms_norm_fp32_fuses(n):
    torch.manual_seed(0)
    program = check_op(LlamaRMSNorm(n), (torch.randn(2, 3, n),), ops=[FUSED],
                       rtol=1e-5, atol=1e-5)
    assert _ops(program) == [FUSED], _ops(program)


def test_llama_rms_norm_fp16_fuses():
    # The fused op rounds once; the pattern rounds y to fp16 before the weight multiply:
    # an fp16 ulp apart (|out| up to ~10: 8e-3).
    torch.manual_seed(0)
    program = check_op(LlamaRMSNorm(48).half(), (torch.randn(5, 48).half(),), ops=[FUSED],
                       rtol=4e-3, atol=8e-3)
    assert _ops(program) == [FUSED], _ops(program)


def test_mul_x_x_form_fuses():
    torch.manual_seed(0)
    w = torch.randn(16)

    def fn(x):
        return (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5)) * w
    program = check_op(fn, (torch.randn(4, 16),), ops=[FUSED], rtol=1e-5, atol=1e-5)
    assert _ops(program) == [FUSED], _ops(program)


def test_patterns_left_alone():
    # The mean over another dim, an intermediate read elsewhere, or a broadcast weight
    # of other sizes: no fusion, results as eager.
    torch.manual_seed(0)
    w, w2 = torch.randn(8), torch.randn(3, 8)

    def fn(x):
        rstd = torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-5)
        var = x.pow(2).mean(-1, keepdim=True)
        shared = x * torch.rsqrt(var + 1e-5) * w
        other = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w2
        return x * rstd * w, shared, var, other
    program = to_backend(torch.export.export(FnModule(fn), (torch.randn(3, 8),)),
                         VulkanPartitioner({"executor": "vulkan"}))
    assert FUSED not in _ops(program), _ops(program)
    x = torch.randn(3, 8)
    try:
        assert_matches_eager(program(x), fn(x), 1e-5, 1e-5)
    finally:
        program.close()



def test_cpu_kernel_matches_executorch_semantics():
    # The torch-side CPU kernel (what the glue and the reference executor run).
    torch.manual_seed(0)
    x, w = torch.randn(3, 10).half(), torch.randn(10).half()
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
                * w.float()).half()
    got = torch.ops.et_vk.rms_norm.default(x, w, 1e-6)
    assert custom_ops.RMS_NORM.name == FUSED
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_reference_executor_runs_the_norm_graphs():
    torch.manual_seed(0)
    ln, gn, rms = nn.LayerNorm(12), nn.GroupNorm(2, 4), nn.RMSNorm(12)
    inst, llama = nn.InstanceNorm2d(4, affine=True), LlamaRMSNorm(12)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.gn, self.rms, self.inst, self.llama = ln, gn, rms, inst, llama

        def forward(self, x, img):
            out = torch.ops.aten.native_layer_norm.default(x, [12], None, None, 1e-5)
            return (self.ln(x), self.rms(x), self.llama(x), self.gn(img), self.inst(img),
                    F.normalize(x, dim=-1), out)
    net = Net().eval()
    args = (torch.randn(3, 12), torch.randn(2, 4, 3, 5))
    program = to_backend(torch.export.export(net, args),
                         VulkanPartitioner({"executor": "reference"}))
    report = program.methods["forward"].report
    assert not report.cpu_nodes, str(report)
    assert FUSED in _ops(program)
    with torch.no_grad():
        assert_matches_eager(program(*args), net(*args), 1e-5, 1e-5)
