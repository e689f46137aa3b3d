"""The RMS norm folded into the int4 / int8 weight-only products:
``vkdelegate.rms_norm_linear_q4gsw``, ``rms_norm_weight_int8pack_mm`` and their SwiGLU
forms ``rms_norm_linear_q4gsw_swiglu`` / ``rms_norm_weight_int8pack_mm_swiglu``
(ops/families/quantized_linear.py, linear_qw_gemv.glsl's RMS_NORM; made by
passes/fuse_rms_norm_linear.py and fuse_linear_swiglu.py).

- The ops against their CPU kernel (et_vk.rms_norm rounded to x's dtype, then the
  plain product or SwiGLU form): int4 with group sizes 32 (with a bias) and 128, int8,
  fp32 and fp16 activations, one, three and five rows, on each form: the vectorized
  GEMV forced as tests/ops/test_quantized_swiglu.py forces it (its DIRECT form folds
  the norm in, one dispatch, for the up to GEMV_ROWS rows it takes; five rows:
  linear_qw.glsl's GEMM form after the norm's dispatch), linear_qw.glsl's GEMV form
  (the vector form refused: the norm's dispatch, then the GEMV), its GEMM form
  (forced: the norm's dispatch, then the GEMM) and a CPU driver's own
  (linear_qw_texel.glsl's RMS_NORM: the norm folded in, one dispatch, any rows; CPU
  drivers only). Also the vector form's other variants:
  the staged form (x staged in shared memory: the squares summed as staged), SVEC's
  vector scale loads, no subgroup arithmetic (the shared-memory tree), K past one
  stride of the 128 invocations.
- Compile option ``rms_norm_prologue`` off (and every form that does not fold): the
  program is bitwise the unfused one (et_vk.rms_norm's node, then the plain op), on
  the vector and texel forms too.
- The pass: a norm before an int4 / int8 linear (int8 through torchao's view to
  [-1, K]) and before a gated MLP fuses into the ops; several readers of several rows
  and a norm read elsewhere are left alone.
- Crafted blobs of mismatched sizes or dtypes refused at load, by the Vulkan loader
  and the reference executor alike; the CPU glue passes the SwiGLU forms only the
  SwiGLU chains.

Tolerances against the CPU kernel (and eager): fp32 1e-4, as the quantized linear
tests: the fused GEMV computes rstd * sum(w * (x * norm_w)) where the kernel computes
sum(w * (x * rstd * norm_w)), the same products up to fp32 rounding and the order of
the sums. fp16: the CPU kernel rounds the normalized row to fp16 (et_vk.rms_norm's
output, 2^-11 relative per element) and (int4) the dequantized weights to fp16, the
fused GEMV neither (fp32 throughout, one rounding at the store); summed over K terms
in fp32 and rounded once, the outputs (magnitude ~1-5 here) are a few fp16 steps apart
at most: the quantized tests' fp16 tolerance, 2e-2, met with margin.
"""
import pytest
import torch

from tests.ops import coverage
from tests.ops.harness import check_op, delegated_nodes, spy_dispatches
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import swiglu

pytest.importorskip("torchao")

Q4 = custom_ops.RMS_NORM_LINEAR_Q4GSW.name
Q4_SWIGLU = custom_ops.RMS_NORM_LINEAR_Q4GSW_SWIGLU.name
Q8 = custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM.name
Q8_SWIGLU = custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU.name
NORM = "et_vk.rms_norm.default"
F16 = dict(rtol=2e-2, atol=2e-2)
F32 = dict(rtol=1e-4, atol=1e-4)
EPS = 1e-5


def _tol(dtype):
    return F16 if dtype == torch.float16 else F32


def _skip():
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)


