"""An RMS norm and the linear reading it fuse into ``vkdelegate.rms_norm_linear``
(passes/fuse_rms_norm_linear.py; ops/families/norm.py), against eager PyTorch (HF's
LlamaRMSNorm then ``F.linear``): fp32 and fp16, bias and none, one row (gemv.glsl's
RMS_NORM form, one dispatch: the GPU forms forced here as tests/ops/test_linear_add.py
does, since a CPU driver has no GEMV path) and several (the norm's dispatch, then the
linear), K of the scalar (37), vec4 (52) and fp16 vec8 (64) GEMV loads, with and
without subgroup arithmetic, dynamic rows. The pass leaves the norm alone where the
fusion does not fit (a reader that is not a linear, several readers of several rows);
the CPU kernel is exactly the two ops; crafted blobs of other sizes are refused at
load.

Tolerances: fp32 as the linear tests (1e-4): the fused kernel computes
rstd * sum(w_row * (x * norm_w)) where eager computes sum(w_row * (x * rstd * norm_w)):
the same products up to fp32 rounding and the order of the sums. fp16: eager rounds
the normalized row to fp16 before the weight multiply and again after it (HF's
LlamaRMSNorm), et_vk.rms_norm once after it, the fused GEMV never (fp32 throughout), so
each element of the normalized row may be one or two fp16 roundings (2^-11 relative)
apart; the product sums K such terms in fp32 and rounds once to fp16, so the outputs
(magnitude ~1-10 here) are a few fp16 steps apart at most: the fp16 linear tests'
rtol = atol = 1e-2, which the fused op meets with margin.
"""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from tests.ops.harness import check_op, delegated_nodes, spy_dispatches
from tests.ops import test_rms_norm_fusion
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops

FUSED = custom_ops.RMS_NORM_LINEAR.name
NORM, LINEAR = "et_vk.rms_norm.default", "aten.linear.default"
F16 = dict(rtol=1e-2, atol=1e-2)


#: The norm in the GEMV (on by default; backend/options.py), named where a test needs it.
ON = {"rms_norm_prologue": True}


def _tol(dtype):
    return F16 if dtype == torch.float16 else {}


