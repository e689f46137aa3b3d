"""A residual ``aten.add.Tensor`` after a linear fuses into ``vkdelegate.linear_add``
(``vkdelegate.linear_q4gsw_add`` for torchao's int4 weight-only linear,
``vkdelegate.weight_int8pack_mm_add`` for its int8 one,
``vkdelegate.linear_dq8ca_q4gsw_add`` for 8da4w; passes/fuse_linear_add.py), against
eager: fp32 and fp16, bias and none, one row and several, either operand order, rank 2
and 3, dynamic rows; on the form a CPU driver takes (linear.glsl, the add in its
epilogue), the GPU forms forced here as tests/ops/test_gemm_core.py does (gemv.glsl's
epilogue for one row; the GEMM core and split-K then an in-place add for several) and
the quantized forms (the add in the epilogue of linear_qw_gemv.glsl, a CPU driver's
linear_qw_texel.glsl and linear_qw.glsl). The add is gone from the delegate; adds the
pass must leave alone (alpha != 1, broadcasting, type promotion, a linear read twice)
stay; the CPU kernel (reference executor) agrees.

Tolerances: fp32 as the linear tests (1e-4). fp16: eager rounds the linear's output
to fp16 and then rounds the add; the fused epilogue adds in fp32 and rounds once. The
two differ by at most one fp16 rounding of the linear's output (2^-11 of it) on top of
the summation-order difference the fp16 linear tests allow (about one fp16 step of
the output): inside their rtol = atol = 1e-2 for outputs of magnitude ~1-10.
int4 and int8: tests/ops/test_quantized_gemv.py's (2e-5 fp32, 1e-2 fp16).
"""
import dataclasses

import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op, delegated_nodes
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops

FUSED = custom_ops.LINEAR_ADD.name
Q4_FUSED = custom_ops.LINEAR_Q4GSW_ADD.name
ADD, LINEAR = "aten.add.Tensor", "aten.linear.default"
F16 = dict(rtol=1e-2, atol=1e-2)


def _tol(dtype):
    return F16 if dtype == torch.float16 else {}


class _Residual(torch.nn.Module):
    """linear(x) + r (or r + linear(x) with ``swap``)."""

    def __init__(self, k, n, bias=True, swap=False):
        super().__init__()
        self.linear, self.swap = torch.nn.Linear(k, n, bias=bias), swap

    def forward(self, x, r):
        y = self.linear(x)
        return r + y if self.swap else y + r


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


def _inputs(rows, k, n, dtype, rank=3):
    lead = (1, rows) if rank == 3 else (rows,)
    return torch.randn(*lead, k).to(dtype), torch.randn(*lead, n).to(dtype)


@pytest.fixture
def spied(monkeypatch):
    """Counts of the separate add (the fallback) and the GEMM forms recorded."""
    from vkdelegate.kernels import gemm
    from vkdelegate.kernels import residual

    seen = {"adds": 0, "forms": []}
    record_add, record_core = residual.record_add, gemm.record_core

    def add(*args):
        seen["adds"] += 1
        return record_add(*args)

    def core(b, form, *args, **kwargs):
        seen["forms"].append(form.shader)
        return record_core(b, form, *args, **kwargs)

    monkeypatch.setattr(residual, "record_add", add)
    monkeypatch.setattr(gemm, "record_core", core)
    return seen