def _force(monkeypatch, form: str) -> list:
    """Make each quantized product take ``form``: "default" (linear_qw.glsl's GEMM
    form, forced on every device), "vector" (linear_qw_gemv.glsl forced for up to
    GEMV_ROWS rows), "words" (linear_qw.glsl's GEMV form forced: the vector form
    refused), "texel" (a CPU driver's own: linear_qw_texel.glsl; skipped on GPUs). The
    first three refuse the texel form. Returns the list of (shader, RMS_NORM form?)
    each dispatch recorded."""
    from vkdelegate.ops.families import quantized_linear as family

    if form == "texel":
        _skip_without_texel_inputs()
    else:
        monkeypatch.setattr(family, "texel_form", lambda *args: False)
    if form in ("default", "texel"):  # a GPU's own choice is the vector form for few rows
        monkeypatch.setattr(family, "use_gemv", lambda info, m: False)
    else:
        monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    if form == "words":
        monkeypatch.setattr(family, "vector_gemv", lambda *args: False)
    return spy_dispatches(monkeypatch, lambda shader, defines: (shader, "RMS_NORM" in defines))


def _skip_without_texel_inputs():
    from vkdelegate.runtime import default_device

    _skip()
    if not default_device().texel_inputs:
        pytest.skip("linear_qw_texel.glsl is the CPU drivers' form (Device.texel_inputs)")


@pytest.fixture(params=["default", "vector", "words", "texel"])
def forms(request, monkeypatch):
    """(form, the list ``_force`` returns) for each of the four forms."""
    return request.param, _force(monkeypatch, request.param)


#: The fused dispatch (vector and texel forms), and the two of every form that does
#: not fold the norm in.
FOLDED = [("linear_qw_gemv", True)]
FOLDED_TEXEL = [("linear_qw_texel", True)]


def _two(product="linear_qw") -> list:
    return [("norm", False), (product, False)]


