"""A decode layer's input RMS norm, merged int4 / int8 weight-only q/k/v product,
rotary embedding and K/V cache writes fuse into
``vkdelegate.rms_norm_linear_q4gsw_rotary_cache`` /
``rms_norm_weight_int8pack_mm_rotary_cache`` (passes/fuse_linear_rotary_cache.py;
ops/families/quantized_linear.py, linear_qw_gemv.glsl's ROTARY form, rotary_cache.h).
tests/ops/test_rotary_cache.py's module (HF Llama's attention input of one token)
quantized by torchao (int4 with group sizes 32 and 128, with and without a bias;
int8), fp32 and fp16:

- bit for bit against the unfused pair (compile option fuse_linear_rotary_cache off:
  rms_norm_linear_q4gsw / rms_norm_weight_int8pack_mm, its parts and
  rotary_index_put_pair) on the same form, and eager's values within the quantized
  tolerances, on each form: the vectorized GEMV (linear_qw_gemv.glsl, forced as
  tests/ops/test_quantized_rms_norm.py forces it: ONE dispatch with the ROTARY
  epilogue, where the unfused product reads its scales by SVEC's vector loads), with
  and without subgroup arithmetic, with rms_norm_prologue off (the norm's dispatch
  first); and linear_qw.glsl's GEMM and GEMV forms and a CPU driver's
  linear_qw_texel.glsl (the unfused pair's dispatches);
- positions: first, last and negative (wrapped), int64 and int32; a head dim whose
  half is odd and a last workgroup partly past the units;
- a position ATen rejects sets the node's error flag and writes nothing (the caches
  as program state keep their bits);
- what the pass must leave alone (q | v | k, v read elsewhere, the option off,
  several rows); the CPU kernels are the two ops; crafted blobs refused at load.

Tolerances against eager (torchao's dequantized weights): as
tests/ops/test_quantized_rms_norm.py (fp32 1e-4, fp16 2e-2).
"""
import pytest
import torch

from tests.ops.harness import check_op, delegated_nodes, spy_dispatches
from tests.ops.test_rotary_cache import Attention, _inputs
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.errors import VkDelegateError

pytest.importorskip("torchao")

Q4 = custom_ops.RMS_NORM_LINEAR_Q4GSW_ROTARY_CACHE.name
Q8 = custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM_ROTARY_CACHE.name
DQ = custom_ops.LINEAR_DQ8CA_Q4GSW_ROTARY_CACHE.name
FUSED = {"int4_g32": Q4, "int4_g128": Q4, "int8": Q8, "8da4w": DQ}
PRODUCT = {"int4_g32": custom_ops.RMS_NORM_LINEAR_Q4GSW.name,
           "int4_g128": custom_ops.RMS_NORM_LINEAR_Q4GSW.name,
           "int8": custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM.name,
           "8da4w": custom_ops.LINEAR_DQ8CA_Q4GSW.name}
ROTARY = "vkdelegate.rotary_index_put_pair.default"
OFF = {"fuse_linear_rotary_cache": False}
F16 = dict(rtol=2e-2, atol=2e-2)
SHADERS = ("linear_qw_gemv", "linear_qw_texel", "linear_qw", "norm", "rotary_scatter_pair")
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]
#: (scheme, bias): int4's two group sizes (a bias with one), int8 (no bias: ATen's
#: _weight_int8pack_mm has none).
CASES = [("int4_g32", True), ("int4_g128", False), ("int8", False)]
CASE_IDS = ["int4_g32_bias", "int4_g128", "int8"]


def _tol(dtype):
    return F16 if dtype == torch.float16 else {}


def _skip():
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)


def _force(monkeypatch, form: str) -> list:
    """Make each quantized product take ``form`` (tests/ops/test_quantized_rms_norm.py's
    forms: "vector", "default" (linear_qw.glsl's GEMM), "words" (its GEMV), "texel" (a
    CPU driver's own; skipped elsewhere)). Returns the list of (shader, ROTARY form?,
    SVEC?) of the product and rotary dispatches recorded from now on."""
    from vkdelegate.ops.families import quantized_linear as family
    from vkdelegate.runtime import default_device

    _skip()
    if form == "texel":
        if not default_device().texel_inputs:
            pytest.skip("linear_qw_texel.glsl is the CPU drivers' form")
    else:
        monkeypatch.setattr(family, "texel_form", lambda *args: False)
    if form in ("default", "texel"):
        monkeypatch.setattr(family, "use_gemv", lambda info, m: False)
    else:
        monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    if form == "words":
        monkeypatch.setattr(family, "vector_gemv", lambda *args: False)
    seen = spy_dispatches(monkeypatch, lambda shader, defines: (
        shader, "ROTARY" in defines, "SVEC" in defines))
    return seen


