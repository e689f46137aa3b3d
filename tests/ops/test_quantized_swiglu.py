"""``vkdelegate.linear_q4gsw_swiglu``, ``vkdelegate.weight_int8pack_mm_swiglu`` and
``vkdelegate.linear_dq8ca_q4gsw_swiglu`` (ops/families/quantized_linear.py,
kernels/swiglu.py; made by passes/fuse_linear_swiglu.py): a merged gate/up int4
(torchao's int4 weight-only, et_vk.linear_q4gsw), int8 (aten._weight_int8pack_mm) or
8da4w (et_vk.linear_dq8ca_q4gsw) product with the SwiGLU chain in its kernel's
epilogue, one dispatch.

- Against the unfused program (compile option ``fuse_linear_swiglu`` off: the merged
  product, its narrow_last parts, the fused_elementwise chain): torch.equal, int4 with
  group sizes 32 and 128 (and a bias), int8 (through the views torchao's int8 linear
  puts around its product), fp32 and fp16 activations, F = 13 (not a multiple of a
  workgroup's outputs), on each form: a CPU driver's (linear_qw_texel.glsl: the
  prepacked gate and up rows of each lane; CPU drivers only), linear_qw.glsl's GEMM
  form (forced), the vectorized GEMV (linear_qw_gemv.glsl, forced as tests/ops/test_quantized_gemv.py
  forces it; with and without subgroup arithmetic; F = 16 for SVEC's vector scale
  loads; its staged form) and linear_qw.glsl's GEMV form (32-bit words: forced by
  refusing the vector form, and int8's K = 52, no 16-byte blocks; int8's K = 37: byte
  loads), and on a device without 8- and 16-bit storage (the texel form there too). Each sum is finished and
  rounded as the plain op's store does it, each output's sum is accumulated in the
  same order as the plain op's, so the bits are the unfused program's; and eager's
  within the quantized linear tolerances (fp16: 2e-2; the outputs are SiLU(gate) * up).
- The ops themselves against their CPU kernel (the product, then the chain): one to
  five rows (the GEMM form past GEMV_ROWS; the texel form's 4-row tiles), both fp16
  chains.
- Crafted blobs (an odd or mismatched weight, a bias or output of other sizes, another
  chain) refused at load by the Vulkan loader and the reference executor alike; the
  CPU glue passes them only the SwiGLU chains.
"""
import inspect

import pytest
import torch

from tests.ops.harness import check_op, delegated_nodes, dispatched_ops
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import swiglu

pytest.importorskip("torchao")

Q4 = custom_ops.LINEAR_Q4GSW_SWIGLU.name
Q8 = custom_ops.WEIGHT_INT8PACK_MM_SWIGLU.name
DQ = custom_ops.LINEAR_DQ8CA_Q4GSW_SWIGLU.name
CHAIN = "vkdelegate.fused_elementwise.default"
PLAIN = {"int4": "et_vk.linear_q4gsw.default", "int8": "aten._weight_int8pack_mm.default",
         "8da4": "et_vk.linear_dq8ca_q4gsw.default"}
F16 = dict(rtol=2e-2, atol=2e-2)


def _skip():
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)