class _Op(torch.nn.Module):
    """One of the four ops on seeded random quantized weights: int4 ("int4_g32",
    "int4_g128") weights [N, K/2] with scales [K / group, N], or int8 weights [N, K]
    with scales [N]; N = 2F for the SwiGLU forms (``steps``); a norm weight in 0.5..1.5
    of the activations' dtype. ``s_scale`` scales the scales (outputs of a few units
    for K = 256 at 1.0)."""

    def __init__(self, scheme, k, n, dtype, steps=None, bias=False, s_scale=1.0):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.scheme, self.steps = scheme, steps
        rows = 2 * n if steps is not None else n
        self.register_buffer("nw", (torch.rand(k, generator=g) + 0.5).to(dtype))
        if scheme.startswith("int4"):
            self.group = int(scheme[len("int4_g"):])
            self.register_buffer("w", torch.randint(0, 256, (rows, k // 2), generator=g,
                                                    dtype=torch.uint8))
            s = torch.rand(k // self.group, rows, generator=g) * 0.02 + 0.01
            self.bias = torch.nn.Parameter(torch.randn(rows, generator=g).to(dtype)) \
                if bias else None
        else:
            self.register_buffer("w", torch.randint(-128, 128, (rows, k), generator=g,
                                                    dtype=torch.int8))
            s = torch.rand(rows, generator=g) * 0.004 + 0.002
        self.register_buffer("s", (s * s_scale).to(dtype))

    @property
    def op(self) -> str:
        int4 = self.scheme.startswith("int4")
        if self.steps is None:
            return Q4 if int4 else Q8
        return Q4_SWIGLU if int4 else Q8_SWIGLU

    def forward(self, x):
        if self.scheme.startswith("int4"):
            args = (x, self.nw, EPS, self.w, self.s, self.group, self.bias)
            if self.steps is None:
                return custom_ops.RMS_NORM_LINEAR_Q4GSW.overload()(*args)
            return custom_ops.RMS_NORM_LINEAR_Q4GSW_SWIGLU.overload()(*args, self.steps)
        args = (x, self.nw, EPS, self.w, self.s)
        if self.steps is None:
            return custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM.overload()(*args)
        return custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU.overload()(*args, self.steps)


class _Unfused(torch.nn.Module):
    """``_Op``'s computation as two nodes: et_vk.rms_norm, then the plain product (or
    its SwiGLU form); the normalized row is an output too, so that the pass keeps the
    norm."""

    def __init__(self, fused: _Op):
        super().__init__()
        self.m = fused

    def forward(self, x):
        m = self.m
        y = custom_ops.RMS_NORM.overload()(x, m.nw, EPS)
        if m.scheme.startswith("int4"):
            args = (y, m.w, m.s, m.group, m.bias)
            if m.steps is None:
                return custom_ops.LINEAR_Q4GSW.overload()(*args), y
            return custom_ops.LINEAR_Q4GSW_SWIGLU.overload()(*args, m.steps), y
        if m.steps is None:
            return torch.ops.aten._weight_int8pack_mm.default(y, m.w, m.s), y
        return custom_ops.WEIGHT_INT8PACK_MM_SWIGLU.overload()(y, m.w, m.s, m.steps), y


def _x(scheme, rows, k, dtype, scale=1.0):
    shape = (rows, k) if scheme == "int8" else (1, rows, k)
    return (torch.randn(*shape) * scale + 0.5).to(dtype)


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


def _lower(module, x, **options):
    return to_backend(torch.export.export(module.eval(), (x,)), VulkanPartitioner(options))


#: (scheme, SwiGLU chain or None, bias) of each op case.
CASES = [("int4_g32", None, True), ("int4_g128", None, False), ("int8", None, False),
         ("int4_g32", swiglu.SILU, True), ("int8", swiglu.SILU, False)]
CASE_IDS = ["int4_g32_bias", "int4_g128", "int8", "int4_g32_swiglu", "int8_swiglu"]
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]


def _steps(steps, dtype):
    # fp16: the chain HF's fp16 models export (SiLU in fp32 between casts).
    return swiglu.SILU_HALF if steps is not None and dtype == torch.float16 else steps


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,steps,bias", CASES, ids=CASE_IDS)
def test_op_against_its_cpu_kernel(forms, scheme, steps, bias, dtype):
    # K = 256 (8 int4 blocks of 32, 2 groups of 128; 16 int8 blocks of 16), N = F = 13
    # (not a multiple of a workgroup's outputs). Rows 1 and 3: the forced vector form
    # folds the norm in; 5 (past GEMV_ROWS): every other form records the norm's
    # dispatch, then linear_qw.glsl's GEMM form. The texel form folds it in for every
    # row count (5: its 4-row tiles).
    form, seen = forms
    module = _Op(scheme, 256, 13, dtype, _steps(steps, dtype), bias)
    torch.manual_seed(1)
    for rows in (1, 3, 5):
        seen.clear()
        program = check_op(module, (_x(scheme, rows, 256, dtype),), ops=[module.op],
                           **_tol(dtype))
        assert _ops(program) == [module.op]
        if form == "texel":
            assert seen == FOLDED_TEXEL, (rows, seen)
        elif form == "vector" and rows <= 4:
            assert seen == FOLDED, (rows, seen)
        else:
            assert seen == _two(), (rows, seen)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,steps", [("int4_g32", None), ("int4_g128", swiglu.SILU)],
                         ids=["int4", "int4_swiglu"])
def test_vector_scale_loads(monkeypatch, scheme, steps, dtype):
    """N = 16 (F = 16): linear_qw_gemv.glsl's SVEC form reads a workgroup's int4 scales
    by vector loads, with the norm folded in."""
    from vkdelegate.ops.families import quantized_linear as family
    monkeypatch.setattr(family, "VMIN_GROUPS", 0)  # VROWS whatever N: its runs of scales

    seen = _force(monkeypatch, "vector")
    svec = []
    vector_scales = family.vector_scales
    monkeypatch.setattr(family, "vector_scales",
                        lambda *a: svec.append(vector_scales(*a)) or svec[-1])
    module = _Op(scheme, 256, 16, dtype, _steps(steps, dtype))
    torch.manual_seed(1)
    check_op(module, (_x(scheme, 1, 256, dtype),), ops=[module.op], **_tol(dtype))
    assert svec == [True] and seen == FOLDED, (svec, seen)