class LlamaRMSNorm(test_rms_norm_fusion.LlamaRMSNorm):
    """transformers' LlamaRMSNorm (test_rms_norm_fusion's copy), weights in 0.5..1.5."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__(hidden_size, eps)
        self.weight = nn.Parameter(torch.rand(hidden_size) + 0.5)


class _Block(nn.Module):
    """An HF-Llama-like step: the RMS norm, then one linear (the merged q/k/v)."""

    def __init__(self, k, n, bias=False):
        super().__init__()
        self.norm, self.proj = LlamaRMSNorm(k), nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.proj(self.norm(x))


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


@pytest.fixture
def dispatched(monkeypatch):
    """The shaders each node dispatched, in order."""
    return spy_dispatches(monkeypatch, lambda shader, defines: (shader, "RMS_NORM" in defines))


@pytest.fixture
def gpu_forms(monkeypatch, dispatched):
    """Every device type gets the tile table's GPU row (the GEMV path for one row, the
    GEMM core for more) without its cooperative-matrix form, as on the H200."""
    from vkdelegate.kernels import gemm, gemm_tiles

    portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
    monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    return dispatched


def _x(rows, k, dtype, rank=3):
    lead = (1, rows) if rank == 3 else (rows,)
    return torch.randn(*lead, k).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("k", [37, 52, 64], ids=["scalar", "vec4", "vec8"])
def test_gemv_folds_the_norm_in(gpu_forms, dtype, bias, k):
    # One row: gemv.glsl's [N, K] form with RMS_NORM, scalar loads (K = 37), vec4 (52)
    # and for fp16 stored as 16 bits uvec4s of 8 (64); N = 29 leaves a partial
    # workgroup. One dispatch: no norm.glsl.
    torch.manual_seed(0)
    module = _Block(k, 29, bias=bias).to(dtype)
    program = check_op(module, (_x(1, k, dtype),), ops=[FUSED], options=ON,
                       **_tol(dtype))
    assert _ops(program) == [FUSED]
    assert gpu_forms == [("gemv", True)]


def test_gemv_without_subgroups(gpu_forms, monkeypatch):
    from vkdelegate.kernels import gemm_core

    monkeypatch.setattr(gemm_core, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(0)
    for k in (37, 52, 300):  # 300: more than the 128 invocations' first stride
        check_op(_Block(k, 13, bias=True), (_x(1, k, torch.float32, rank=2),), ops=[FUSED], options=ON)
    assert gpu_forms == [("gemv", True)] * 3


def test_gemv_batch_of_rows(gpu_forms):
    """x [B, 1, K]: the GEMV's batch (grid z), each workgroup normalizing its row."""
    torch.manual_seed(0)
    check_op(_Block(64, 20, bias=True), (torch.randn(3, 1, 64),), ops=[FUSED], options=ON)
    assert gpu_forms == [("gemv", True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_several_rows_norm_then_gemm(gpu_forms, dtype, bias):
    # Prefill's rows: the norm's own dispatch into a scratch row, then the GEMM core.
    torch.manual_seed(0)
    module = _Block(48, 29, bias=bias).to(dtype)
    program = check_op(module, (_x(7, 48, dtype),), ops=[FUSED], **_tol(dtype))
    assert _ops(program) == [FUSED]
    assert gpu_forms == [("norm", False), ("gemm", False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rows", [1, 5])
def test_default_forms(dispatched, dtype, rows):
    """This device's own forms with the default options: on a CPU driver (no GEMV
    path) the norm's dispatch, then linear.glsl; on a GPU one row is one GEMV."""
    torch.manual_seed(0)
    module = _Block(40, 24, bias=True).to(dtype)
    check_op(module, (_x(rows, 40, dtype),), ops=[FUSED], **_tol(dtype))
    if dispatched == [("gemv", True)]:
        assert rows == 1
    else:
        assert [s for s, _ in dispatched][0] == "norm" and len(dispatched) == 2, dispatched


@pytest.mark.parametrize("gpu", [False, True], ids=["default", "gpu_forms"])
def test_dynamic_rows(monkeypatch, gpu):
    """Prefill's [1, T, K] with T dynamic: the scratch row follows each resize."""
    if gpu:
        from vkdelegate.kernels import gemm, gemm_tiles

        portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
        monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    torch.manual_seed(0)
    t = Dim("t", min=2, max=16)
    check_op(_Block(24, 20, bias=True), (_x(9, 24, torch.float32),), ops=[FUSED],
             dynamic_shapes=({1: t},),
             resize_inputs=[(_x(2, 24, torch.float32),), (_x(16, 24, torch.float32),)])


def test_several_linears_of_one_row_each_fuse(gpu_forms):
    """Decode's unmerged siblings (x statically one row): each linear normalizes the
    row in its own GEMV; the norm's dispatch is gone."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = LlamaRMSNorm(32)
            self.a, self.b = nn.Linear(32, 8), nn.Linear(32, 12, bias=False)

        def forward(self, x):
            h = self.norm(x)
            # b's weight read elsewhere (as a tied weight is) keeps merge_linears from
            # merging a and b.
            return self.a(h), self.b(h) + self.b.weight.sum(1)

    torch.manual_seed(0)
    program = check_op(M(), (_x(1, 32, torch.float32),), ops=[FUSED], options=ON)
    assert _ops(program).count(FUSED) == 2 and NORM not in _ops(program), _ops(program)
    assert gpu_forms.count(("gemv", True)) == 2, gpu_forms


def test_several_linears_of_several_rows_keep_the_norm():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = LlamaRMSNorm(32)
            # One with a bias, one without: passes/merge_linears, which would make
            # them one product of the norm, leaves them apart.
            self.a, self.b = nn.Linear(32, 8), nn.Linear(32, 12, bias=False)

        def forward(self, x):
            h = self.norm(x)
            return self.a(h), self.b(h)

    torch.manual_seed(0)
    program = check_op(M(), (_x(3, 32, torch.float32),), ops=[NORM, LINEAR])
    assert FUSED not in _ops(program)


def test_norm_read_by_another_op_is_kept():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.a = LlamaRMSNorm(32), nn.Linear(32, 8)

        def forward(self, x):
            h = self.norm(x)
            return self.a(h), h

    torch.manual_seed(0)
    program = check_op(M(), (_x(1, 32, torch.float32),), ops=[NORM, LINEAR])
    assert FUSED not in _ops(program)


def test_report_names_the_fused_op():
    torch.manual_seed(0)
    module = _Block(16, 8).eval()
    x = _x(1, 16, torch.float32)
    program = to_backend(torch.export.export(module, (x,)),
                         VulkanPartitioner({"executor": "reference"}))
    ops = [d.op for d in program.report.decisions]
    assert FUSED in ops and NORM not in ops and LINEAR not in ops, ops
    torch.testing.assert_close(program(x), module(x), rtol=1e-5, atol=1e-5)


def test_cpu_kernel_is_the_two_ops():
    """The op's CPU kernel: et_vk.rms_norm (rounded to fp16), then aten.linear."""
    torch.manual_seed(0)
    x, nw, w, b = (torch.randn(*s).half() for s in ((3, 40), (40,), (7, 40), (7,)))
    got = custom_ops.RMS_NORM_LINEAR.overload()(x, nw, 1e-5, w, b)
    y = custom_ops.RMS_NORM.overload()(x, nw, 1e-5)
    assert torch.equal(got, F.linear(y, w, b))
    assert torch.equal(custom_ops.RMS_NORM_LINEAR.overload()(x, nw, 1e-5, w),
                       F.linear(y, w))


def test_rms_norm_fits_is_the_gemv_path():
    """gemv.glsl's RMS_NORM form: the GEMV path with b [N, K], whatever K (nothing of
    the row is held in shared memory)."""
    from vkdelegate.kernels import gemm_core
    from vkdelegate.kernels.gemm import GemmForm

    gemv, core = GemmForm("gemv", 4), GemmForm("gemm", block=(4, 4, 16))
    assert gemm_core.rms_norm_fits(gemv, True)
    assert not gemm_core.rms_norm_fits(core, True)
    assert not gemm_core.rms_norm_fits(gemv, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_long_row_in_one_gemv(gpu_forms, dtype):
    """K = 9000 (past the 16 KiB of shared memory a prologue holding the row needed):
    still one GEMV, several strides of the 128 invocations over K."""
    torch.manual_seed(0)
    module = _Block(9000, 12, bias=True).to(dtype)
    check_op(module, (_x(1, 9000, dtype),), ops=[FUSED], **_tol(dtype))
    assert gpu_forms == [("gemv", True)]


def test_no_gemv_form_takes_two_dispatches(gpu_forms, monkeypatch):
    from vkdelegate.kernels import gemm_core

    monkeypatch.setattr(gemm_core, "rms_norm_fits", lambda *a: False)
    torch.manual_seed(0)
    check_op(_Block(64, 16), (_x(1, 64, torch.float32),), ops=[FUSED], options=ON)
    assert gpu_forms == [("norm", False), ("gemv", False)]


def test_option_off_takes_two_dispatches(gpu_forms):
    """Compile option rms_norm_prologue=False: the unfused pair's dispatches, for
    comparing the two on one device."""
    torch.manual_seed(0)
    check_op(_Block(64, 16), (_x(1, 64, torch.float32),), ops=[FUSED],
             options={"rms_norm_prologue": False})
    assert gpu_forms == [("norm", False), ("gemv", False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_fused_matches_the_two_dispatches(gpu_forms, dtype):
    """The fused GEMV's rstd * sum(w_row * x * norm_w) against the norm's dispatch
    (et_vk.rms_norm, rounded to x's dtype) then the GEMV: in fp32 a few ulps apart (the
    order of the sums); in fp16 each normalized element of the two-dispatch form is
    rounded to fp16 (2^-11 relative), which over K = 2048 random terms moves an output
    (~0.6 here) by about 2^-12 of its size, within one of its fp16 steps."""
    from vkdelegate.runtime import default_device

    torch.manual_seed(0)
    k = 2048
    module = _Block(k, 300, bias=True).to(dtype).eval()
    x = _x(1, k, dtype) * 3
    outs = []
    for on in (True, False):
        program = to_backend(torch.export.export(module, (x,)),
                             VulkanPartitioner({"rms_norm_prologue": on}))
        outs.append(program(x))
        program.close()
    if dtype == torch.float32:
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    else:
        torch.testing.assert_close(outs[0], outs[1], rtol=2 ** -10, atol=2 ** -10)
    assert [form for form in gpu_forms if form[1]] == [("gemv", True)]


# ---- load-time checks of crafted blobs ------------------------------------------------
def _blob(nw_shape=(8,), w_shape=(6, 8), bias_shape=None, out_shape=(1, 1, 6),
          nw_dtype="float32"):
    """A blob of one rms_norm_linear node: x [1, 1, 8], constant norm weight, weight
    and bias of the given sizes, the output declared ``out_shape``."""
    from tests.runtime.graphs import GraphMaker

    rng = np.random.default_rng(0)
    m = GraphMaker()
    x = m.input((1, 1, 8))
    nw = m.constant(rng.standard_normal(nw_shape).astype(nw_dtype))
    w = m.constant(rng.standard_normal(w_shape).astype(np.float32))
    bias = m.scalar(None) if bias_shape is None else \
        m.constant(rng.standard_normal(bias_shape).astype(np.float32))
    m.output(m.op(FUSED, [x, nw, m.scalar(1e-6), w, bias], out_shape))
    return m


def test_matching_blob_runs(vk_device):
    from vkdelegate.runtime import load_delegate

    m = _blob(bias_shape=(6,))
    x = np.random.default_rng(1).standard_normal((1, 1, 8), np.float32)
    nw, w, b = (np.frombuffer(c, np.float32) for c in m.constants)
    with load_delegate(m.blob()) as graph:
        got = graph.execute([x])[0]
    y = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * nw
    np.testing.assert_allclose(got, y @ w.reshape(6, 8).T + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(nw_shape=(9,)), r"norm_weight of sizes \[9\] for an input of sizes "
                          r"\[1, 1, 8\]: it must be \[8\]"),
    (dict(nw_shape=(1, 8)), r"norm_weight of sizes \[1, 8\]"),
    (dict(w_shape=(6, 9), out_shape=(1, 1, 6)), r"weight of sizes \[6, 9\] for an input "
                                                r"of sizes \[1, 1, 8\]: it must be \[N, 8\]"),
    (dict(bias_shape=(5,)), r"bias of sizes \[5\] for 6 outputs: it must be \[6\]"),
    (dict(out_shape=(1, 1, 7)), r"output"),
    (dict(nw_dtype="float16"), r"mixed dtypes"),
])
def test_inconsistent_blob_is_refused_at_load(vk_device, kwargs, match):
    """A blob whose norm weight, weight or bias do not fit x (sizes the kernels would
    read past) or whose dtypes are mixed is refused before anything is built, by the
    Vulkan loader and the reference executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    blob = _blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError,
                           match=r"^node 0 \(vkdelegate.rms_norm_linear.default\): .*"
                                 + match):
            load(blob)