def _force(monkeypatch, form: str) -> list:
    """Make each quantized product take ``form``: "default" (linear_qw.glsl's GEMM
    form, forced on every device), "vector" (linear_qw_gemv.glsl forced for up to
    GEMV_ROWS rows), "words" (linear_qw.glsl's GEMV form forced: the vector form
    refused), "texel" (a CPU driver's own: linear_qw_texel.glsl; skipped on GPUs). The
    first three refuse the texel form. Returns the list of (form, SwiGLU epilogue?)
    each recorded product takes."""
    from vkdelegate.ops.families import quantized_linear as family

    seen = []
    if form == "texel":
        _skip()
        from vkdelegate.runtime import default_device

        if not default_device().texel_inputs:
            pytest.skip("linear_qw_texel.glsl is the CPU drivers' form (Device.texel_inputs)")
    else:
        monkeypatch.setattr(family, "texel_form", lambda *args: False)
    if form in ("default", "texel"):  # a GPU's own choice is the vector form for few rows
        monkeypatch.setattr(family, "use_gemv", lambda info, m: False)
    else:
        monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    if form == "words":
        monkeypatch.setattr(family, "vector_gemv", lambda *args: False)

    def spy(name, real):
        signature = inspect.signature(real)

        def recorded(*args, **kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            took = name if name != "plain" else ("words" if bound["gemv"] else "gemm")
            seen.append((took, bound.get("swiglu") is not None))
            return real(*args, **kwargs)
        return recorded

    monkeypatch.setattr(family, "vector_defines", spy("vector", family.vector_defines))
    monkeypatch.setattr(family, "qlinear_defines", spy("plain", family.qlinear_defines))
    monkeypatch.setattr(family, "texel_defines", spy("texel", family.texel_defines))
    return seen


#: The form each product takes (``_force``'s record) under each forced form.
TAKES = {"default": "gemm", "vector": "vector", "words": "words", "texel": "texel"}


@pytest.fixture(params=["default", "vector", "words", "texel"])
def forms(request, monkeypatch):
    """(form, the list ``_force`` returns) for each of the four forms."""
    return request.param, _force(monkeypatch, request.param)


class _GatedMlp(torch.nn.Module):
    """silu(gate(x)) * up(x), gate and up two Linear(k, f) (HF Llama's MLP without its
    down_proj)."""

    def __init__(self, k, f, bias=False):
        super().__init__()
        self.gate = torch.nn.Linear(k, f, bias=bias)
        self.up = torch.nn.Linear(k, f, bias=bias)

    def forward(self, x):
        return torch.nn.functional.silu(self.gate(x)) * self.up(x)


def _quantized(scheme: str, k: int, f: int, dtype, bias=False):
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    module = _GatedMlp(k, f, bias).to(dtype).eval()
    if scheme == "int8":
        return quantize_for_vulkan(module, "int8")
    name, group = scheme.split("_g")
    return quantize_for_vulkan(module, name, group_size=int(group))


def _lower(module, x, **options):
    return to_backend(torch.export.export(module, (x,)), VulkanPartitioner(options))


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


def _dispatches(program, x) -> list:
    return dispatched_ops(program, x)


def _check_fused(scheme, dtype, f, k=256, bias=False, scales=(1.0, 4.0, 30.0)):
    """Lower the quantized gated MLP fused and unfused: the fused op replaces the
    product, its parts and the chain; the outputs are bitwise equal, and eager's
    within tolerance; one dispatch fewer (and the parts' copies)."""
    _skip()
    fused_op = {"int8": Q8, "8da4": DQ}.get(scheme[:4], Q4)
    module = _quantized(scheme, k, f, dtype, bias)
    x = torch.randn(1, 1, k).to(dtype)
    fused, unfused = _lower(module, x), _lower(module, x, fuse_linear_swiglu=False)
    ops, before = _ops(fused), _ops(unfused)
    assert fused_op in ops and CHAIN not in ops and PLAIN[scheme[:4]] not in ops, ops
    assert fused_op not in before and CHAIN in before, before
    for scale in scales:
        xi = (torch.randn(1, 1, k) * scale).to(dtype)
        got, want = fused(xi), unfused(xi)
        assert torch.equal(got, want), (scale, (got - want).abs().max())
        if scale <= 4.0:  # (fp16: larger products overflow eager's and ours apart)
            with torch.no_grad():
                # 8da4w: test_quantized_linear's margin of one activation at its
                # neighbouring int8 quantum moves an output by up to x's range / 255 *
                # max|w| (~1e-2 here): the fp16 tolerance.
                tol = F16 if dtype == torch.float16 or scheme.startswith("8da4w") \
                    else dict(rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(got, module(xi), **tol)
    # Views aside: int8's fused op [1, F] is viewed to the chain's [1, 1, F], a copy
    # only where that view is the program's output, as here (in a decoder it aliases:
    # tests/llm/test_decode_dispatches.py).
    ran, ran_before = ([op for op in _dispatches(p, x) if op != "aten.view.default"]
                       for p in (fused, unfused))
    copies = ran_before.count("vkdelegate.narrow_last.default")
    assert len(ran) == len(ran_before) - 1 - copies, (ran, ran_before)
    assert ran.count(fused_op) == 1 and CHAIN not in ran, ran


SCHEMES = ["int4_g32", "int4_g128", "int8"]
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_fused_equals_unfused(forms, scheme, dtype):
    # K = 256 (8 int4 blocks of 32, 16 int8 blocks of 16), F = 13; int4 with group
    # size 32 also with a bias (the bias of rows n and F + n).
    form, seen = forms
    _check_fused(scheme, dtype, 13, bias=scheme == "int4_g32")
    want = TAKES[form]
    assert (want, True) in seen and {f for f, _ in seen} == {want}, seen


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("form", ["default", "vector", "words"])
def test_8da4w_fused_equals_unfused(monkeypatch, form, dtype):
    """8da4w's merged gate/up (et_vk.linear_dq8ca_q4gsw: x quantized per row, integer
    products; a CPU driver too takes linear_qw.glsl's GEMM form, no texel form) with
    the chain in the epilogue of each form: bitwise the unfused program, eager's within
    the fp16 tolerance (plus one activation quantum: test_quantized_linear's)."""
    seen = _force(monkeypatch, form)
    _check_fused("8da4w_g32", dtype, 13, bias=True, scales=(1.0, 4.0))
    module = _quantized("8da4w_g32", 256, 13, dtype, bias=True)
    check_op(module, (torch.randn(2, 256).to(dtype),), ops=[DQ], **F16)
    want = TAKES[form]
    assert (want, True) in seen and {f for f, _ in seen} == {want}, seen


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", SCHEMES[:2])
def test_vector_scale_loads(monkeypatch, scheme, dtype):
    """F = 16: linear_qw_gemv.glsl's SVEC form reads each half's 4 int4 scales in one
    vector load (fp32: a vec4; fp16: a uvec2), as the plain op reads its 8 rows'."""
    from vkdelegate.ops.families import quantized_linear as family
    monkeypatch.setattr(family, "VMIN_GROUPS", 0)  # VROWS whatever N: its runs of scales

    seen = _force(monkeypatch, "vector")
    svec = []
    vector_scales = family.vector_scales
    monkeypatch.setattr(family, "vector_scales", lambda *a: svec.append(vector_scales(*a))
                        or svec[-1])
    _check_fused(scheme, dtype, 16)
    assert svec == [True, True], svec  # fused, then unfused
    assert seen == [("vector", True), ("vector", False)], seen


@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
def test_vector_form_without_subgroups(monkeypatch, scheme):
    """linear_qw_gemv.glsl's shared-memory tree reduction (no subgroup arithmetic)."""
    from vkdelegate.ops.families import quantized_linear as family

    seen = _force(monkeypatch, "vector")
    monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    _check_fused(scheme, torch.float16, 13)
    assert seen == [("vector", True), ("vector", False)], seen


@pytest.mark.parametrize("scheme,dtype", [("int4_g32", torch.float32),
                                          ("int8", torch.float16)], ids=["int4", "int8"])
def test_staged_vector_form(monkeypatch, scheme, dtype):
    """linear_qw_gemv.glsl's staged form (x in shared memory per sweep; a --sweep form of
    benchmarks/quant_gemv.py, not the lowering's default: not declared)."""
    from tests.ops import coverage
    from vkdelegate.ops.families import quantized_linear as family

    seen = _force(monkeypatch, "vector")
    monkeypatch.setattr(family, "VDIRECT", False)
    monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)
    _check_fused(scheme, dtype, 13)
    assert seen == [("vector", True), ("vector", False)], seen


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("gemv", [False, True], ids=["gemm", "gemv"])
def test_int8_word_and_byte_forms(monkeypatch, gemv, dtype):
    """int8 K = 52 (not a multiple of 16: no 16-byte blocks, 32-bit words) and 37 (not
    of 4: byte loads) on linear_qw.glsl's GEMM form (a CPU driver's) and its GEMV form
    (a GPU's, forced here: the vectorized GEMV cannot take these K)."""
    seen = _force(monkeypatch, "vector" if gemv else "default")
    for k in (52, 37):
        _check_fused("int8", dtype, 13, k=k, scales=(1.0, 4.0))
    form = "words" if gemv else "gemm"
    assert seen == [(form, True), (form, False)] * 2, seen


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
@pytest.mark.parametrize("form", ["gemm", "gemv", "texel"])
def test_device_without_small_storage(vk_device, monkeypatch, form, scheme, dtype):
    """A device without 8- and 16-bit storage (each weight byte an int32 the shader
    assembles words from, fp16 tensors stored as fp32): linear_qw.glsl's GEMM form
    and its GEMV form (forced), and a CPU driver's texel form (which prepacks the
    weights whatever their storage and reads fp16 x stored as fp32 4 values a texel),
    the fused program bitwise the unfused one there too."""
    from vkdelegate.runtime import Device, load_delegate

    seen = _force(monkeypatch, {"gemm": "default", "gemv": "vector"}.get(form, form))
    module = _quantized(scheme, 256, 13, dtype)
    torch.manual_seed(1)
    x = torch.randn(1, 1, 256).to(dtype)
    outs = []
    dev = Device(vk_device.info.name, validation=True, small_storage=False)
    try:
        for options in ({}, {"fuse_linear_swiglu": False}):
            (delegate,) = _lower(module, x, **options).methods["forward"].delegates
            with load_delegate(delegate.blob, delegate.named_data, device=dev) as loaded:
                outs.append(torch.from_numpy(loaded.execute([x.numpy()])[0]))
        assert not dev.validation_messages
    finally:
        dev.close()
    took = "words" if form == "gemv" else form
    assert seen == [(took, True), (took, False)], seen
    assert torch.equal(outs[0], outs[1]), (outs[0] - outs[1]).abs().max()
    with torch.no_grad():
        want = module(x)
    tol = F16 if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[0].reshape(want.shape), want, **tol)