@pytest.mark.parametrize("scheme,steps,dtype", [
    ("int4_g32", None, torch.float32), ("int8", swiglu.SILU_HALF, torch.float16),
    ("int4_g128", swiglu.SILU_HALF, torch.float16), ("int8", None, torch.float32)],
    ids=["int4_fp32", "int8_swiglu_fp16", "int4_swiglu_fp16", "int8_fp32"])
@pytest.mark.parametrize("variant", ["staged", "no_subgroups"])
def test_other_vector_forms(monkeypatch, variant, scheme, steps, dtype):
    """The staged form (x staged in shared memory per sweep, times the norm weight, the
    squares summed as each element is staged; a --sweep form of benchmarks/
    quant_gemv.py, not declared) and the shared-memory tree reduction (no subgroup
    arithmetic): K = 256 and K = 8192 (int4: 256 blocks, two sweeps / strides of the
    128 invocations; int8 4096: 256 blocks)."""
    from vkdelegate.ops.families import quantized_linear as family

    seen = _force(monkeypatch, "vector")
    if variant == "staged":
        monkeypatch.setattr(family, "VDIRECT", False)
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)
    else:
        monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(1)
    for k in (256, 8192 if scheme.startswith("int4") else 4096):
        module = _Op(scheme, k, 13, dtype, steps)
        for rows in (1, 2):
            check_op(module, (_x(scheme, rows, k, dtype),), ops=[module.op],
                     **_tol(dtype))
    assert seen == FOLDED * 4, seen


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,steps,bias", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("form", ["vector_option_off", "texel_option_off", "default",
                                  "words"])
def test_unfolded_forms_are_the_unfused_program(monkeypatch, form, scheme, steps, bias,
                                                 dtype):
    """Where the norm is not folded in (compile option rms_norm_prologue off on the
    vector and texel forms; linear_qw.glsl's GEMM and GEMV forms), the fused op
    records the norm's dispatch and then the plain op's: bitwise the program of the
    two ops as separate nodes."""
    _skip()
    seen = _force(monkeypatch, form.partition("_option")[0])
    module = _Op(scheme, 256, 13, dtype, _steps(steps, dtype), bias).eval()
    x = _x(scheme, 1, 256, dtype)
    options = {"rms_norm_prologue": False} if form.endswith("option_off") else {}
    fused, unfused = _lower(module, x, **options), _lower(_Unfused(module), x, **options)
    assert _ops(fused) == [module.op] and NORM in _ops(unfused), (_ops(fused), _ops(unfused))
    for scale in (1.0, 4.0, 30.0):
        xi = _x(scheme, 1, 256, dtype, scale)
        got, want = fused(xi), unfused(xi)[0]
        assert torch.equal(got, want), (scale, (got - want).abs().max())
    product = {"vector": "linear_qw_gemv", "texel": "linear_qw_texel"}.get(
        form.partition("_option")[0], "linear_qw")
    assert seen == _two(product) * 2, seen  # recorded as each program is built
    fused.close()
    unfused.close()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,steps", [("int4_g32", None), ("int8", swiglu.SILU)],
                         ids=["int4", "int8_swiglu"])
@pytest.mark.parametrize("form", ["vector", "texel"])
def test_folded_matches_the_two_dispatches(monkeypatch, form, scheme, steps, dtype):
    """The folded GEMV (or texel form) against the norm's dispatch then the same form
    (option off) on K =
    2048, scales giving outputs of about unit size: fp32 a few ulps apart (the order of
    the sums); fp16 each normalized element of the two-dispatch form is rounded to
    fp16 (2^-11 relative), which over K = 2048 random terms moves a sum by about
    2^-12 of its spread, within one step of the output's fp16 rounding (2^-10
    relative): rtol = atol = 2^-9 (SwiGLU: gate and up each a step apart, then the
    chain's roundings: 2^-8)."""
    _skip()
    seen = _force(monkeypatch, form)
    module = _Op(scheme, 2048, 40, dtype, _steps(steps, dtype),
                 s_scale=0.1 if scheme == "int8" else 0.3).eval()
    torch.manual_seed(2)  # x's values, whatever ran before (the spread check below)
    x = _x(scheme, 1, 2048, dtype, 3.0)
    outs = [_lower(module, x, rms_norm_prologue=on)(x) for on in (True, False)]
    if form == "vector":
        assert seen == FOLDED + _two("linear_qw_gemv"), seen
    else:
        assert seen == FOLDED_TEXEL + _two("linear_qw_texel"), seen
    assert 0.5 < outs[1].float().std() < 4, outs[1].float().std()
    if dtype == torch.float32:
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    else:
        tol = 2 ** -8 if steps is not None else 2 ** -9
        torch.testing.assert_close(outs[0], outs[1], rtol=tol, atol=tol)