@pytest.fixture
def gpu_forms(monkeypatch, spied):
    """Every device type gets the tile table's GPU row (the GEMV path for one row, the
    GEMM core for more) without its cooperative-matrix form, as on the H200."""
    from vkdelegate.kernels import gemm, gemm_tiles

    portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
    monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    return spied


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("rows", [1, 5])
def test_default_form_adds_in_the_epilogue(spied, dtype, bias, rows):
    # A CPU driver: linear.glsl (1 x 4 tiles for one row, 4 x 4 for five), one dispatch.
    torch.manual_seed(0)
    module = _Residual(37, 29, bias=bias, swap=rows == 5).to(dtype)
    program = check_op(module, _inputs(rows, 37, 29, dtype), ops=[FUSED], **_tol(dtype))
    assert _ops(program) == [FUSED]
    # CPU drivers: linear.glsl, no core form and no separate add; GPUs: the GEMV path
    # for one row, the GEMM core (then the add) for five.
    assert spied["adds"] == sum(form != "gemv" for form in spied["forms"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("k", [37, 52, 64], ids=["scalar", "vec4", "vec8"])
def test_gemv_adds_in_the_epilogue(gpu_forms, dtype, bias, k):
    # One row: gemv.glsl's [N, K] form, scalar loads (K = 37), vec4 (52) and for fp16
    # stored as 16 bits uvec4s of 8 (64); N = 29 leaves a partial workgroup.
    torch.manual_seed(0)
    module = _Residual(k, 29, bias=bias).to(dtype)
    program = check_op(module, _inputs(1, k, 29, dtype), ops=[FUSED], **_tol(dtype))
    assert _ops(program) == [FUSED]
    assert gpu_forms == {"adds": 0, "forms": ["gemv"]}


def test_gemv_without_subgroups(gpu_forms, monkeypatch):
    from vkdelegate.kernels import gemm_core

    monkeypatch.setattr(gemm_core, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(0)
    check_op(_Residual(64, 13, swap=True), _inputs(1, 64, 13, torch.float32), ops=[FUSED])
    assert gpu_forms == {"adds": 0, "forms": ["gemv"]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_gemm_core_then_the_add(gpu_forms, dtype, bias):
    # Several rows (prefill): the GEMM core writes the output, then the add runs on it
    # in place; K = 2048 with few blocks also takes split-K (core + reduce).
    torch.manual_seed(0)
    for rows, k in ((7, 37), (3, 2048)):
        module = _Residual(k, 29, bias=bias).to(dtype)
        check_op(module, _inputs(rows, k, 29, dtype), ops=[FUSED], **_tol(dtype))
    assert gpu_forms == {"adds": 2, "forms": ["gemm", "gemm"]}


@pytest.mark.parametrize("gpu", [False, True], ids=["default", "gpu_forms"])
def test_dynamic_rows(monkeypatch, spied, gpu):
    """Prefill's [1, T, K] with T dynamic: the epilogue (linear.glsl) or the in-place
    add after the core follow each resize."""
    if gpu:
        from vkdelegate.kernels import gemm, gemm_tiles

        portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
        monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    torch.manual_seed(0)
    t = Dim("t", min=2, max=16)
    check_op(_Residual(24, 20), _inputs(9, 24, 20, torch.float32), ops=[FUSED],
             dynamic_shapes=({1: t}, {1: t}),
             resize_inputs=[_inputs(2, 24, 20, torch.float32),
                            _inputs(16, 24, 20, torch.float32)])


def test_rank2_and_a_computed_residual():
    # The residual is itself computed on the device (the hidden state of a layer).
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(12, 12), torch.nn.Linear(12, 12)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return h + self.b(h)

    torch.manual_seed(0)
    program = check_op(M(), (torch.randn(3, 12),), ops=[FUSED])
    assert ADD not in _ops(program) and LINEAR in _ops(program)


def test_reference_executor_runs_the_fusion():
    torch.manual_seed(0)
    module = _Residual(16, 8).eval()
    x, r = _inputs(1, 16, 8, torch.float32)
    program = to_backend(torch.export.export(module, (x, r)),
                         VulkanPartitioner({"executor": "reference"}))
    assert FUSED in {d.op for d in program.report.decisions}
    torch.testing.assert_close(program(x, r), module(x, r), rtol=1e-5, atol=1e-5)


def test_cpu_kernel_rounds_as_eager():
    """The op's CPU kernel is eager's two ops: linear rounded to fp16, then the add."""
    torch.manual_seed(0)
    x, w, b, r = (torch.randn(*s).half() for s in ((3, 40), (7, 40), (7,), (3, 7)))
    got = custom_ops.LINEAR_ADD.overload()(x, w, b, r)
    assert torch.equal(got, torch.nn.functional.linear(x, w, b) + r)


class _NotFusable(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.linear, self.kind = torch.nn.Linear(8, 8), kind

    def forward(self, x):
        y = self.linear(x)
        if self.kind == "alpha":
            return torch.add(y, x, alpha=2)
        if self.kind == "broadcast":
            return y + x[:, :1]
        return y + x, y * 2  # "read_twice": the linear has a second reader


@pytest.mark.parametrize("kind", ["alpha", "broadcast", "read_twice"])
def test_adds_that_are_not_fused(kind):
    torch.manual_seed(0)
    program = check_op(_NotFusable(kind), (torch.randn(3, 8),), ops=[ADD, LINEAR])
    assert FUSED not in _ops(program)


def test_promoting_add_is_not_fused():
    # fp16 linear + fp32 residual: eager promotes to fp32, which the fused op does not.
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 6).half()

        def forward(self, x, r):
            return self.linear(x) + r

    torch.manual_seed(0)
    program = check_op(M(), (torch.randn(2, 8).half(), torch.randn(2, 6)),
                       ops=[LINEAR], **F16)
    assert FUSED not in _ops(program)


# ---- int4 (et_vk.linear_q4gsw) --------------------------------------------------------
@pytest.fixture
def q4_family(monkeypatch, spied):
    """The quantized-linear family with its GEMV forms on every device (a CPU driver
    gets the GEMM form by default)."""
    from vkdelegate.ops.families import quantized_linear as family

    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    return spied


def _q4_model(k, n, dtype, bias=True):
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    return quantize_for_vulkan(_Residual(k, n, bias=bias).to(dtype).eval(), "int4",
                               group_size=32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_int4_gemv_adds_in_the_epilogue(q4_family, dtype, bias):
    pytest.importorskip("torchao")
    # K = 4608: 144 blocks of 32 (a full sweep and a partial one); N = 13 leaves a
    # partial workgroup of VROWS; one and three rows (both GEMV rows).
    model = _q4_model(4608, 13, dtype, bias)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    for rows in (1, 3):
        program = check_op(model, _inputs(rows, 4608, 13, dtype), ops=[Q4_FUSED],
                           rtol=tol, atol=tol)
        assert _ops(program) == [Q4_FUSED]
    assert q4_family["adds"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("texel", [False, True], ids=["gemm", "default"])
def test_int4_gemm_form_adds_in_the_epilogue(monkeypatch, spied, dtype, texel):
    pytest.importorskip("torchao")
    # linear_qw.glsl's GEMM form (5 rows, every device; forced on CPU drivers) and a CPU
    # driver's own texel form: the residual in the epilogue, no add dispatch.
    from vkdelegate.ops.families import quantized_linear as family

    if not texel:
        monkeypatch.setattr(family, "texel_form", lambda *args: False)
    model = _q4_model(64, 13, dtype)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    program = check_op(model, _inputs(5, 64, 13, dtype), ops=[Q4_FUSED], rtol=tol,
                       atol=tol)
    assert _ops(program) == [Q4_FUSED]
    assert spied["adds"] == 0


# ---- 8da4w (et_vk.linear_dq8ca_q4gsw) -------------------------------------------------
DQ_FUSED = custom_ops.LINEAR_DQ8CA_Q4GSW_ADD.name
QPARAMS = custom_ops.CHOOSE_QPARAMS_PER_TOKEN.name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rows,gemv", [(1, True), (3, True), (5, False)],
                         ids=["gemv", "gemv3", "gemm"])
def test_8da4w_adds_in_the_epilogue(monkeypatch, spied, dtype, rows, gemv):
    """8da4w's linear + residual: in linear_qw_gemv.glsl's epilogue for GEMV rows
    (forced on CPU drivers), in linear_qw.glsl's GEMM form's for more. Tolerances:
    test_quantized_linear's 8da4w ones (with its one activation quantum of margin:
    x's range / 255 * max|w|)."""
    pytest.importorskip("torchao")
    from tests.ops.test_quantized_linear import _one_quantum
    from vkdelegate.backend.quantize import quantize_for_vulkan
    from vkdelegate.ops.families import quantized_linear as family

    monkeypatch.setattr(family, "use_gemv", lambda info, m: gemv and m <= family.GEMV_ROWS)
    torch.manual_seed(0)
    module = _Residual(2080, 13, bias=True).to(dtype).eval()
    model = quantize_for_vulkan(module, "8da4w", group_size=32)
    x, r = _inputs(rows, 2080, 13, dtype)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    quantum = _one_quantum(torch.nn.Sequential(model.linear), x.float())
    program = check_op(model, (x, r), ops=[DQ_FUSED], rtol=tol, atol=tol + quantum)
    ops = _ops(program)
    assert ops.count(DQ_FUSED) == 1 and ops.count(QPARAMS) == 1 and ADD not in ops, ops
    assert spied["adds"] == 0


# ---- load-time checks of crafted blobs ------------------------------------------------
def _blob(residual_shape, residual_dtype="float32", out_shape=(1, 1, 6)):
    """A blob of one linear_add node: x [1, 1, 8], a constant weight [6, 8], no bias,
    a residual input of ``residual_shape``, the output declared ``out_shape``."""
    import numpy as np

    from tests.runtime.graphs import GraphMaker

    m = GraphMaker()
    x = m.input((1, 1, 8))
    r = m.input(residual_shape, residual_dtype)
    w = m.constant(np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    m.output(m.op(FUSED, [x, w, m.scalar(None), r], out_shape))
    return m


def test_matching_blob_runs(vk_device):
    import numpy as np

    from vkdelegate.runtime import load_delegate

    m = _blob((1, 1, 6))
    rng = np.random.default_rng(1)
    x, r = rng.standard_normal((1, 1, 8), np.float32), rng.standard_normal((1, 1, 6),
                                                                           np.float32)
    w = np.frombuffer(m.constants[0], np.float32).reshape(6, 8)
    with load_delegate(m.blob()) as graph:
        got = graph.execute([x, r])[0]
    np.testing.assert_allclose(got, x @ w.T + r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,dtype,match", [
    ((1, 1, 5), "float32", r"residual \[1, 1, 5\] float32 for an output \[1, 1, 6\] "
                           r"float32: the residual must have the output's sizes and dtype"),
    ((1, 6), "float32", r"residual \[1, 6\] float32 for an output \[1, 1, 6\] float32"),
    ((1, 1, 6), "float16", r"residual \[1, 1, 6\] float16 for an output \[1, 1, 6\] "
                           r"float32"),
])
def test_mismatched_residual_is_refused_at_load(vk_device, shape, dtype, match):
    """A blob whose residual is not of the output's sizes and dtype (a broadcast
    the kernels would read past, a narrower type) is refused before anything is built,
    by the Vulkan loader and the reference executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    blob = _blob(shape, dtype).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError,
                           match=r"^node 0 \(vkdelegate.linear_add.default\): .*" + match):
            load(blob)


def test_q4_mismatched_residual_is_refused_at_load(vk_device):
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    m = GraphMaker()
    x, r = m.input((1, 32)), m.input((2, 13))
    w = m.constant(np.zeros((13, 16), np.uint8))
    s = m.constant(np.ones((1, 13), np.float32))
    m.output(m.op(Q4_FUSED, [x, w, s, m.scalar(32), m.scalar(None), r], (1, 13)))
    with pytest.raises(VkDelegateError, match=r"^node 0 \(vkdelegate.linear_q4gsw_add"
                                              r".default\): residual \[2, 13\] float32 "
                                              r"for an output \[1, 13\] float32"):
        load_delegate(m.blob())


# ---- int8 (aten._weight_int8pack_mm) --------------------------------------------------
Q8_FUSED = custom_ops.WEIGHT_INT8PACK_MM_ADD.name


def _q8_model(k, n, dtype):
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    return quantize_for_vulkan(_Residual(k, n, bias=False).to(dtype).eval(), "int8")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rank", [2, 3])
def test_int8_gemv_adds_in_the_epilogue(q4_family, dtype, rank):
    """torchao's int8 weight-only linear (a 2-D view of x, _weight_int8pack_mm, the
    view back) and its residual add: one weight_int8pack_mm_add, the add in
    linear_qw_gemv.glsl's epilogue (K = 4096: 16-byte weight blocks; N = 13 a partial
    workgroup)."""
    pytest.importorskip("torchao")
    model = _q8_model(4096, 13, dtype)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    program = check_op(model, _inputs(1, 4096, 13, dtype, rank), ops=[Q8_FUSED], rtol=tol,
                       atol=tol)
    assert ADD not in _ops(program) and "aten._weight_int8pack_mm.default" not in \
        _ops(program), _ops(program)
    assert q4_family["adds"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("texel", [False, True], ids=["gemm", "default"])
def test_int8_gemm_form_adds_in_the_epilogue(monkeypatch, spied, dtype, texel):
    pytest.importorskip("torchao")
    # Several rows (linear_qw.glsl's GEMM form on every device; forced on CPU drivers)
    # and a CPU driver's texel form: the residual in the epilogue, no add dispatch.
    from vkdelegate.ops.families import quantized_linear as family

    if not texel:
        monkeypatch.setattr(family, "texel_form", lambda *args: False)
    model = _q8_model(64, 13, dtype)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    program = check_op(model, _inputs(5, 64, 13, dtype), ops=[Q8_FUSED], rtol=tol,
                       atol=tol)
    assert ADD not in _ops(program)
    assert spied["adds"] == 0


def test_q8_mismatched_residual_is_refused_at_load(vk_device):
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    m = GraphMaker()
    x, r = m.input((1, 32)), m.input((2, 13))
    w = m.constant(np.zeros((13, 32), np.int8))
    s = m.constant(np.ones((13,), np.float32))
    m.output(m.op(Q8_FUSED, [x, w, s, r], (1, 13)))
    with pytest.raises(VkDelegateError, match=r"^node 0 \(vkdelegate.weight_int8pack_mm_add"
                                              r".default\): residual \[2, 13\] float32 "
                                              r"for an output \[1, 13\] float32"):
        load_delegate(m.blob())
