"""``vkdelegate.linear_swiglu`` (kernels/swiglu.py; made by
passes/fuse_linear_swiglu.py) against its CPU kernel, the definition: a merged gate/up
linear (weight [2F, K], bias [2F]?) and the SwiGLU chain over its halves. fp32 (the
float32 chain) and fp16 (the cast chain HF float16 models export, and the float32
chain on float16 tensors: every step rounded), bias and none, one row and several, K
not a multiple of 4 or 8 and F odd (a partial tile / workgroup). On the form a CPU
driver takes (linear.glsl's SWIGLU epilogue, the weight's halves packed apart) and
the GPU forms forced as tests/ops/test_gemm_core.py does (gemv.glsl's SWIGLU epilogue
for one row, its scalar, vec4 and uvec4-of-8 loads; linear.glsl's for several rows).
Crafted blobs (another chain, an odd or mismatched weight, a bias of another size)
are refused at load by the Vulkan loader and the reference executor alike.

Tolerances: fp32 as the linear tests (1e-4); fp16 as the fp16 linear tests (1e-2):
the device's summation order differs from the CPU's, and the chain then rounds the
same values. Bit equality with the unfused program is
tests/backend/test_fuse_linear_swiglu.py's.
"""
import dataclasses

import pytest
import torch

from tests.ops.harness import check_op, delegated_nodes
from vkdelegate.backend import custom_ops
from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import swiglu

FUSED = custom_ops.LINEAR_SWIGLU.name
F16 = dict(rtol=1e-2, atol=1e-2)
CASES = [(torch.float32, swiglu.SILU), (torch.float16, swiglu.SILU_HALF),
         (torch.float16, swiglu.SILU)]
IDS = ["fp32", "fp16_casts", "fp16_rounded_steps"]


class _LinearSwiglu(torch.nn.Module):
    """linear_swiglu(x, weight [2F, K], bias?, steps) on parameters."""

    def __init__(self, k, f, steps, bias=True, dtype=torch.float32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(2 * f, k, dtype=dtype) / k ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(2 * f, dtype=dtype)) if bias else None
        self.steps = steps

    def forward(self, x):
        return custom_ops.LINEAR_SWIGLU.overload()(x, self.weight, self.bias, self.steps)


def _tol(dtype):
    return F16 if dtype == torch.float16 else {}


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


@pytest.fixture
def forms(monkeypatch):
    """The GEMM forms recorded (gemm.record_core's) and the linear.glsl dispatches."""
    from vkdelegate.kernels import gemm

    seen = []
    record_core = gemm.record_core

    def core(b, form, *args, **kwargs):
        seen.append(form.shader)
        return record_core(b, form, *args, **kwargs)

    monkeypatch.setattr(gemm, "record_core", core)
    return seen


@pytest.fixture
def gpu_forms(monkeypatch, forms):
    """Every device type gets the tile table's GPU row (the GEMV path for one row)
    without its cooperative-matrix form, as on the H200."""
    from vkdelegate.kernels import gemm, gemm_tiles

    portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
    monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    return forms