def test_cpu_kernels_are_the_norm_then_the_product():
    torch.manual_seed(0)
    for scheme, steps in (("int4_g32", None), ("int4_g32", swiglu.SILU_HALF),
                          ("int8", None), ("int8", swiglu.SILU_HALF)):
        module = _Op(scheme, 64, 7, torch.float16, steps, bias=scheme != "int8")
        x = _x(scheme, 3, 64, torch.float16)
        assert torch.equal(module(x), _Unfused(module)(x)[0]), (scheme, steps)
    for op, args in ((custom_ops.RMS_NORM_LINEAR_Q4GSW_SWIGLU,
                      (x := _x("int4", 1, 64, torch.float32), torch.ones(64), EPS,
                       torch.zeros(14, 32, dtype=torch.uint8), torch.ones(2, 14), 32, None)),
                     (custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU,
                      (x[0], torch.ones(64), EPS, torch.zeros(14, 64, dtype=torch.int8),
                       torch.ones(14)))):
        with pytest.raises(Exception, match="not a SwiGLU chain"):
            op.overload()(*args, "aten.relu.default(r0)")


# ---- the pass ------------------------------------------------------------------------
class _RmsNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, weights in 0.5..1.5."""

    def __init__(self, k, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(k) + 0.5)
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class _NormLinear(torch.nn.Module):
    def __init__(self, k, n, bias=False):
        super().__init__()
        self.norm, self.proj = _RmsNorm(k), torch.nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.proj(self.norm(x))


class _NormMlp(torch.nn.Module):
    """The norm, then HF Llama's gated MLP without its down_proj."""

    def __init__(self, k, f):
        super().__init__()
        self.norm = _RmsNorm(k)
        self.gate = torch.nn.Linear(k, f, bias=False)
        self.up = torch.nn.Linear(k, f, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return torch.nn.functional.silu(self.gate(h)) * self.up(h)


def _quantize(module, scheme, dtype):
    from vkdelegate.backend.quantize import quantize_for_vulkan

    module = module.to(dtype).eval()
    if scheme == "int8":
        return quantize_for_vulkan(module, "int8")
    return quantize_for_vulkan(module, "int4", group_size=32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_pass_fuses_the_norm_into_the_product(monkeypatch, scheme, dtype):
    """A norm before a quantized linear (int8: read through torchao's view to [-1, K],
    which moves before the norm) and before a quantized gated MLP (merged and fused
    with its chain by merge_linears and fuse_linear_swiglu): one fused node each, one
    dispatch on the vector form, eager's values."""
    _skip()
    seen = _force(monkeypatch, "vector")
    torch.manual_seed(0)
    x = torch.randn(1, 1, 128).to(dtype)
    for module, op in ((_NormLinear(128, 24, bias=scheme == "int4"),
                        Q4 if scheme == "int4" else Q8),
                       (_NormMlp(128, 24), Q4_SWIGLU if scheme == "int4" else Q8_SWIGLU)):
        module = _quantize(module, scheme, dtype)
        seen.clear()
        program = check_op(module, (x,), ops=[op], **_tol(dtype))
        assert op in _ops(program) and NORM not in _ops(program), _ops(program)
        assert ("linear_qw_gemv", True) in seen and ("norm", False) not in seen, seen


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_pass_leaves_other_norms(scheme):
    """Several products of several rows that do not merge (one has a bias, the other
    not: merge_linears merges prefill's q/k/v into one product, which then takes the
    norm; the fallback would repeat the norm's dispatch for each) and a norm whose
    output is read elsewhere keep the norm's node."""
    _skip()

    class Siblings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = _RmsNorm(64)
            self.a, self.b = torch.nn.Linear(64, 16), torch.nn.Linear(64, 24, bias=False)

        def forward(self, x):
            h = self.norm(x)
            return self.a(h), self.b(h)

    class ReadElsewhere(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.a = _RmsNorm(64), torch.nn.Linear(64, 16)

        def forward(self, x):
            h = self.norm(x)
            return self.a(h), h * 2

    torch.manual_seed(0)
    fused = (Q4, Q8)
    # int8's bias is an add after the product, so its siblings do merge (and the merged
    # product takes the norm): only int4's bias keeps them apart.
    cases = ((Siblings(), 3),) if scheme == "int4" else ()
    for module, rows in cases + ((ReadElsewhere(), 1),):
        module = _quantize(module, scheme, torch.float32)
        program = check_op(module, (torch.randn(1, rows, 64),), ops=[NORM])
        assert not set(fused) & set(_ops(program)), _ops(program)


# ---- load-time checks of crafted blobs ------------------------------------------------
def _blob(op, nw_shape=(32,), nw_dtype="float32", weight_rows=14, x_shape=None,
          scale_cols=None, bias=None, steps=None, out_cols=None):
    """A blob of one fused node: x [1, 1, 32] (int8: [1, 32]), a norm weight of
    ``nw_shape`` / ``nw_dtype``, constant weights of ``weight_rows`` rows, scales (int4:
    [1, scale_cols or weight_rows], group size 32; int8: [scale_cols or weight_rows]),
    an int4 bias of ``bias`` elements (or none), the SwiGLU forms' ``steps`` (default:
    the fp32 chain), the output declared [..., out_cols] (default: the op's)."""
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    rng = np.random.default_rng(0)
    m = GraphMaker()
    cols = scale_cols or weight_rows
    int4 = op in (Q4, Q4_SWIGLU)
    x = m.input(x_shape or ((1, 1, 32) if int4 else (1, 32)))
    nw = m.constant((rng.random(nw_shape) + 0.5).astype(nw_dtype))
    head = [x, nw, m.scalar(1e-6)]
    if int4:
        w = m.constant(rng.integers(0, 256, (weight_rows, 16), dtype=np.uint8))
        sc = m.constant((rng.random((1, cols)) * 0.1).astype(np.float32))
        b = m.scalar(None) if bias is None else \
            m.constant(rng.standard_normal((bias,)).astype(np.float32))
        args = head + [w, sc, m.scalar(32), b]
    else:
        w = m.constant(rng.integers(-128, 128, (weight_rows, 32), dtype=np.int8))
        sc = m.constant((rng.random((cols,)) * 0.1).astype(np.float32))
        args = head + [w, sc]
    swiglu_op = op in (Q4_SWIGLU, Q8_SWIGLU)
    if swiglu_op:
        args.append(m._add(g.String(steps or swiglu.SILU)))
    if out_cols is None:
        out_cols = weight_rows // 2 if swiglu_op else weight_rows
    out_shape = (1, 1, out_cols) if int4 else (1, out_cols)
    m.output(m.op(op, args, out_shape))
    return m


ALL = [Q4, Q4_SWIGLU, Q8, Q8_SWIGLU]
ALL_IDS = ["int4", "int4_swiglu", "int8", "int8_swiglu"]


@pytest.mark.parametrize("op", ALL, ids=ALL_IDS)
def test_matching_blob_runs(vk_device, op):
    import numpy as np

    from vkdelegate.runtime import load_delegate

    m = _blob(op, bias=14 if op == Q4 else None)
    int4 = op in (Q4, Q4_SWIGLU)
    x = np.random.default_rng(1).standard_normal((1, 1, 32) if int4 else (1, 32),
                                                 np.float32)
    nw = np.frombuffer(m.constants[0], np.float32)
    y = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * nw
    if int4:
        w = np.frombuffer(m.constants[1], np.uint8).reshape(14, 16).astype(np.int32)
        q = np.stack([w & 15, w >> 4], -1).reshape(14, 32) - 8
        s = np.frombuffer(m.constants[2], np.float32)
        want = y @ (q * s[:, None]).T
        if op == Q4:
            want = want + np.frombuffer(m.constants[3], np.float32)
    else:
        q = np.frombuffer(m.constants[1], np.int8).reshape(14, 32).astype(np.float32)
        want = (y @ q.T) * np.frombuffer(m.constants[2], np.float32)
    if op in (Q4_SWIGLU, Q8_SWIGLU):
        gate, up = want[..., :7], want[..., 7:]
        want = gate / (1 + np.exp(-gate)) * up
    with load_delegate(m.blob()) as graph:
        got = graph.execute([x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ALL, ids=ALL_IDS)
@pytest.mark.parametrize("kwargs,match", [
    (dict(nw_shape=(33,)), r"norm_weight of sizes \[33\] for an input of sizes "
                           r"\[1, (1, )?32\]: it must be \[32\]"),
    (dict(nw_shape=(1, 32)), r"norm_weight of sizes \[1, 32\]"),
    (dict(nw_dtype="float16"), r"norm_weight float16 for input float32"),
    (dict(scale_cols=7), r"scales"),
    (dict(out_cols=15), r"output"),
])
def test_crafted_blob_is_refused_at_load(vk_device, op, kwargs, match):
    """A blob whose norm weight does not fit x (sizes the kernels would read past, or
    another dtype), whose scales do not fit the weight or whose output has other sizes
    is refused before anything is built, by the Vulkan loader and the reference
    executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(op, **kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=rf"^node 0 \({op}\): .*" + match):
            load(blob)


@pytest.mark.parametrize("op,kwargs,match", [
    (Q8, dict(x_shape=(1, 1, 32)), r"rank"),
    (Q8_SWIGLU, dict(x_shape=(1, 1, 32)), r"rank"),
    (Q4_SWIGLU, dict(weight_rows=13), r"weight \[13, 16\]: a merged gate/up weight has "
                                      r"an even number of rows"),
    (Q8_SWIGLU, dict(weight_rows=13), r"weight \[13, 32\]: a merged gate/up weight has "
                                      r"an even number of rows"),
    (Q4_SWIGLU, dict(bias=7), r"bias must be \[14\]"),
    (Q4, dict(bias=13), r"bias of sizes \[13\] for 14 outputs"),
    (Q4_SWIGLU, dict(steps=swiglu.SILU_HALF), r"does not apply to float32 tensors"),
], ids=["int8_rank3", "int8_swiglu_rank3", "int4_swiglu_odd", "int8_swiglu_odd",
        "int4_swiglu_bias", "int4_bias", "int4_swiglu_fp16_chain"])
def test_crafted_op_blob_is_refused_at_load(vk_device, op, kwargs, match):
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(op, **kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=rf"^node 0 \({op}\): .*" + match):
            load(blob)


def test_glue_refuses_other_steps():
    """A program file's CPU glue may pass the SwiGLU forms only the SwiGLU chains
    (backend/allowed_ops.py's STR_CHOICES)."""
    from vkdelegate.backend.glue_checks import check_arguments

    for declared, args in ((custom_ops.RMS_NORM_LINEAR_Q4GSW_SWIGLU,
                            [0, 0, EPS, 0, 0, 32, None]),
                           (custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU,
                            [0, 0, EPS, 0, 0])):
        op = declared.overload()
        check_arguments(declared.name, op, args + [swiglu.SILU_HALF], {}, "node 0")
        with pytest.raises(VkDelegateError, match="which takes one of"):
            check_arguments(declared.name, op, args + ["aten.relu.default(r0)"], {},
                            "node 0")