def _products(seen) -> list:
    return [(shader, rotary) for shader, rotary, _ in seen if shader in SHADERS]


def _module(scheme: str, dtype, bias=False, k=None, **kwargs):
    """tests/ops/test_rotary_cache.py's Attention (K = 128, or 256 for groups of 128)
    with its q/k/v projections quantized by ``scheme``."""
    from vkdelegate.backend.quantize import quantize_for_vulkan

    group = 128 if scheme == "int4_g128" else 32
    module = Attention(k=k or max(128, 2 * group), bias=bias, dtype=dtype, **kwargs).eval()
    if scheme == "int8":
        return quantize_for_vulkan(module, "int8")
    return quantize_for_vulkan(module, "8da4w" if scheme == "8da4w" else "int4",
                               group_size=group)


def _lower(module, inputs, options=None):
    return to_backend(torch.export.export(module, inputs), VulkanPartitioner(options))


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


def _bitwise_unfused(module, inputs, scheme, options=None) -> None:
    """The fused program's outputs equal the unfused pair's bit for bit."""
    fused = _lower(module, inputs, options)
    unfused = _lower(module, inputs, dict(options or {}, **OFF))
    assert FUSED[scheme] in _ops(fused) and ROTARY not in _ops(fused), _ops(fused)
    assert FUSED[scheme] not in _ops(unfused), _ops(unfused)
    assert {PRODUCT[scheme], ROTARY} <= set(_ops(unfused)), _ops(unfused)
    for got, want in zip(fused(*inputs), unfused(*inputs)):
        assert got.dtype == want.dtype and torch.equal(got, want), \
            (got.float() - want.float()).abs().max()
    fused.close()
    unfused.close()


# ---- the vectorized GEMV: one dispatch ------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,bias", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
def test_vector_epilogue(monkeypatch, subgroup, scheme, bias, dtype):
    """One linear_qw_gemv.glsl dispatch with the ROTARY epilogue (no SVEC), the unfused
    product's with SVEC then rotary_scatter_pair.glsl: the same bits."""
    from vkdelegate.ops.families import quantized_linear as family
    monkeypatch.setattr(family, "VMIN_GROUPS", 0)  # VROWS whatever N: its runs of scales

    seen = _force(monkeypatch, "vector")
    if not subgroup:
        monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(0)
    module = _module(scheme, dtype, bias)
    inputs = _inputs(module, dtype)
    check_op(module, inputs, ops=[FUSED[scheme]], **_tol(dtype))
    assert _products(seen) == [("linear_qw_gemv", True)], seen
    assert not any(svec for shader, rotary, svec in seen if rotary), seen
    seen.clear()
    _bitwise_unfused(module, inputs, scheme)
    product = [s for s in seen if s[0] == "linear_qw_gemv" and not s[1]]
    assert product and (scheme == "int8" or all(svec for *_, svec in product)), seen


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("pos", [0, 9, -1, -10])
@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
def test_positions(monkeypatch, scheme, pos, index_dtype, dtype):
    """Every position the cache accepts, negative ones wrapped, both index dtypes."""
    _force(monkeypatch, "vector")
    torch.manual_seed(1)
    module = _module(scheme, dtype)
    inputs = _inputs(module, dtype, pos, index_dtype)
    check_op(module, inputs, ops=[FUSED[scheme]], **_tol(dtype))
    _bitwise_unfused(module, inputs, scheme)


@pytest.mark.parametrize("subgroup", [True, False], ids=["subgroup", "shared"])
@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
def test_odd_half_and_partial_workgroup(monkeypatch, scheme, subgroup):
    """D = 6 (D/2 = 3: a head's pairs cross units unevenly), 3 q heads and 1 kv head: N
    = 30 rows in 15 units, the last workgroup's fourth unit past the end."""
    from vkdelegate.ops.families import quantized_linear as family

    seen = _force(monkeypatch, "vector")
    if not subgroup:
        monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(2)
    module = _module(scheme, torch.float32, scheme != "int8", k=64, hq=3, hkv=1, d=6)
    inputs = _inputs(module, torch.float32, 5)
    check_op(module, inputs, ops=[FUSED[scheme]])
    assert _products(seen) == [("linear_qw_gemv", True)], seen
    _bitwise_unfused(module, inputs, scheme)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", ["int4_g128", "int8"])