@pytest.mark.parametrize("dtype,steps", CASES, ids=IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("rows", [1, 5])
def test_default_form(forms, dtype, steps, bias, rows):
    # A CPU driver: linear.glsl's SWIGLU epilogue (1 x 4 tiles for one row, 4 x 4 for
    # five); K = 37, F = 13: a partial column tile of each half.
    torch.manual_seed(0)
    module = _LinearSwiglu(37, 13, steps, bias, dtype)
    x = torch.randn(1, rows, 37).to(dtype)
    program = check_op(module, (x,), ops=[FUSED], **_tol(dtype))
    assert _ops(program) == [FUSED]


@pytest.mark.parametrize("dtype,steps", CASES, ids=IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("k", [37, 52, 64], ids=["scalar", "vec4", "vec8"])
def test_gemv_epilogue(gpu_forms, dtype, steps, bias, k):
    # One row: gemv.glsl's SWIGLU form, scalar loads (K = 37), vec4 (52) and for fp16
    # stored as 16 bits uvec4s of 8 (64); F = 13 leaves a partial workgroup.
    torch.manual_seed(0)
    module = _LinearSwiglu(k, 13, steps, bias, dtype)
    program = check_op(module, (torch.randn(1, 1, k).to(dtype),), ops=[FUSED],
                       **_tol(dtype))
    assert _ops(program) == [FUSED]
    assert gpu_forms == ["gemv"]


def test_gemv_without_subgroups(gpu_forms, monkeypatch):
    from vkdelegate.kernels import gemm_core

    monkeypatch.setattr(gemm_core, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(0)
    check_op(_LinearSwiglu(64, 7, swiglu.SILU), (torch.randn(1, 64),), ops=[FUSED])
    assert gpu_forms == ["gemv"]


@pytest.mark.parametrize("dtype,steps", CASES, ids=IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_several_rows_on_gpus(gpu_forms, dtype, steps, bias):
    # Several rows on a GPU (a prefill's merged gate/up, passes/merge_linears): the
    # GEMM core's product into a scratch [..., 2F], its halves copied apart, then the
    # chain (the unfused program's dispatches, so that the product keeps the core's
    # speed); the scratch tensors follow a dynamic row count.
    torch.manual_seed(0)
    module = _LinearSwiglu(37, 13, steps, bias, dtype)
    rows = torch.export.Dim("rows", min=2, max=9)
    check_op(module, (torch.randn(2, 5, 37).to(dtype),), ops=[FUSED],
             dynamic_shapes=({1: rows},), resize_inputs=[(torch.randn(2, 3, 37).to(dtype),),
                                                         (torch.randn(2, 9, 37).to(dtype),)],
             **_tol(dtype))
    assert gpu_forms == ["gemm"]  # gemm_core.CORE_SHADER


def test_norm_several_rows_on_gpus(gpu_forms):
    # The norm's dispatch, then the same as test_several_rows_on_gpus.
    torch.manual_seed(0)
    module = _RmsLinearSwiglu(37, 13, swiglu.SILU_HALF, True, torch.float16)
    check_op(module, (torch.randn(1, 6, 37).half(),), ops=[NORM_FUSED], **F16)
    assert gpu_forms == ["gemm"]  # gemm_core.CORE_SHADER


def test_computed_weight_read_in_place():
    # A weight computed on the device (not a constant): linear.glsl's B_NK form.
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(14, 9))

        def forward(self, x):
            return custom_ops.LINEAR_SWIGLU.overload()(x, self.w * 2.0, None, swiglu.SILU)

    torch.manual_seed(0)
    check_op(M(), (torch.randn(3, 9),), ops=[FUSED])


def test_cpu_kernel_is_the_linear_then_the_chain():
    torch.manual_seed(0)
    x, w, b = (torch.randn(*s).half() for s in ((3, 40), (14, 40), (14,)))
    got = custom_ops.LINEAR_SWIGLU.overload()(x, w, b, swiglu.SILU_HALF)
    y = torch.nn.functional.linear(x, w, b)
    assert torch.equal(got, torch.nn.functional.silu(y[:, :7]) * y[:, 7:])
    with pytest.raises(Exception, match="not a SwiGLU chain"):
        custom_ops.LINEAR_SWIGLU.overload()(x, w, b, "aten.relu.default(r0)")


def test_match_accepts_only_the_swiglu_chains():
    silu = swiglu.SILU
    assert swiglu.match(silu, [], "float32", True) == silu
    # Operands of a product in the other order, the inputs the other way round.
    other = "aten.sigmoid.default(r1);aten.mul.Tensor(r2,r1);aten.mul.Tensor(r0,r3)"
    assert swiglu.match(other, [], "float32", False) == silu
    assert swiglu.match(silu, [], "float32", False) is None   # SiLU of the up half
    assert swiglu.match(silu, [1.0], "float32", True) is None  # scalars
    assert swiglu.match(swiglu.SILU_HALF, [], "float16", True) == swiglu.SILU_HALF
    assert swiglu.match(swiglu.SILU_HALF, [], "float32", True) is None
    # No cast back: a float32 result; a GeGLU; silu(gate) * gate.
    for text in (swiglu.SILU_HALF.rsplit(";", 2)[0] + ";aten.mul.Tensor(r4,r2)",
                 "aten.gelu.default(r0,'none');aten.mul.Tensor(r2,r1)",
                 "aten.sigmoid.default(r0);aten.mul.Tensor(r0,r2);aten.mul.Tensor(r3,r0)"):
        assert swiglu.match(text, [], "float16", True) is None, text
    # match_roles: torchao's int8 linear leaves the gate read twice (through a view and
    # directly; passes/fuse_linear_swiglu resolves both to the first half).
    three = "aten.sigmoid.default(r0);aten.mul.Tensor(r1,r3);aten.mul.Tensor(r4,r2)"
    assert swiglu.match_roles(three, [], "float32", ("gate", "gate", "up")) == silu
    assert swiglu.match_roles(three, [], "float32", ("gate", "up", "up")) is None
    assert swiglu.match_roles(silu, [], "float32", ("gate", "gate")) is None


# ---- load-time checks of crafted blobs ------------------------------------------------
def _blob(weight_rows=14, bias=None, steps=swiglu.SILU, out_cols=7, out_dtype="float32"):
    """A blob of one linear_swiglu node: x [1, 1, 8], a constant weight
    [weight_rows, 8], a bias constant of ``bias`` elements (or none), the output
    declared [1, 1, out_cols]."""
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    rng = np.random.default_rng(0)
    m = GraphMaker()
    x = m.input((1, 1, 8))
    w = m.constant(rng.standard_normal((weight_rows, 8)).astype(np.float32))
    b = m.scalar(None) if bias is None else \
        m.constant(rng.standard_normal((bias,)).astype(np.float32))
    s = m._add(g.String(steps))
    m.output(m.op(FUSED, [x, w, b, s], (1, 1, out_cols), out_dtype))
    return m


def test_matching_blob_runs(vk_device):
    import numpy as np

    from vkdelegate.runtime import load_delegate

    m = _blob(bias=14)
    x = np.random.default_rng(1).standard_normal((1, 1, 8), np.float32)
    w = np.frombuffer(m.constants[0], np.float32).reshape(14, 8)
    b = np.frombuffer(m.constants[1], np.float32)
    y = x @ w.T + b
    gate, up = y[..., :7], y[..., 7:]
    with load_delegate(m.blob()) as graph:
        got = graph.execute([x])[0]
    np.testing.assert_allclose(got, gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(steps="aten.relu.default(r0);aten.mul.Tensor(r2,r1)"),
     r"steps must be one of the SwiGLU chains"),
    (dict(steps=swiglu.SILU_HALF), r"does not apply to float32 tensors"),
    (dict(weight_rows=13, out_cols=6), r"weight \[13, 8\]: a merged gate/up weight has an "
                                       r"even number of rows"),
    (dict(out_cols=14), r"output must be \[1, 1, 7\]"),
    (dict(bias=7), r"bias must be \[14\]"),
])
def test_crafted_blob_is_refused_at_load(vk_device, kwargs, match):
    """A blob whose linear_swiglu the kernels could not run as the op defines it (a
    chain of its own, a weight with no two halves, an output or bias of other sizes)
    is refused before anything is built, by the Vulkan loader and the reference
    executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        expected = r"^node 0 \(vkdelegate.linear_swiglu.default\): .*" + match
        if load is load_reference and "steps" in kwargs and kwargs["steps"] not in \
                swiglu.CHAINS:
            # The reference executor's allow-list refuses the string first.
            expected = (r"^node 0 of the delegate passes vkdelegate.linear_swiglu.default "
                        r"the string .* as argument 'steps', which takes one of")
        with pytest.raises(VkDelegateError, match=expected):
            load(blob)


def test_glue_refuses_other_steps():
    """A program file's CPU glue may pass linear_swiglu only the SwiGLU chains
    (backend/allowed_ops.py's STR_CHOICES)."""
    from vkdelegate.backend.glue_checks import check_arguments

    op = custom_ops.LINEAR_SWIGLU.overload()
    check_arguments(FUSED, op, [0, 0, None, swiglu.SILU], {}, "node 0")
    with pytest.raises(VkDelegateError, match="which takes one of"):
        check_arguments(FUSED, op, [0, 0, None, "aten.relu.default(r0)"], {}, "node 0")


# ---- vkdelegate.rms_norm_linear_swiglu: the RMS norm, the merged GEMV and the chain ----
NORM_FUSED = custom_ops.RMS_NORM_LINEAR_SWIGLU.name


class _RmsLinearSwiglu(_LinearSwiglu):
    """rms_norm_linear_swiglu(x, norm_weight [K], 1e-6, weight [2F, K], bias?, steps)
    on parameters (norm weights in 0.5..1.5, as tests/ops/test_rms_norm_linear.py's)."""

    def __init__(self, k, f, steps, bias=True, dtype=torch.float32):
        super().__init__(k, f, steps, bias, dtype)
        self.norm_weight = torch.nn.Parameter((torch.rand(k) + 0.5).to(dtype))

    def forward(self, x):
        return custom_ops.RMS_NORM_LINEAR_SWIGLU.overload()(
            x, self.norm_weight, 1e-6, self.weight, self.bias, self.steps)


@pytest.mark.parametrize("dtype,steps", CASES, ids=IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("k", [37, 52, 64], ids=["scalar", "vec4", "vec8"])
def test_norm_gemv_epilogue(gpu_forms, dtype, steps, bias, k):
    # One row: gemv.glsl's RMS_NORM and SWIGLU together, one dispatch; against the CPU
    # kernel (the norm rounded to x's dtype, the linear, the chain): tolerances as
    # tests/ops/test_rms_norm_linear.py's (the fused GEMV never rounds the normalized
    # row) and the module docstring's.
    torch.manual_seed(0)
    module = _RmsLinearSwiglu(k, 13, steps, bias, dtype)
    program = check_op(module, (torch.randn(1, 1, k).to(dtype) * 3,), ops=[NORM_FUSED],
                       **_tol(dtype))
    assert _ops(program) == [NORM_FUSED]
    assert gpu_forms == ["gemv"]


def test_norm_gemv_without_subgroups(gpu_forms, monkeypatch):
    from vkdelegate.kernels import gemm_core

    monkeypatch.setattr(gemm_core, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(0)
    for k in (64, 300):  # 300: more than the 128 invocations' first stride
        check_op(_RmsLinearSwiglu(k, 7, swiglu.SILU), (torch.randn(1, k),),
                 ops=[NORM_FUSED])
    assert gpu_forms == ["gemv", "gemv"]


@pytest.mark.parametrize("rows", [1, 5])
def test_norm_default_form_and_several_rows(forms, rows):
    # A CPU driver (and several rows anywhere): the norm's dispatch, then linear.glsl's
    # SWIGLU epilogue.
    torch.manual_seed(0)
    module = _RmsLinearSwiglu(37, 13, swiglu.SILU_HALF, True, torch.float16)
    check_op(module, (torch.randn(1, rows, 37).half(),), ops=[NORM_FUSED], **F16)


def test_norm_cpu_kernel_is_the_norm_then_linear_swiglu():
    torch.manual_seed(0)
    x, nw, w, b = (torch.randn(*s).half() for s in ((3, 40), (40,), (14, 40), (14,)))
    got = custom_ops.RMS_NORM_LINEAR_SWIGLU.overload()(x, nw, 1e-5, w, b, swiglu.SILU_HALF)
    y = custom_ops.RMS_NORM.overload()(x, nw, 1e-5)
    want = custom_ops.LINEAR_SWIGLU.overload()(y, w, b, swiglu.SILU_HALF)
    assert torch.equal(got, want)


def _norm_blob(norm_elems=8, weight_rows=14, steps=swiglu.SILU, out_cols=7):
    """A blob of one rms_norm_linear_swiglu node: x [1, 1, 8], constant norm weight
    [norm_elems] and weight [weight_rows, 8], no bias, the output [1, 1, out_cols]."""
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    rng = np.random.default_rng(0)
    m = GraphMaker()
    x = m.input((1, 1, 8))
    nw = m.constant((rng.random(norm_elems) + 0.5).astype(np.float32))
    w = m.constant(rng.standard_normal((weight_rows, 8)).astype(np.float32))
    s = m._add(g.String(steps))
    m.output(m.op(NORM_FUSED, [x, nw, m.scalar(1e-6), w, m.scalar(None), s],
                  (1, 1, out_cols)))
    return m


def test_norm_matching_blob_runs(vk_device):
    import numpy as np

    from vkdelegate.runtime import load_delegate

    m = _norm_blob()
    x = np.random.default_rng(1).standard_normal((1, 1, 8), np.float32)
    nw = np.frombuffer(m.constants[0], np.float32)
    w = np.frombuffer(m.constants[1], np.float32).reshape(14, 8)
    y = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * nw
    y = y @ w.T
    gate, up = y[..., :7], y[..., 7:]
    with load_delegate(m.blob()) as graph:
        got = graph.execute([x])[0]
    np.testing.assert_allclose(got, gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(norm_elems=9), r"norm_weight of sizes \[9\] for an input of sizes \[1, 1, 8\]"),
    (dict(weight_rows=13, out_cols=6), r"weight \[13, 8\]: a merged gate/up weight has an "
                                       r"even number of rows"),
    (dict(out_cols=14), r"output must be \[1, 1, 7\]"),
    (dict(steps=swiglu.SILU_HALF), r"does not apply to float32 tensors"),
])
def test_norm_crafted_blob_is_refused_at_load(vk_device, kwargs, match):
    """A crafted rms_norm_linear_swiglu (a norm weight or weight the kernels would read
    past, an output of other sizes, a chain for another dtype) is refused before
    anything is built, by the Vulkan loader and the reference executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _norm_blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError,
                           match=r"^node 0 \(vkdelegate.rms_norm_linear_swiglu.default\): .*"
                                 + match):
            load(blob)
