"""Ops whose shader loops grow with the data, at sizes past llvmpipe's loop limit.

llvmpipe (lavapipe) silently ends any shader loop after 65535 iterations in one
invocation (docs/RUNTIME.md, common.h LOOP_LIMIT); before the fix, mean over
arange(100000) gave 21473.6, amax 65534 and softmax NaN. Every case here reduces or
accumulates more than 65535 elements per output, against eager. Other dims are kept
small so that each check stays quick on lavapipe.
"""
import pytest
import torch

from tests.ops.harness import check_op

LONG = 100003  # prime, past 65535
# A sum of 1e5 fp32 values of unit scale: eager and the device add in different
# orders, each with a relative rounding error of about log2(1e5) * 6e-8 ~ 1e-6 of
# the sum of magnitudes; 1e-4 of the result leaves margin for the cancellation in
# means of zero-centred data (atol covers results near zero).
TOL = dict(rtol=1e-4, atol=1e-4)


def _long_row_data(rows: int = 2) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(rows, LONG)


def _exact_product_data(rows: int) -> torch.Tensor:
    """Ones with a few factors of 2, 0.5 and 4 scattered over the whole row (past
    65535 too): their products are exact in fp32 in any order, so a product that
    skipped elements shows; products of 1e5 random factors differ from the exact one
    by ~1e-3 in eager already."""
    torch.manual_seed(1)
    x = torch.ones(rows, LONG)
    for r in range(rows):
        at = torch.randint(0, LONG, (12,))
        x[r, at] = torch.tensor([2.0, 0.5, 4.0])[torch.randint(0, 3, (12,))]
        x[r, LONG - 1] = 2.0
    return x


def test_arange_mean_amax_softmax_reported():
    # The reported failures, as reported (arange(100000.) in one row).
    x = torch.arange(100000.0)
    check_op(lambda t: (t.mean(), t.amax(), t.amin(), t.argmax(),
                        torch.softmax(t.view(1, -1), -1).sum()),
             (x,), ops=["aten.mean.default", "aten.amax.default", "aten.amin.default",
                        "aten.argmax.default", "aten._softmax.default"], rtol=1e-4,
             atol=1e-6)


def test_reductions_over_long_dim():
    x = _long_row_data()
    x[1, 70001] = 9.0  # a unique extreme past the limit: argmax must find it
    x[1, 80021] = -9.0
    check_op(lambda t: (t.mean(1), t.amax(1), t.amin(1, keepdim=True), t.var(1),
                        t.std(1, correction=0), t.argmax(1), t.argmin(1)),
             (x,), ops=["aten.mean.dim", "aten.amax.default", "aten.amin.default",
                        "aten.var.correction", "aten.argmax.default",
                        "aten.argmin.default"], **TOL)


def test_reductions_over_all_dims():
    x = _long_row_data(3)
    x[2, 99000] = 11.0
    check_op(lambda t: (t.mean(), t.amax(), t.amin(), t.max(), t.min(), t.var(),
                        t.argmax(), t.argmin()),
             (x,), ops=["aten.mean.default", "aten.amax.default", "aten.max.default",
                        "aten.min.default", "aten.var.correction", "aten.argmax.default",
                        "aten.argmin.default"], **TOL)


def test_prod_long_exact():
    x = _exact_product_data(3)
    check_op(lambda t: (t.prod(1), t.prod(), t.t().prod(0, keepdim=True)), (x,),
             ops=["aten.prod.dim_int", "aten.prod.default"], rtol=0, atol=0)