def test_norm_prologue_off(monkeypatch, scheme, dtype):
    """rms_norm_prologue off: the norm's dispatch, then the GEMV with the epilogue."""
    seen = _force(monkeypatch, "vector")
    torch.manual_seed(3)
    module = _module(scheme, dtype)
    inputs = _inputs(module, dtype)
    options = {"rms_norm_prologue": False}
    check_op(module, inputs, ops=[FUSED[scheme]], options=options, **_tol(dtype))
    assert _products(seen) == [("norm", False), ("linear_qw_gemv", True)], seen
    _bitwise_unfused(module, inputs, scheme, options)


# ---- 8da4w (et_vk.linear_dq8ca_q4gsw: the norm stays before the product) ------------
# Tolerance against eager: the fp16 one for both dtypes (test_quantized_linear's margin
# of one activation at its neighbouring int8 quantum moves an output by x's range / 255
# * max|w|).
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("form,subgroup", [("vector", True), ("vector", False),
                                           ("default", True), ("words", True)],
                         ids=["vector", "vector_shared", "gemm", "words"])
def test_8da4w(monkeypatch, form, subgroup, dtype):
    """The ROTARY epilogue on an 8da4w product (x quantized per row as it is loaded):
    one linear_qw_gemv.glsl dispatch; linear_qw.glsl's forms the unfused pair's; the
    unfused pair's bits and eager's values either way, at a negative position too."""
    from vkdelegate.ops.families import quantized_linear as family

    seen = _force(monkeypatch, form)
    if not subgroup:
        monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(6)
    module = _module("8da4w", dtype, bias=True)
    for pos in (7, -3):
        inputs = _inputs(module, dtype, pos)
        check_op(module, inputs, ops=[DQ], **F16)
        want = [("linear_qw_gemv", True)] if form == "vector" else \
            [("linear_qw", False), ("rotary_scatter_pair", False)]
        assert _products(seen) == want, seen
        seen.clear()
        _bitwise_unfused(module, inputs, "8da4w")
        seen.clear()


# ---- the other forms: the unfused pair's dispatches ----------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme,bias", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("form", ["texel", "default", "words"])
def test_other_forms(monkeypatch, form, scheme, bias, dtype):
    """A CPU driver's linear_qw_texel.glsl (the norm folded in) and linear_qw.glsl's
    GEMM and GEMV forms (the norm's dispatch first): the product into a scratch row,
    then rotary_scatter_pair.glsl; eager's values and the unfused pair's bits."""
    seen = _force(monkeypatch, form)
    torch.manual_seed(4)
    module = _module(scheme, dtype, bias)
    inputs = _inputs(module, dtype, -2, torch.int32)
    check_op(module, inputs, ops=[FUSED[scheme]], **_tol(dtype))
    want = [("linear_qw_texel", False)] if form == "texel" else \
        [("norm", False), ("linear_qw", False)]
    assert _products(seen) == want + [("rotary_scatter_pair", False)], seen
    _bitwise_unfused(module, inputs, scheme)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
def test_default_forms(scheme, dtype):
    """Whatever this device's own form: eager's values and the unfused pair's bits."""
    _skip()
    torch.manual_seed(5)
    module = _module(scheme, dtype, scheme != "int8")
    inputs = _inputs(module, dtype, 7)
    check_op(module, inputs, ops=[FUSED[scheme]], **_tol(dtype))
    _bitwise_unfused(module, inputs, scheme)


