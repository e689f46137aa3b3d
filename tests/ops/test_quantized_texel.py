"""linear_qw_texel.glsl: the int4 / int8 weight-only linears on CPU drivers (lavapipe;
ops/families/quantized_linear.py, ``texel_form``), against eager execution of
torchao's quantized linears.

The form is taken where the device reads inputs through texel views
(``Device.texel_inputs``: CPU drivers; GPUs keep their forms, so the tests that run it
skip elsewhere), for every row count: x, the weight (repacked over its own buffer into
16-byte blocks, 8 lanes' blocks adjacent) and the scales are uniform texel buffers;
each weight is unpacked by one AND, one subtraction and one FMA, each int4 group's sum
scaled once. Its fused forms (the residual, the SwiGLU chain and the RMS norm in its
epilogue / prologue) run in tests/ops/test_linear_add.py, test_quantized_swiglu.py and
test_quantized_rms_norm.py ("texel" forms).

Shapes: K of several groups and blocks, N = 13 (one partial tile of 8R columns: the
repacked weight larger than the constant, so a copy), N = 256 (whole tiles: repacked in
place), one, three (M_TILE 1) and five rows (M_TILE 4, a partial 4-row tile), rank 3,
resized rows. Tolerances as tests/ops/test_quantized_gemv.py: fp32 differs from eager
by summation order (2e-5); fp16 activations: eager rounds each dequantized int4 weight
and its product to fp16, this form neither (the scale applied to the group's sum: at
most 2^-12 of each product): 1e-2.
"""
import numpy as np
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op, spy_dispatches
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate.backend.quantize import quantize_for_vulkan
from vkdelegate.ops.families import quantized_linear as family

pytest.importorskip("torchao")

INT8PACK, Q4GSW = "aten._weight_int8pack_mm.default", "et_vk.linear_q4gsw.default"
DQ8CA = "et_vk.linear_dq8ca_q4gsw.default"
QUANTIZED = ("linear_qw", "linear_qw_gemv", "linear_qw_texel")


def _cpu_driver():
    from vkdelegate.runtime import default_device

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    if not default_device().texel_inputs:
        pytest.skip("linear_qw_texel.glsl is the CPU drivers' form (Device.texel_inputs)")


@pytest.fixture
def shaders(monkeypatch):
    """The shader of every dispatch recorded from now on."""
    return spy_dispatches(monkeypatch)


def _quantized(seen) -> list:
    return [s for s in seen if s in QUANTIZED]


def _linear(k, n, dtype, bias=True):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).to(dtype).eval()


def _tol(dtype):
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    return dict(rtol=tol, atol=tol)


# ---- the layouts (no device) ----------------------------------------------------------
def test_weight_layout():
    """Block b of weight row ``row_map[t, q, l]`` at [t, b, q, l]; rows past N repeat
    the last (columns that store nothing); the SwiGLU form's up rows after the gate
    rows of each lane."""
    rng = np.random.default_rng(0)
    w = rng.integers(0, 256, (20, 48), dtype=np.uint8)  # K = 64 int4 of 96 stored
    packed = family.pack_texel_weight(w, 64, 4, 2, False)
    assert packed.shape == (2, 2, 2, 8, 4) and packed.dtype == np.uint32
    words = w[:, :32].view(np.uint32).reshape(20, 2, 4)
    for t in range(2):
        for q in range(2):
            for lane in range(8):
                row = min(16 * t + 8 * q + lane, 19)
                for b in range(2):
                    assert (packed[t, b, q, lane] == words[row, b]).all()
    merged = rng.integers(-128, 128, (2 * 9, 16), dtype=np.int8)  # int8 SwiGLU, F = 9
    packed = family.pack_texel_weight(merged, 16, 8, 1, True)
    assert packed.shape == (2, 1, 2, 8, 4)
    words = merged.view(np.uint32)
    for t in range(2):
        for lane in range(8):
            col = min(8 * t + lane, 8)
            assert (packed[t, 0, 0, lane] == words[col]).all()
            assert (packed[t, 0, 1, lane] == words[9 + col]).all()


