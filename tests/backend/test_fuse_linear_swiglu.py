"""passes/fuse_linear_swiglu on a decode-shaped HF Llama MLP block (post-attention RMS
norm, merged gate/up linear, SwiGLU, down_proj + residual; one-row input [1, 1, K]):
the norm (already folded into the merged linear as ``vkdelegate.rms_norm_linear``), the
merged linear and its SwiGLU chain become one ``vkdelegate.rms_norm_linear_swiglu``
(``vkdelegate.linear_swiglu`` without the norm), one dispatch fewer, and the outputs
are torch.equal to the program lowered with compile option ``fuse_linear_swiglu`` off,
in float32 and float16, on the CPU driver's form (the norm's dispatch, then
linear.glsl) and on the GPU forms forced (gemv.glsl's RMS_NORM, with SWIGLU or without;
as tests/ops/test_gemm_core.py forces them): each gate and up sum is the plain GEMV's
and the epilogue rounds it as the linear's store does. Chains the pass must leave alone
stay: SiLU of the second half, a GeGLU, a half read twice. The same block with
torchao's int4 / int8 weight-only linears: their fused forms with the norm
(rms_norm_linear_q4gsw_swiglu, rms_norm_weight_int8pack_mm_swiglu: the norm already
folded into the merged product as rms_norm_linear_q4gsw / rms_norm_weight_int8pack_mm),
bitwise the unfused program."""
import dataclasses

import pytest
import torch

from tests.ops.harness import delegated_nodes, dispatched_ops
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend

pytest.importorskip("transformers")

FUSED = "vkdelegate.rms_norm_linear_swiglu.default"
PLAIN = "vkdelegate.linear_swiglu.default"  # without a norm before it
CHAIN = "vkdelegate.fused_elementwise.default"


class _Mlp(torch.nn.Module):
    """h + mlp(norm(h)) as a HF Llama decoder layer's second half (``kind``: "llama";
    "up_first" computes up_proj before gate_proj, so the merged weight's first half is
    up's; "geglu" gates with gelu; "gate_out" also returns the gate)."""

    def __init__(self, hidden, inter, kind="llama"):
        super().__init__()
        import transformers as tf
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        cfg = tf.LlamaConfig(hidden_size=hidden, intermediate_size=inter,
                             num_attention_heads=1, num_key_value_heads=1, head_dim=2)
        self.norm, self.mlp, self.kind = LlamaRMSNorm(hidden), LlamaMLP(cfg), kind

    def forward(self, h):
        x, mlp = self.norm(h), self.mlp
        if self.kind == "llama":
            return h + mlp(x)
        if self.kind == "up_first":
            up = mlp.up_proj(x)
            return h + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * up)
        if self.kind == "geglu":
            return h + mlp.down_proj(torch.nn.functional.gelu(mlp.gate_proj(x))
                                     * mlp.up_proj(x))
        gate = mlp.gate_proj(x)
        return h + mlp.down_proj(torch.nn.functional.silu(gate) * mlp.up_proj(x)), gate


def _skip():
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)


def _lower(module, x, **options):
    ep = torch.export.export(module, (x,))
    return to_backend(ep, VulkanPartitioner(options))


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


def _dispatches(program, x) -> list:
    return dispatched_ops(program, x)


def _gemv_path(forms) -> bool:
    """Whether one-row products take the GEMV path (gemv.glsl: the norm, the product
    and the chain in one dispatch): the GPU forms forced, or this device's tile table
    has it (GPUs; a CPU driver records the norm, then linear.glsl)."""
    from vkdelegate.kernels.gemm_tiles import tiles_for
    from vkdelegate.runtime import default_device

    tiles = tiles_for(default_device().info.type)
    return forms == "gpu_forms" or bool(tiles is not None and tiles.gemv)


@pytest.fixture(params=["default", "gpu_forms"])
def forms(request, monkeypatch):
    if request.param == "gpu_forms":
        from vkdelegate.kernels import gemm, gemm_tiles

        portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
        monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("hidden,inter", [(64, 40), (37, 13)], ids=["k64", "k37_f13"])