# ---- positions ATen rejects -----------------------------------------------------------
@pytest.mark.parametrize("form", ["vector", "texel"])
@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
def test_bad_position_flags_and_writes_nothing(monkeypatch, scheme, form):
    """The caches as program state (index_copy_ into buffers): a position past the
    cache (10 or -11 for 10 rows) raises after the run naming the node, and the caches
    keep every bit; a good step after it writes its row."""
    _force(monkeypatch, form)
    torch.manual_seed(6)
    module = _module(scheme, torch.float32, state=True)
    x, cos, sin, pos = _inputs(module, torch.float32)[:4]
    program = _lower(module, (x, cos, sin, pos))
    assert FUSED[scheme] in _ops(program), _ops(program)
    program(x, cos, sin, torch.tensor([4]))
    before = program.state_dict()
    name = FUSED[scheme].split(".")[1]
    for bad in (10, -11):
        with pytest.raises(VkDelegateError, match=rf"{name}.*out of range"):
            program(x, cos, sin, torch.tensor([bad]))
        after = program.state_dict()
        for cache in ("kc", "vc"):
            assert torch.equal(after[cache], before[cache]), (bad, cache)
    got = program(x, cos, sin, torch.tensor([7]))
    with torch.no_grad():
        module(x, cos, sin, torch.tensor([4]))
        want = module(x, cos, sin, torch.tensor([7]))
    after = program.state_dict()
    assert torch.count_nonzero(after["kc"][:, :, [0, 1, 2, 3, 5, 6, 8, 9]]) == 0
    for cache in ("kc", "vc"):
        torch.testing.assert_close(after[cache], getattr(module, cache), rtol=1e-4,
                                   atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ---- what the pass leaves alone ---------------------------------------------------
@pytest.mark.parametrize("case", ["v_first", "keep_v", "off", "rows"])
@pytest.mark.parametrize("scheme", ["int4_g32", "int8"])
def test_not_fused(scheme, case):
    """q | v | k parts (v_proj first), v read elsewhere, the compile option off, several
    rows (prefill: no merged product): no fused op, eager's values."""
    _skip()
    torch.manual_seed(8)
    module = _module(scheme, torch.float32, v_first=case == "v_first",
                     keep_v=case == "keep_v", t=3 if case == "rows" else 1)
    inputs = _inputs(module, torch.float32)
    program = _lower(module, inputs, OFF if case == "off" else None)
    assert not {Q4, Q8} & set(_ops(program)), _ops(program)
    with torch.no_grad():
        want = module(*inputs)
    for got, w in zip(program(*inputs), want):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-4)
    program.close()


# ---- the CPU kernels --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cpu_kernels_are_the_two_ops(dtype):
    """Each op's CPU kernel: its product's (rms_norm_linear_q4gsw,
    rms_norm_weight_int8pack_mm), then rotary_index_put_pair of its parts."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 1, 32, generator=g).to(dtype)
    nw = (torch.rand(32, generator=g) + 0.5).to(dtype)
    w4 = torch.randint(0, 256, (32, 16), dtype=torch.uint8, generator=g)
    s4 = (torch.rand(1, 32, generator=g) * 0.1).to(dtype)
    w8 = torch.randint(-128, 128, (32, 32), dtype=torch.int8, generator=g)
    s8 = (torch.rand(32, generator=g) * 0.1).to(dtype)
    bias = torch.randn(32, generator=g).to(dtype)
    ang = torch.rand(1, 1, 1, 8, generator=g) * 6
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    kc, vc = (torch.randn(1, 1, 5, 8, generator=g).to(dtype) for _ in range(2))
    idx, q_sizes, kv_sizes = [None, None, torch.tensor([-2])], [1, 2, 1, 8], [1, 1, 1, 8]
    rotary = custom_ops.custom_ops_llm.ROTARY_INDEX_PUT_PAIR.overload()
    for fused, product, args in (
            (custom_ops.RMS_NORM_LINEAR_Q4GSW_ROTARY_CACHE,
             custom_ops.RMS_NORM_LINEAR_Q4GSW, (x, nw, 1e-6, w4, s4, 32, bias)),
            (custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM_ROTARY_CACHE,
             custom_ops.RMS_NORM_WEIGHT_INT8PACK_MM, (x[0], nw, 1e-6, w8, s8))):
        got = fused.overload()(*args, cos, sin, kc, vc, idx, q_sizes, kv_sizes)
        y = product.overload()(*args).reshape(-1)
        want = rotary(y[:16].view(q_sizes), y[16:24].view(kv_sizes), cos, sin, kc, vc, idx,
                      y[24:].view(kv_sizes))
        for a, b in zip(got, want):
            assert torch.equal(a, b), fused.name


# ---- crafted blobs --------------------------------------------------------------------
def _blob(op, weight_rows=32, x_shape=None, q_sizes=(1, 2, 1, 8), cache=(1, 1, 5, 8),
          s_dtype="float32", q_out=None):
    """A blob of one node of ``op``: x [1, 1, 32] (int8: [1, 32]), a constant norm
    weight, weights of ``weight_rows`` rows and scales (``s_dtype``; int4 groups of
    32), no bias; cos/sin [1, 1, 1, 8], the caches and an int64 position as inputs;
    k and v [1, 1, 1, 8]; q' declared of ``q_out`` (default q_sizes)."""
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    rng = np.random.default_rng(0)
    m = GraphMaker()
    x = m.input(x_shape or ((1, 1, 32) if op == Q4 else (1, 32)))
    args = [x, m.constant((rng.random(32) + 0.5).astype(np.float32)), m.scalar(1e-6)]
    if op == Q4:
        args += [m.constant(rng.integers(0, 256, (weight_rows, 16), dtype=np.uint8)),
                 m.constant((rng.random((1, weight_rows)) * 0.1).astype(s_dtype)),
                 m.scalar(32), m.scalar(None)]
    else:
        args += [m.constant(rng.integers(-128, 128, (weight_rows, 32), dtype=np.int8)),
                 m.constant((rng.random((weight_rows,)) * 0.1).astype(s_dtype))]
    c, s = m.input((1, 1, 1, 8)), m.input((1, 1, 1, 8))
    kc, vc = m.input(cache), m.input(cache)
    pos = m.input((1,), "int64")
    none = m.scalar(None)
    lst = m._add(g.ValueList([none, none, pos]))
    outs = [m.tensor(shape) for shape in (q_out or q_sizes, cache, cache)]
    out = m._add(g.ValueList(outs))
    m.graph.chain.append(g.OperatorCall(0, op, args + [
        c, s, kc, vc, lst, m.scalar(list(q_sizes)), m.scalar([1, 1, 1, 8]), out]))
    for o in outs:
        m.output(o)
    return m