# ---- the ops against their CPU kernel ------------------------------------------------
class _Fused(torch.nn.Module):
    """One fused op on seeded random quantized weights of a merged [2F, K] product."""

    def __init__(self, op, k, f, dtype, steps, group=32, bias=True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.op, self.steps, self.group = op, steps, group
        if op == Q4:
            self.register_buffer("w", torch.randint(0, 256, (2 * f, k // 2), generator=g,
                                                    dtype=torch.uint8))
            s = torch.rand(k // group, 2 * f, generator=g) * 0.02 + 0.01
            self.bias = torch.nn.Parameter(torch.randn(2 * f, generator=g).to(dtype)) \
                if bias else None
        else:
            self.register_buffer("w", torch.randint(-128, 128, (2 * f, k), generator=g,
                                                    dtype=torch.int8))
            s = torch.rand(2 * f, generator=g) * 0.01 + 0.005
        self.register_buffer("s", s.to(dtype))

    def forward(self, x):
        if self.op == Q4:
            return custom_ops.LINEAR_Q4GSW_SWIGLU.overload()(x, self.w, self.s, self.group,
                                                             self.bias, self.steps)
        return custom_ops.WEIGHT_INT8PACK_MM_SWIGLU.overload()(x, self.w, self.s,
                                                               self.steps)


CASES = [(torch.float32, swiglu.SILU), (torch.float16, swiglu.SILU_HALF),
         (torch.float16, swiglu.SILU)]
CASE_IDS = ["fp32", "fp16_casts", "fp16_rounded_steps"]


@pytest.mark.parametrize("dtype,steps", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("op", [Q4, Q8], ids=["int4", "int8"])
def test_op_against_its_cpu_kernel(forms, op, dtype, steps):
    # Rows 1 and 3 (the forced GEMV forms' or the GEMM form's), 5 (the GEMM form with
    # 4-row tiles everywhere); int4 with a bias; K = 128, F = 13.
    form, seen = forms
    module = _Fused(op, 128, 13, dtype, steps)
    tol = F16 if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
    for rows in (1, 3, 5):
        shape = (rows, 128) if op == Q8 else (1, rows, 128)
        x = torch.randn(*shape).to(dtype)
        assert _ops(check_op(module, (x,), ops=[op], **tol)) == [op]
    want = TAKES[form]
    # Past GEMV_ROWS the forced GEMV forms leave the product to the GEMM form.
    assert {f for f, _ in seen} == ({want, "gemm"} if form in ("vector", "words")
                                    else {want}), seen
    assert all(swiglu_on for _, swiglu_on in seen), seen


def test_cpu_kernels_are_the_product_then_the_chain():
    torch.manual_seed(0)
    m4 = _Fused(Q4, 64, 7, torch.float16, swiglu.SILU_HALF)
    x = torch.randn(1, 3, 64).half()
    y = custom_ops.LINEAR_Q4GSW.overload()(x, m4.w, m4.s, 32, m4.bias)
    assert torch.equal(m4(x), torch.nn.functional.silu(y[..., :7]) * y[..., 7:])
    m8 = _Fused(Q8, 64, 7, torch.float32, swiglu.SILU)
    x = torch.randn(3, 64)
    y = torch.ops.aten._weight_int8pack_mm(x, m8.w, m8.s)
    want = y[:, :7] * torch.sigmoid(y[:, :7]) * y[:, 7:]
    assert torch.equal(m8(x), want)
    for op, args in ((custom_ops.LINEAR_Q4GSW_SWIGLU, (x, m4.w, m4.s, 32, None)),
                     (custom_ops.WEIGHT_INT8PACK_MM_SWIGLU, (x, m8.w, m8.s))):
        with pytest.raises(Exception, match="not a SwiGLU chain"):
            op.overload()(*args, "aten.relu.default(r0)")


# ---- load-time checks of crafted blobs ------------------------------------------------
def _blob(op, weight_rows=14, bias=None, steps=swiglu.SILU, out_cols=7,
          out_dtype="float32", scale_cols=None):
    """A blob of one fused node: x [1, 32] (int4: [1, 1, 32]), constant weights of
    ``weight_rows`` rows, scales (int4: [1, scale_cols or weight_rows], group size 32;
    int8: [scale_cols or weight_rows]), an int4 bias of ``bias`` elements (or none),
    the output declared [1, out_cols] ([1, 1, out_cols])."""
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    rng = np.random.default_rng(0)
    m = GraphMaker()
    cols = scale_cols or weight_rows
    s = m._add(g.String(steps))
    if op == Q4:
        x = m.input((1, 1, 32))
        w = m.constant(rng.integers(0, 256, (weight_rows, 16), dtype=np.uint8))
        sc = m.constant((rng.random((1, cols)) * 0.1).astype(np.float32))
        b = m.scalar(None) if bias is None else \
            m.constant(rng.standard_normal((bias,)).astype(np.float32))
        args, out_shape = [x, w, sc, m.scalar(32), b, s], (1, 1, out_cols)
    else:
        x = m.input((1, 32))
        w = m.constant(rng.integers(-128, 128, (weight_rows, 32), dtype=np.int8))
        sc = m.constant((rng.random((cols,)) * 0.1).astype(np.float32))
        args, out_shape = [x, w, sc, s], (1, out_cols)
    m.output(m.op(op, args, out_shape, out_dtype))
    return m


@pytest.mark.parametrize("op", [Q4, Q8], ids=["int4", "int8"])
def test_matching_blob_runs(vk_device, op):
    import numpy as np

    from vkdelegate.runtime import load_delegate

    m = _blob(op, bias=14 if op == Q4 else None)
    shape = (1, 1, 32) if op == Q4 else (1, 32)
    x = np.random.default_rng(1).standard_normal(shape, np.float32)
    if op == Q4:
        w = np.frombuffer(m.constants[0], np.uint8).reshape(14, 16).astype(np.int32)
        q = np.stack([w & 15, w >> 4], -1).reshape(14, 32) - 8
        s = np.frombuffer(m.constants[1], np.float32)
        y = x @ (q * s[:, None]).T + np.frombuffer(m.constants[2], np.float32)
    else:
        q = np.frombuffer(m.constants[0], np.int8).reshape(14, 32).astype(np.float32)
        y = (x @ q.T) * np.frombuffer(m.constants[1], np.float32)
    gate, up = y[..., :7], y[..., 7:]
    with load_delegate(m.blob()) as graph:
        got = graph.execute([x])[0]
    np.testing.assert_allclose(got, gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [Q4, Q8], ids=["int4", "int8"])
@pytest.mark.parametrize("kwargs,match", [
    (dict(steps="aten.relu.default(r0);aten.mul.Tensor(r2,r1)"),
     r"steps must be one of the SwiGLU chains"),
    (dict(steps=swiglu.SILU_HALF), r"does not apply to float32 tensors"),
    (dict(weight_rows=13, out_cols=6), r"weight \[13, (16|32)\]: a merged gate/up weight "
                                       r"has an even number of rows"),
    (dict(out_cols=14), r"output must be \[1, (1, )?7\]"),
    (dict(out_cols=8), r"output must be \[1, (1, )?7\]"),
    (dict(scale_cols=7), r"scales"),
])
def test_crafted_blob_is_refused_at_load(vk_device, op, kwargs, match):
    """A blob whose fused op the kernels could not run as the op defines it (a chain of
    its own, a weight with no two halves, scales for half of it, an output of other
    sizes) is refused before anything is built, by the Vulkan loader and the reference
    executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(op, **kwargs).blob()
    for load in (load_delegate, load_reference):
        expected = rf"^node 0 \({op}\): .*" + match
        if load is load_reference and "steps" in kwargs and kwargs["steps"] not in \
                swiglu.CHAINS:
            # The reference executor's allow-list refuses the string first.
            expected = (rf"^node 0 of the delegate passes {op} the string .* as argument "
                        r"'steps', which takes one of")
        with pytest.raises(VkDelegateError, match=expected):
            load(blob)


@pytest.mark.parametrize("bias", [7, 15])
def test_crafted_int4_bias_is_refused_at_load(vk_device, bias):
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(Q4, bias=bias).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=rf"^node 0 \({Q4}\): .*bias must be "
                                                  r"\[14\]"):
            load(blob)


def test_glue_refuses_other_steps():
    """A program file's CPU glue may pass the fused ops only the SwiGLU chains
    (backend/allowed_ops.py's STR_CHOICES)."""
    from vkdelegate.backend.glue_checks import check_arguments

    for declared, args in ((custom_ops.LINEAR_Q4GSW_SWIGLU, [0, 0, 0, 32, None]),
                           (custom_ops.WEIGHT_INT8PACK_MM_SWIGLU, [0, 0, 0])):
        op = declared.overload()
        check_arguments(declared.name, op, args + [swiglu.SILU_HALF], {}, "node 0")
        with pytest.raises(VkDelegateError, match="which takes one of"):
            check_arguments(declared.name, op, args + ["aten.relu.default(r0)"], {},
                            "node 0")