def test_fused_equals_unfused(forms, dtype, hidden, inter):
    _skip()
    torch.manual_seed(0)
    module = _Mlp(hidden, inter).to(dtype).eval()
    x = torch.randn(1, 1, hidden).to(dtype)
    fused, unfused = _lower(module, x), _lower(module, x, fuse_linear_swiglu=False)
    assert FUSED in _ops(fused) and CHAIN not in _ops(fused), _ops(fused)
    assert FUSED not in _ops(unfused) and CHAIN in _ops(unfused), _ops(unfused)
    for scale in (1.0, 4.0, 30.0):  # large values: fp16 rounding and SiLU's tails
        xi = (torch.randn(1, 1, hidden) * scale).to(dtype)
        got, want = fused(xi), unfused(xi)
        assert torch.equal(got, want), (got - want).abs().max()
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else {}
        with torch.no_grad():
            torch.testing.assert_close(got, module(xi), **tol)
    ops, before = _dispatches(fused, x), _dispatches(unfused, x)
    # The chain's dispatch is gone, and the copies of the parts the unfused program
    # makes where a part's offset misses the buffer alignment (64 bytes on lavapipe).
    copies = before.count("vkdelegate.narrow_last.default")
    assert len(ops) == len(before) - 1 - copies, (ops, before)
    # One dispatch with the GEMV path; on a CPU driver the norm's, then linear.glsl's.
    assert ops.count(FUSED) == (1 if _gemv_path(forms) else 2) and CHAIN not in ops, ops


QUANTIZED = {"int4": "vkdelegate.rms_norm_linear_q4gsw_swiglu.default",
             "int8": "vkdelegate.rms_norm_weight_int8pack_mm_swiglu.default"}


def _quantized_norm_dispatches() -> int:
    """Dispatches of a one-row quantized product with the norm folded in on this device:
    1 where its form folds the norm in (linear_qw_gemv.glsl's RMS_NORM on GPUs,
    linear_qw_texel.glsl's on CPU drivers: quantized_linear.folds_rms_norm), else 2
    (the norm's, then linear_qw.glsl's)."""
    from vkdelegate.ops.families.quantized_linear import folds_rms_norm
    from vkdelegate.runtime import default_device

    return 1 if folds_rms_norm(default_device(), 1) else 2