@pytest.mark.parametrize("op", [Q4, Q8], ids=["int4", "int8"])
def test_matching_blob_runs(vk_device, op):
    """The blob's outputs are the CPU kernel's (fp32 tolerance: the fused norm)."""
    import numpy as np

    from vkdelegate.runtime import load_delegate

    m = _blob(op)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, 32) if op == Q4 else (1, 32), np.float32)
    ang = rng.random((1, 1, 1, 8), np.float32) * 6
    kc, vc = (rng.standard_normal((1, 1, 5, 8), np.float32) for _ in range(2))
    inputs = [x, np.cos(ang), np.sin(ang), kc, vc, np.array([3])]
    nw = torch.from_numpy(np.frombuffer(m.constants[0], np.float32).copy())
    w = np.frombuffer(m.constants[1], np.uint8 if op == Q4 else np.int8).copy()
    sc = torch.from_numpy(np.frombuffer(m.constants[2], np.float32).copy())
    t = [torch.from_numpy(a) for a in inputs]
    product = (torch.from_numpy(w.reshape(32, 16)), sc.view(1, 32), 32, None) if op == Q4 \
        else (torch.from_numpy(w.reshape(32, 32)), sc)
    want = custom_ops.CUSTOM_OPS[op].overload()(
        t[0], nw, 1e-6, *product, t[1], t[2], t[3], t[4], [None, None, t[5]],
        [1, 2, 1, 8], [1, 1, 1, 8])
    with load_delegate(m.blob()) as graph:
        got = graph.execute(inputs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [Q4, Q8], ids=["int4", "int8"])
@pytest.mark.parametrize("kwargs,match", [
    (dict(weight_rows=48), r"do not split the 48 rows of the weight"),
    (dict(x_shape=(2, 32)), r"one row \[1, \.\., 1, K\] expected|rank"),
    (dict(q_sizes=(1, 2, 1, 0)), r"must be sizes of rank 1-4"),
    (dict(cache=(1, 2, 5, 8)), r"values"),
    (dict(q_out=(1, 4, 1, 4)), r"output|sizes"),
    (dict(s_dtype="float16"), r"scales float16|one dtype"),
])
def test_crafted_blob_is_refused_at_load(vk_device, op, kwargs, match):
    """Sizes the kernels would index past, a weight the sizes do not split, a mixed
    dtype: refused before anything is built, by the Vulkan loader and the reference
    executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(op, **kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=rf"^node 0 \({op}\): .*" + f"({match})"):
            load(blob)