def test_scale_layout():
    """The scales of rows 4q .. 4q + 3 of a lane as one vec4, per tile and group, in
    the scales' own dtype (int8: one group)."""
    s = (np.arange(3 * 40, dtype=np.float32).reshape(3, 40) / 8).astype(np.float16)
    packed = family.pack_texel_scales(s, 36, 4, False)  # N = 36 of a stride of 40
    assert packed.shape == (2, 3, 1, 8, 4) and packed.dtype == np.float16
    for t in range(2):
        for g in range(3):
            for lane in range(8):
                for c in range(4):
                    col = min(32 * t + 8 * c + lane, 35)
                    assert packed[t, g, 0, lane, c] == s[g, col]
    s8 = np.arange(16, dtype=np.float32)  # int8 SwiGLU, F = 8, R = 2: lane 3's columns
    packed = family.pack_texel_scales(s8, 16, 2, True)  # 3 and 7 (11 clamped to F - 1)
    assert packed.shape == (1, 1, 1, 8, 4)
    assert (packed[0, 0, 0, 3] == [3, 7, 8 + 3, 8 + 7]).all()


# ---- the form against eager -------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("n", [13, 256])
def test_int4(shaders, n, group, dtype):
    _cpu_driver()
    k = 384  # 12 blocks of 32: 12 groups of 32, 3 of 128
    model = quantize_for_vulkan(_linear(k, n, dtype), "int4", group_size=group)
    torch.manual_seed(1)
    for rows in (1, 3, 5):
        check_op(model, (torch.randn(rows, k).to(dtype),), ops=[Q4GSW], **_tol(dtype))
    assert _quantized(shaders) == ["linear_qw_texel"] * 3, shaders


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("n", [13, 256])
def test_int8(shaders, n, dtype):
    _cpu_driver()
    k = 96  # 6 blocks of 16
    model = quantize_for_vulkan(_linear(k, n, dtype), "int8")
    torch.manual_seed(1)
    for rows in (1, 3, 5):
        check_op(model, (torch.randn(rows, k).to(dtype),), ops=[INT8PACK], **_tol(dtype))
    assert _quantized(shaders) == ["linear_qw_texel"] * 3, shaders


def test_rank3_without_bias_and_resized_rows(shaders):
    """x [1, T, K], T dynamic (1..8): the grid covers the upper bound, the shader reads
    the current rows from the output's metadata."""
    _cpu_driver()
    model = quantize_for_vulkan(_linear(256, 40, torch.float32, bias=False), "int4",
                                group_size=64)
    x = torch.randn(1, 6, 256)
    check_op(model, (x,), ops=[Q4GSW], rtol=2e-5, atol=2e-5,
             dynamic_shapes=({1: Dim("t", min=1, max=8)},),
             resize_inputs=[(torch.randn(1, 3, 256),), (torch.randn(1, 8, 256),)])
    assert set(_quantized(shaders)) == {"linear_qw_texel"}, shaders


@pytest.mark.parametrize("scheme,k,group", [("int4", 64, 16), ("int8", 40, 0),
                                            ("8da4w", 64, 32)])
