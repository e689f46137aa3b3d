"""8da4w's activation quantized once: on GPUs the qparams' dispatch
(choose_qparams.glsl's QX form, kernels/quantized_x.py) also writes the rows quantized,
and the products' GEMV (linear_qw_gemv.glsl's QX_IN form, DIRECT and SG_ROWS) reads
those int8 values instead of quantizing x in each of its workgroups. Forced on this device as
tests/ops/test_quantized_gemv.py forces the GPUs' GEMV (a CPU driver takes the GEMM and
texel forms, which quantize x themselves), with the qparams in their GPU workgroups.

Each case: eager's values (the tolerances of the ops' own tests: 8da4w's margin of one
activation quantum), the QX forms taken (spied dispatches: every product of the case,
and its qparams), and the outputs bit for bit those with QX off: both forms quantize
with quantize_x.h's operations, so the same int8 values and the same integer sums.
"""
import pytest
import torch

from tests.ops import coverage
from tests.ops.harness import check_op, spy_dispatches
from tests.ops.test_choose_qparams import NORM_QPARAMS, _normed
from tests.ops.test_quantized_linear import _one_quantum
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.quantize import quantize_for_vulkan

pytest.importorskip("torchao")

DQ8CA = "et_vk.linear_dq8ca_q4gsw.default"


@pytest.fixture(params=["direct_int_dot", "direct_portable", "sg_rows"])
def forced(monkeypatch, request) -> list:
    """The GPUs' forms on this device (quantized_x.gemv_device, which use_gemv reads
    too): the vectorized GEMV for up to GEMV_ROWS rows (its DIRECT form with the
    integer dot product or, that candidate dropped, the portable fp32 sums; or
    SG_ROWS), the qparams' 256 invocations a row. Returns the (shader,
    defines) of each linear_qw_gemv and choose_qparams dispatch from now on."""
    from vkdelegate.kernels import quantized_x
    from vkdelegate.ops.families import choose_qparams
    from vkdelegate.ops.families import quantized_linear as family

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(family, "texel_form", lambda *args: False)
    monkeypatch.setattr(quantized_x, "gemv_device", lambda info: True)
    monkeypatch.setattr(choose_qparams, "workgroup", lambda info, k: 256)
    if request.param == "direct_portable":
        monkeypatch.setattr(family, "choose", lambda shader, candidates, caps:
                            dict(candidates[-1]))
    if request.param == "sg_rows":
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # a --sweep form
        monkeypatch.setattr(family, "VSG_ROWS", True)
    return spy_dispatches(monkeypatch, lambda shader, defines: (shader, dict(defines))
                          if shader in ("linear_qw_gemv", "choose_qparams") else None)


def _check_forms(seen, products: int, norm: bool = False) -> None:
    """``products`` linear_qw_gemv dispatches, all reading x quantized (QX_IN), each
    after a qparams dispatch writing it (QX; NORM when the norm is folded in)."""
    seen = [s for s in seen if s is not None]
    gemv = [d for shader, d in seen if shader == "linear_qw_gemv"]
    qparams = [d for shader, d in seen if shader == "choose_qparams"]
    assert len(gemv) == products and all("QX_IN" in d and "DQ8CA" in d for d in gemv), gemv
    assert qparams and all("QX" in d and ("NORM" in d) == norm for d in qparams), qparams


def _run(monkeypatch, module, inputs, qx: bool) -> tuple:
    """The outputs of ``module`` lowered and run with quantized_x.QX = ``qx``."""
    from vkdelegate.kernels import quantized_x

    monkeypatch.setattr(quantized_x, "QX", qx)
    program = to_backend(torch.export.export(module, inputs), VulkanPartitioner({}))
    try:
        out = program(*inputs)
    finally:
        program.close()
        monkeypatch.setattr(quantized_x, "QX", True)
    return out if isinstance(out, tuple) else (out,)


def _bitwise_qx_off(monkeypatch, module, inputs) -> None:
    got = _run(monkeypatch, module, inputs, True)
    want = _run(monkeypatch, module, inputs, False)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def _x(rows: int, k: int, dtype) -> torch.Tensor:
    """Rows of normal values; the second with one outlier (most values then quantize to
    a few levels near the zero point), the third all zeros (the clamped scale)."""
    torch.manual_seed(1)
    x = torch.randn(rows, k)
    if rows > 1:
        x[1, 7] = 300.0
    if rows > 2:
        x[2] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("group", [32, 128])