def test_long_reduction_over_a_strided_dim():
    # The long dim is not the innermost: the reduced elements are 3 apart.
    x = _long_row_data(3).t().contiguous()
    check_op(lambda t: (t.mean(0), t.amax(0), t.argmin(0)), (x,),
             ops=["aten.mean.dim", "aten.amax.default", "aten.argmin.default"], **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_any_argmax_late_and_nan(dtype):
    # The only nonzero / the extreme / the first NaN sit past 65535; ties before it.
    x = torch.zeros(3, LONG, dtype=dtype)
    x[0, 90000] = 1
    x[1, 70000] = 5
    x[1, 70001] = 5  # a tie: argmax gives the first
    if dtype == torch.float32:
        x[2, 80000] = float("nan")
        x[2, 90000] = float("nan")
        x[2, 100] = 7
    ops = ["aten.any.dim", "aten.any.default", "aten.argmax.default", "aten.max.dim"]
    check_op(lambda t: (t.any(1), t[0].any(), t[:2].all(), t.argmax(1), *t.max(1),
                        t.amax(1)), (x,), ops=ops)


def test_max_dim_values_and_indices_long():
    x = _long_row_data()
    x[0, 65536] = 20.0
    check_op(lambda t: t.min(1, keepdim=True) + t.max(1), (x,),
             ops=["aten.max.dim", "aten.min.dim"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_softmax_over_long_dim(dtype):
    torch.manual_seed(0)
    x = (torch.randn(2, 70001) * 4).to(dtype)
    x[1, 69999] = 30.0  # the max late in the row
    # fp16: each output is stored once, rounded to fp16 (a relative 5e-4). atol 2e-5:
    # at the max, log_softmax is -log(sum) = -1.48e-5 (float64 and fp32 eager agree,
    # the device gives -1.49e-5) where fp16 eager's kernel returns 0.
    tol = dict(rtol=2e-3, atol=2e-5) if dtype == torch.float16 else dict(rtol=1e-4,
                                                                         atol=1e-7)
    check_op(lambda t: (torch.softmax(t, -1), torch.log_softmax(t, 1)), (x,),
             ops=["aten._softmax.default", "aten._log_softmax.default"], **tol)


def test_softmax_long_dim_not_innermost():
    torch.manual_seed(0)
    x = torch.randn(70001, 3)
    x[70000, 1] = float("nan")  # that column is NaN, as in ATen
    check_op(lambda t: (torch.softmax(t, 0), torch.log_softmax(t, 0)), (x,),
             ops=["aten._softmax.default", "aten._log_softmax.default"],
             rtol=1e-4, atol=1e-7)


def test_passes_share_the_loop_limit():
    # llvmpipe's limit counts every loop iteration of an invocation together: var
    # (two passes) and softmax (three) over rows that one pass could still do in one
    # invocation (600011 / 16 < 65535 < 2 * 600011 / 16) must still see every element.
    torch.manual_seed(0)
    x = torch.randn(1, 600011)
    x[0, 599999] = 8.0
    check_op(lambda t: (t.var(1), torch.softmax(t, -1), t.argmax(1)), (x,),
             ops=["aten.var.correction", "aten._softmax.default"], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("batch", [1, 5], ids=["m_tile1", "m_tile4"])
def test_linear_long_k(batch):
    # K = 70001 (prime: 16-step loop plus a remainder); a bias; the packed constant
    # weight, and the same product as mm/addmm and bmm with a runtime [K, N] operand.
    torch.manual_seed(0)
    lin = torch.nn.Linear(70001, 3)
    x = torch.randn(batch, 70001)
    # Sums of 70001 products of ~0.004 magnitude: rounding differs by order, ~1e-6.
    check_op(lin, (x,), ops=["aten.linear.default"], rtol=1e-4, atol=1e-5)
    y = torch.randn(70001, 2)
    check_op(lambda a, b: (a @ b, torch.bmm(a[None], b[None])), (x, y),
             ops=["aten.mm.default", "aten.bmm.default"], rtol=1e-4, atol=1e-3)


CONV = ["aten.convolution.default"]


@pytest.mark.parametrize("hw", [2, 3], ids=["aligned_plane", "unaligned_plane"])
def test_pointwise_conv_70001_channels(hw):
    # A 1x1 convolution with a constant weight (the pointwise GEMM form), K = 70001.
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(70001, 4, 1)
    check_op(conv, (torch.randn(1, 70001, hw, hw),), ops=CONV, rtol=1e-4, atol=1e-5)


def test_pointwise_conv_form_is_gemm_select():
    # The pointwise conv's GEMM takes its form from kernels/gemm.py's select, like every
    # other product: LONG_LOOPS from the first channel count whose plain loops (9 per
    # channel, PX = 8) could pass the budget, OC_TILE 4 when the output channels allow.
    from types import SimpleNamespace
    from vkdelegate.kernels import gemm, loop_limit
    info = SimpleNamespace(type="cpu", name="llvmpipe")
    last_plain = (loop_limit.LOOP_LIMIT - loop_limit.SLACK - 16) // 9
    plain = gemm.select(info, 64, 8, last_plain, plain=False, pointwise_conv=True)
    long = gemm.select(info, 64, 6, last_plain + 1, plain=False, pointwise_conv=True)
    assert (plain.shader, plain.tile, plain.long_k) == ("conv2d", 4, False)
    assert (long.shader, long.tile, long.long_k) == ("conv2d", 1, True)
    assert long.iterations(70001) == 70001 // 4 + 3


@pytest.mark.parametrize("channels", [7274, 7275], ids=["last_plain", "first_long"])
def test_pointwise_conv_either_side_of_the_switch(channels):
    # Both forms give eager's numbers at the switch point: an estimate below the real
    # count would leave the plain form short of channels on llvmpipe.
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(channels, 4, 1)
    check_op(conv, (torch.randn(1, channels, 3, 3),), ops=CONV, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make,shape", [
    (lambda: torch.nn.Conv2d(9001, 4, 7, padding=3), (1, 9001, 4, 5)),  # K = 441049
    (lambda: torch.nn.Conv2d(9001, 3, 7, stride=2), (1, 9001, 9, 9)),   # OC_TILE 1
    (lambda: torch.nn.Conv1d(3001, 4, 25, padding=12), (1, 3001, 7)),   # K = 75025
    (lambda: torch.nn.ConvTranspose2d(9001, 4, 7, stride=2), (1, 9001, 2, 2)),
], ids=["k7", "k7_stride2", "conv1d_k25", "transposed_k7"])
def test_direct_conv_k_past_loop_limit(make, shape):
    # K = Cin * KH * KW past 65535 with kernels larger than 3x3, whose tap loops the
    # compiler did not unroll by itself: Cin times the kernel rows passed the limit.
    torch.manual_seed(0)
    # Sums of ~1e4..1e5 products: fp32 rounding of order 1e-7 of the sum of |terms|
    # (~100 here), so outputs that cancel to near 0 need atol 1e-4.
    check_op(make(), (torch.randn(shape),), ops=CONV, rtol=1e-4, atol=1e-4)


def test_conv_too_many_channels_per_group_is_refused(monkeypatch, vk_device):
    # 70001 input channels per group in the direct form: more loop iterations than
    # llvmpipe runs; a clear error at load instead of wrong numbers. (With torch the
    # program layer runs such a delegate on the CPU instead; the error is what it
    # raises without torch.)
    from vkdelegate.backend import program
    from vkdelegate.errors import DeviceLimitError
    if not vk_device.info.name.startswith("llvmpipe"):
        pytest.skip("the loop limit is llvmpipe's")
    monkeypatch.setattr(program, "_torch_or_none", lambda: None)
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(70001, 1, 3)
    with pytest.raises(DeviceLimitError, match="70001 input channels per group"):
        check_op(conv, (torch.randn(1, 70001, 3, 3),), ops=CONV)


def test_global_average_pool_of_a_large_plane():
    # adaptive_avg_pool2d to 1 x 1 (global pooling) exports as mean over H and W:
    # 300 x 300 = 90000 elements per output.
    torch.manual_seed(0)
    x = torch.randn(1, 3, 300, 300)
    check_op(lambda t: (torch.nn.functional.adaptive_avg_pool2d(t, 1), t.mean((2, 3))),
             (x,), ops=["aten.mean.dim"], **TOL)


@pytest.fixture
def force_cooperative(monkeypatch):
    # lavapipe keeps one invocation per output up to rows.THREAD_MAX: force the
    # cooperative (one workgroup per output) form, the GPU path and the long one
    # (sum, reduce.glsl and softmax all choose it in kernels/rows.py dispatch_rows).
    from vkdelegate.kernels import rows
    monkeypatch.setattr(rows, "cooperative", lambda info, reduced: True)


def test_cooperative_form_semantics(force_cooperative):
    # Strided shares and the shared-memory tree must keep ATen's semantics: the first
    # index of ties and of NaN across lanes, NaN propagation, empty reductions (mean
    # NaN, prod 1, any False), rows shorter than the workgroup.
    torch.manual_seed(0)
    x = torch.randn(6, 1031)
    x[0, 700] = x[0, 5] = 50.0            # tie in different lanes: argmax is 5
    x[1, 900] = float("nan")
    x[1, 3] = float("nan")                # the first NaN wins argmax/argmin
    x[2, 64] = x[2, 1] = -50.0            # tie for argmin at lanes 1 and 0
    x[3, :] = 0.0
    x[3, 1030] = 1.0                      # any: only the last element
    x[4, :] = 2.0                         # all equal: index 0
    e = torch.zeros(3, 0)
    check_op(lambda t, z: (t.argmax(1), t.argmin(1), t.amax(1), t.amin(1), *t.max(1),
                           *t.min(1), t.mean(1), t.var(1), t.any(1), t[:, :3].mean(1),
                           (t[:, :40] * 0.01 + 1).prod(1), t[:, :2].argmax(1),
                           t.argmax(), t.amax(), z.mean(1), z.prod(1), z.any(1),
                           torch.softmax(t, 1), torch.log_softmax(t[:, :5], 1),
                           torch.softmax(t, 0)),
             (x, e), ops=["aten.argmax.default", "aten.argmin.default",
                          "aten.amax.default", "aten.amin.default", "aten.max.dim",
                          "aten.min.dim", "aten.mean.dim", "aten.var.correction",
                          "aten.any.dim", "aten.prod.dim_int", "aten._softmax.default",
                          "aten._log_softmax.default"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.int32], ids=str)
def test_cooperative_form_dtypes(force_cooperative, dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 517) * 40).to(dtype)
    x[1, 300] = x[1, 7] = 127   # a tie, indices in different lanes
    fns = lambda t: (t.argmax(1), t.amin(1), t.any(1), *t.max(1))  # noqa: E731
    ops = ["aten.argmax.default", "aten.amin.default", "aten.any.dim", "aten.max.dim"]
    if dtype == torch.float16:
        fns = lambda t: (t.argmax(1), t.amin(1), t.any(1), *t.max(1),  # noqa: E731
                         t.mean(1), t.var(1), torch.softmax(t, 1))
        ops += ["aten.mean.dim", "aten.var.correction", "aten._softmax.default"]
    # fp16: one rounding to fp16 of fp32 results (~5e-4 relative); var of values ~40
    # is ~1600, where an fp16 ulp is 1.
    tol = dict(rtol=2e-3, atol=1e-3) if dtype == torch.float16 else {}
    check_op(fns, (x,), ops=ops, **tol)


def test_cooperative_form_resize(force_cooperative):
    from torch.export import Dim
    torch.manual_seed(0)
    n = Dim("n", min=1, max=300)
    check_op(lambda t: (t.argmax(1), t.var(1), torch.softmax(t, 1), t.amax(0)),
             (torch.randn(3, 300),), ops=["aten.argmax.default", "aten.var.correction",
                                           "aten._softmax.default"],
             dynamic_shapes=({1: n},),
             resize_inputs=[(torch.randn(3, 1),), (torch.randn(3, 77),)],
             rtol=1e-4, atol=1e-6)


def test_loop_limit_check_unit():
    # loop_limit.check raises through the builder's error only on llvmpipe and only
    # past LOOP_LIMIT - SLACK iterations.
    from types import SimpleNamespace

    from vkdelegate.kernels import loop_limit
    from vkdelegate.errors import DeviceLimitError, VkDelegateError

    def error(msg, limit=False):
        return (DeviceLimitError if limit else VkDelegateError)(f"node 7: {msg}")

    def builder(name):
        return SimpleNamespace(device=SimpleNamespace(info=SimpleNamespace(name=name)),
                               error=error)

    budget = loop_limit.LOOP_LIMIT - loop_limit.SLACK
    loop_limit.check(builder("llvmpipe (LLVM 15)"), budget, "K = 1")
    with pytest.raises(DeviceLimitError, match=r"node 7: K = 9 needs about 65488 "):
        loop_limit.check(builder("llvmpipe (LLVM 15)"), budget + 1, "K = 9")
    loop_limit.check(builder("NVIDIA H200"), 10 * budget, "K = 9")
    assert loop_limit.unrolled_iterations(70001) == 70001 // 16 + 15