def test_other_weights_keep_the_gemm_form(shaders, scheme, k, group):
    """int4 groups of 16 (a 32-value block would span two groups), int8 K not a multiple
    of 16 and 8da4w: linear_qw.glsl's GEMM form on CPU drivers, as before."""
    _cpu_driver()
    from vkdelegate.backend.custom_ops import LINEAR_Q4GSW
    from vkdelegate.backend.passes.quantized_linear import pack_4bit

    torch.manual_seed(0)
    x = torch.randn(2, k)
    if scheme == "int4":
        weights = pack_4bit(torch.randint(-8, 8, (13, k), dtype=torch.int8))
        scales, bias = torch.rand(k // group, 13) / 10, torch.randn(13)
        op = LINEAR_Q4GSW.overload()
        check_op(lambda t: op(t, weights, scales, group, bias), (x,), ops=[Q4GSW],
                 rtol=2e-5, atol=2e-5)
    else:
        from tests.ops.test_quantized_linear import _one_quantum

        model = quantize_for_vulkan(_linear(k, 13, torch.float32), scheme,
                                    group_size=group or None)
        atol = 2e-5 + (_one_quantum(model, x) if scheme == "8da4w" else 0)
        check_op(model, (x,), ops=[DQ8CA if scheme == "8da4w" else INT8PACK], rtol=2e-5,
                 atol=atol)
    assert _quantized(shaders) == ["linear_qw"], shaders


def test_devices_without_texel_inputs_keep_their_forms(vk_device, monkeypatch, shaders):
    """A device that reads inputs from storage buffers (every GPU) never takes the texel
    form: the CPU driver then runs linear_qw.glsl's GEMM form."""
    _cpu_driver()
    monkeypatch.setattr(vk_device, "texel_inputs", False)
    from vkdelegate.runtime import default_device

    assert default_device() is vk_device
    model = quantize_for_vulkan(_linear(256, 13, torch.float32), "int4", group_size=32)
    check_op(model, (torch.randn(1, 256),), ops=[Q4GSW], rtol=2e-5, atol=2e-5)
    assert _quantized(shaders) == ["linear_qw"], shaders


def test_weights_over_the_texel_limit_keep_the_gemm_form(vk_device, monkeypatch, shaders):
    """A repacked weight of more texels than the device views (a limit of 64 here)
    leaves the product to linear_qw.glsl."""
    _cpu_driver()
    monkeypatch.setattr(vk_device.info, "max_texel_buffer_elements", 64)
    model = quantize_for_vulkan(_linear(256, 256, torch.float32), "int4", group_size=32)
    check_op(model, (torch.randn(1, 256),), ops=[Q4GSW], rtol=2e-5, atol=2e-5)
    assert _quantized(shaders) == ["linear_qw"], shaders


def test_a_constant_read_twice_is_copied(vk_device):
    """One int4 weight (and its scales) read by two products: each repacks a copy (the
    constant's own buffer stays as stored for the other reader); a weight read once is
    repacked over its own buffer. Both against numpy."""
    _cpu_driver()
    from tests.runtime.graphs import GraphMaker

    rng = np.random.default_rng(0)
    m = GraphMaker()
    x = m.input((1, 64))
    w = rng.integers(0, 256, (128, 32), dtype=np.uint8)
    s = (rng.random((2, 128)) * 0.1).astype(np.float32)
    wid, sid = m.constant(w), m.constant(s)
    outs = [m.op(Q4GSW, [x, wid, sid, m.scalar(32), m.scalar(None)], (1, 128))
            for _ in range(2)]
    wid2, sid2 = m.constant(w), m.constant(s)
    outs.append(m.op(Q4GSW, [x, wid2, sid2, m.scalar(32), m.scalar(None)], (1, 128)))
    for o in outs:
        m.output(o)
    xv = rng.standard_normal((1, 64)).astype(np.float32)
    q = np.stack([w & 15, w >> 4], -1).reshape(128, 64).astype(np.float64) - 8
    want = xv @ (q * np.repeat(s.T, 32, axis=1)).T
    with m.build(vk_device) as graph:
        got = graph.execute([xv])
        assert [d.pipeline.name for d in graph.dispatches] == ["linear_qw_texel"] * 3
        shared = graph.resolve(wid).buffer
        # The shared constant's buffer is bound by neither product; the third's is.
        bound = [d.buffers[2] for d in graph.dispatches]
        assert shared not in bound[:2] and bound[2] is graph.resolve(wid2).buffer
    for out in got:
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_executorch_padding(shaders, dtype):
    """ExecuTorch's padding: weight rows longer than K / 2 ([128, 20] for K = 32: the
    repacked blocks fit the constant's buffer), scales and bias padded past N ([1, 130]:
    fp16 scales of 260 bytes, no whole 8-byte texels, so their repacked copy is a new
    constant)."""
    _cpu_driver()
    from vkdelegate.backend.custom_ops import LINEAR_Q4GSW
    from vkdelegate.backend.passes.quantized_linear import pack_4bit

    torch.manual_seed(0)
    weights = pack_4bit(torch.randint(-8, 8, (128, 40), dtype=torch.int8))
    scales, bias = (torch.rand(1, 130) / 10).to(dtype), torch.randn(130).to(dtype)
    op = LINEAR_Q4GSW.overload()
    for rows in (1, 5):
        check_op(lambda t: op(t, weights, scales, 32, bias),
                 (torch.randn(rows, 32).to(dtype),), ops=[Q4GSW], **_tol(dtype))
    assert _quantized(shaders) == ["linear_qw_texel"] * 2, shaders