def test_plain(forced, monkeypatch, group, dtype):
    """K = 4608 (past a workgroup's sweep of blocks), N = 13 (a partly used workgroup),
    one and three rows."""
    torch.manual_seed(0)
    k = 4608
    model = quantize_for_vulkan(torch.nn.Sequential(torch.nn.Linear(k, 13)).to(dtype).eval(),
                                "8da4w", group_size=group)
    tol = 2e-5 if dtype == torch.float32 else 1e-2
    for rows in (1, 3):
        x = _x(rows, k, dtype)
        forced.clear()
        check_op(model, (x,), ops=[DQ8CA], rtol=tol, atol=tol + _one_quantum(model, x.float()))
        _check_forms(forced, 1)
        _bitwise_qx_off(monkeypatch, model, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_norm_folded(forced, monkeypatch, dtype):
    """An HF RMS norm only 8da4w products read (rms_norm_choose_qparams, NORM): the
    quantized rows are those of the y it writes (K = 96, q and k merged)."""
    pytest.importorskip("transformers")
    model = _normed(dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    for rows in (1, 3):
        torch.manual_seed(rows)
        x = torch.randn(1, rows, 96).to(dtype)
        quantum = _one_quantum(torch.nn.Sequential(model.k), x.float() * 2)
        forced.clear()
        check_op(model, (x,), ops=[NORM_QPARAMS], rtol=tol, atol=tol + quantum)
        _check_forms(forced, 1, norm=True)
        _bitwise_qx_off(monkeypatch, model, (x,))


def test_decoder_greedy(forced, request, monkeypatch):
    """A small fp32 Llama quantized 8da4w through vkdelegate.llm with every decode
    product in QX_IN (the residual, SwiGLU and rotary / cache epilogues, the lm_head):
    greedy tokens equal HF generate of the same quantized model for 32 steps, and the
    tokens with QX off."""
    if request.node.callspec.params["forced"] != "direct_int_dot":
        pytest.skip("one form is enough for the whole decoder")
    pytest.importorskip("transformers")
    from tests.llm.models import VOCAB, hf_greedy, make_model
    from vkdelegate.llm import generate, lower
    from vkdelegate.kernels import quantized_x

    model = make_model("llama")
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(3)).tolist()
    program = lower(model, 48, quantization="8da4w", group_size=32)
    tokens = {}
    try:
        for qx in (True, False):  # built again after close, with QX as it is then
            monkeypatch.setattr(quantized_x, "QX", qx)
            forced.clear()
            tokens[qx] = generate(program, prompt, 32)
            program.close()
            gemv = [d for s in forced if s is not None for shader, d in [s]
                    if shader == "linear_qw_gemv"]
            assert gemv and all(("QX_IN" in d) == qx for d in gemv), gemv
    finally:
        program.close()
    assert tokens[True] == tokens[False] == hf_greedy(model, prompt, 32)


def test_published_rows_are_read_only_where_they_fit():
    """The product reads the published rows only under its own qparams' key and where
    they cover its rows and its K (a crafted blob may pair those qparams with other
    data: never a read past the rows written); an op's temporary qparams (value id -1)
    have no key."""
    from types import SimpleNamespace

    from vkdelegate.kernels import quantized_x
    from vkdelegate.ops.families.quantized_linear import _quantized_x

    def tensor(vid, shape=()):
        return SimpleNamespace(value_id=vid, max_shape=tuple(shape))

    scale, zp, sums = tensor(5), tensor(6), tensor(7)
    rows = tensor(-1, (4, quantized_x.words(2048)))
    published = {quantized_x.key(scale, zp): rows}
    b = SimpleNamespace(published=published.get)
    x = tensor(3)
    assert _quantized_x(b, x, (scale, zp, sums), 2048 // 32, 4) is rows
    assert _quantized_x(b, x, (scale, zp, sums), 2048 // 32, 5) is None  # more rows
    assert _quantized_x(b, x, (scale, zp, sums), 4096 // 32, 1) is None  # another K
    assert _quantized_x(b, x, (tensor(8), zp, sums), 2048 // 32, 1) is None  # other qparams
    assert _quantized_x(b, x, None, 2048 // 32, 1) is None  # not 8da4w
    assert quantized_x.key(tensor(-1), zp) is None