def _quantized_mlp(scheme, kind="llama", dtype=torch.float32):
    pytest.importorskip("torchao")
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    return quantize_for_vulkan(_Mlp(64, 96, kind).to(dtype).eval(), scheme,
                               group_size=None if scheme == "int8" else 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_fused_equals_unfused(scheme, dtype):
    """The MLP block with torchao's int4 (group size 32) / int8 weight-only linears:
    the merged gate/up product with the norm folded in (rms_norm_linear_q4gsw /
    rms_norm_weight_int8pack_mm, int8's between torchao's views) and its chain become
    rms_norm_linear_q4gsw_swiglu / rms_norm_weight_int8pack_mm_swiglu, one dispatch
    fewer, torch.equal to the unfused program (the device's own forms; every form:
    tests/ops/test_quantized_swiglu.py, test_quantized_rms_norm.py)."""
    _skip()
    module = _quantized_mlp(scheme, dtype=dtype)
    x = torch.randn(1, 1, 64).to(dtype)
    fused, unfused = _lower(module, x), _lower(module, x, fuse_linear_swiglu=False)
    assert QUANTIZED[scheme] in _ops(fused) and CHAIN not in _ops(fused), _ops(fused)
    assert QUANTIZED[scheme] not in _ops(unfused) and CHAIN in _ops(unfused), _ops(unfused)
    for scale in (1.0, 4.0):
        xi = (torch.randn(1, 1, 64) * scale).to(dtype)
        got, want = fused(xi), unfused(xi)
        assert torch.equal(got, want), (got - want).abs().max()
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else {}
        with torch.no_grad():
            torch.testing.assert_close(got, module(xi), **tol)
    ops, before = _dispatches(fused, x), _dispatches(unfused, x)
    copies = before.count("vkdelegate.narrow_last.default")
    # int8's op output [1, F] viewed to [1, 1, F] aliases (no copy dispatch).
    assert len(ops) == len(before) - 1 - copies, (ops, before)
    assert ops.count(QUANTIZED[scheme]) == _quantized_norm_dispatches() \
        and CHAIN not in ops, ops


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_up_first_is_left_alone(scheme):
    """SiLU of the merged product's second half: no fused op, eager's values."""
    _skip()
    module = _quantized_mlp(scheme, "up_first")
    x = torch.randn(1, 1, 64)
    program = _lower(module, x)
    assert QUANTIZED[scheme] not in _ops(program) and CHAIN in _ops(program), _ops(program)
    with torch.no_grad():
        torch.testing.assert_close(program(x), module(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["up_first", "geglu", "gate_out"])
def test_other_chains_are_left_alone(kind):
    _skip()
    torch.manual_seed(0)
    module = _Mlp(64, 40, kind).eval()
    x = torch.randn(1, 1, 64)
    program = _lower(module, x)
    assert FUSED not in _ops(program), _ops(program)
    with torch.no_grad():
        want = module(x)
    torch.testing.assert_close(program(x), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_norm_in_gemv_option_off(forms, dtype):
    """Compile option rms_norm_prologue=False: the fused op records the norm's own
    dispatch, then the SwiGLU GEMV: still bitwise the unfused program with the same
    option, one dispatch more than with it on where the GEMV path runs."""
    _skip()
    torch.manual_seed(0)
    module = _Mlp(64, 40).to(dtype).eval()
    x = (torch.randn(1, 1, 64) * 4).to(dtype)
    off = _lower(module, x, rms_norm_prologue=False)
    unfused = _lower(module, x, rms_norm_prologue=False, fuse_linear_swiglu=False)
    assert FUSED in _ops(off), _ops(off)
    assert torch.equal(off(x), unfused(x))
    on = _dispatches(_lower(module, x), x)
    assert len(_dispatches(off, x)) == len(on) + _gemv_path(forms), on


def test_plain_linear_producer():
    """A merged gate/up linear without a norm before it (aten.linear) fuses too."""
    _skip()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up = torch.nn.Linear(24, 11), torch.nn.Linear(24, 11)

        def forward(self, x):
            return torch.nn.functional.silu(self.gate(x)) * self.up(x)

    torch.manual_seed(0)
    module = M().eval()
    x = torch.randn(1, 1, 24)
    fused, unfused = _lower(module, x), _lower(module, x, fuse_linear_swiglu=False)
    assert _ops(fused) == [PLAIN], _ops(fused)
    assert torch.equal(fused(x), unfused(x))


@pytest.mark.parametrize("options", [{"force_fp16": True}, {"executor": "reference"}],
                         ids=["force_fp16", "reference"])
def test_force_fp16_and_reference_executor_equal_unfused(options):
    """A float32 model under force_fp16 (the float32 chain on float16 tensors: every
    step rounded, as its fused chain rounds it) and the reference executor (the op's
    CPU kernel): bitwise the unfused program too."""
    _skip()
    torch.manual_seed(0)
    module = _Mlp(64, 40).eval()
    x = torch.randn(1, 1, 64)
    fused = _lower(module, x, **options)
    unfused = _lower(module, x, fuse_linear_swiglu=False, **options)
    assert FUSED in {d.op for d in fused.report.decisions}
    assert torch.equal(fused(x), unfused(x))


@pytest.mark.parametrize("options", [{"force_fp16": True}, {"executor": "reference"}],
                         ids=["force_fp16", "reference"])
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_force_fp16_and_reference_executor_equal_unfused(scheme, options):
    """The int4 / int8 fused forms under force_fp16 (a float32 model's chain on float16
    tensors) and on the reference executor (the ops' CPU kernels): bitwise the unfused
    program too."""
    _skip()
    module = _quantized_mlp(scheme)
    x = torch.randn(1, 1, 64)
    fused = _lower(module, x, **options)
    unfused = _lower(module, x, fuse_linear_swiglu=False, **options)
    assert QUANTIZED[scheme] in {d.op for d in fused.report.decisions}
    assert torch.equal(fused(x), unfused(x))


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_saved_program_loads_and_runs(tmp_path, scheme):
    _skip()
    from vkdelegate import load

    module = _quantized_mlp(scheme, dtype=torch.float16)
    x = torch.randn(1, 1, 64).half()
    program = _lower(module, x)
    assert QUANTIZED[scheme] in _ops(program)
    program.save(tmp_path / "mlp.vkdp")
    loaded = load(tmp_path / "mlp.vkdp")
    assert torch.equal(loaded(x), program(x))


def test_saved_program_loads_and_runs(tmp_path):
    """The op's steps text travels in the program file and passes the load checks."""
    _skip()
    from vkdelegate import load

    torch.manual_seed(0)
    module = _Mlp(64, 40).half().eval()
    x = torch.randn(1, 1, 64).half()
    program = _lower(module, x)
    program.save(tmp_path / "mlp.vkdp")
    loaded = load(tmp_path / "mlp.vkdp")
    assert torch.equal(loaded(x), program(x))
