"""2-D pooling ops against eager: max (with indices), avg, adaptive avg and max."""
import pytest
import torch
import torch.nn.functional as F

from tests.ops.harness import check_op
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.kernels.loop_limit import is_llvmpipe
from vkdelegate.errors import DeviceLimitError

MAX, AVG = "aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default"
AAVG, AMAX = "aten._adaptive_avg_pool2d.default", "aten.adaptive_max_pool2d.default"

MAX_CASES = {
    "k3_s2_p1": ((2, 3, 11, 13), dict(kernel_size=3, stride=2, padding=1)),
    "k2_default_stride": ((1, 5, 8, 7), dict(kernel_size=2)),
    "rect_dilated": ((1, 2, 13, 11), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0),
                                          dilation=(2, 3))),
    "ceil_mode": ((2, 3, 7, 5), dict(kernel_size=3, stride=2, ceil_mode=True)),
    "unbatched": ((3, 7, 5), dict(kernel_size=2, stride=1, padding=1)),
    "one_pixel": ((1, 3, 1, 1), dict(kernel_size=1)),
}


@pytest.mark.parametrize("case", MAX_CASES.values(), ids=MAX_CASES.keys())
def test_max_pool2d_with_indices(case):
    torch.manual_seed(0)
    shape, kw = case
    check_op(lambda x: F.max_pool2d(x, return_indices=True, **kw), (torch.randn(shape),),
             ops=[MAX])


def test_max_pool2d_nan_ties_and_inf():
    # NaN wins the window and takes the index of the last NaN, -inf windows keep the
    # first tap's index, ties keep the first maximum: ATen's CPU kernel's choices.
    x = torch.tensor([[[[1.0, float("nan"), 2.0, float("nan")],
                        [-float("inf"), -float("inf"), 3.0, 3.0],
                        [-float("inf"), -float("inf"), 0.5, 0.25],
                        [5.0, 5.0, 5.0, 5.0]]]])
    check_op(lambda x: F.max_pool2d(x, 2, return_indices=True), (x,), ops=[MAX])


def test_max_pool2d_plain_fp16_and_resize():
    torch.manual_seed(0)
    # Max returns one of its inputs: exact in fp16 too.
    check_op(lambda x: F.max_pool2d(x, 3, 2, 1), (torch.randn(2, 4, 9, 7).half(),),
             ops=[MAX], rtol=0, atol=0)
    # Stride 1 on the dynamic dim: with stride 2 some torch versions (2.11) add a
    # parity guard on h at export and refuse the range.
    h = torch.export.Dim("h", min=3, max=20)
    check_op(lambda x: F.max_pool2d(x, 3, (1, 2), 1), (torch.randn(1, 3, 11, 7),),
             ops=[MAX], dynamic_shapes=({2: h},), resize_inputs=(torch.randn(1, 3, 20, 7),))


AVG_CASES = {
    "k3_s2_p1": ((2, 3, 11, 13), dict(kernel_size=3, stride=2, padding=1)),
    "exclude_pad": ((1, 2, 7, 5), dict(kernel_size=3, stride=2, padding=1,
                                       count_include_pad=False)),
    "ceil_mode": ((1, 3, 7, 5), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    "ceil_exclude_pad": ((2, 2, 8, 6), dict(kernel_size=(3, 2), stride=(3, 2), padding=1,
                                            ceil_mode=True, count_include_pad=False)),
    "divisor_override": ((1, 3, 7, 5), dict(kernel_size=2, divisor_override=3)),
    "unbatched": ((3, 5, 7), dict(kernel_size=(2, 3), stride=1)),
}


@pytest.mark.parametrize("case", AVG_CASES.values(), ids=AVG_CASES.keys())
def test_avg_pool2d(case):
    torch.manual_seed(0)
    shape, kw = case
    check_op(lambda x: F.avg_pool2d(x, **kw), (torch.randn(shape),), ops=[AVG])


def test_avg_pool2d_fp16_and_resize():
    torch.manual_seed(0)
    # fp16: the mean of N(0,1) values is ~1; output rounding to 11 bits: < 1e-3.
    check_op(lambda x: F.avg_pool2d(x, 3, 2, 1), (torch.randn(1, 3, 9, 7).half(),),
             ops=[AVG], rtol=1e-3, atol=1e-3)
    n = torch.export.Dim("n", max=3)
    check_op(lambda x: F.avg_pool2d(x, 2), (torch.randn(2, 3, 8, 6),), ops=[AVG],
             dynamic_shapes=({0: n},), resize_inputs=(torch.randn(3, 3, 8, 6),))


@pytest.mark.parametrize("shape,size", [((2, 3, 7, 5), (1, 1)), ((1, 3, 11, 13), (3, 5)),
                                        ((1, 2, 5, 3), (7, 4)), ((3, 6, 4), (2, 2))],
                         ids=["global", "uneven", "upsampling", "unbatched"])
def test_adaptive_pools(shape, size):
    torch.manual_seed(0)
    x = torch.randn(shape)
    # A global (1, 1) average exports as aten.mean.dim (the reduction family's op).
    check_op(lambda x: F.adaptive_avg_pool2d(x, size), (x,),
             ops=[AAVG] if size != (1, 1) else ["aten.mean.dim"])
    check_op(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), (x,),
             ops=[AMAX])


def test_adaptive_pools_fp16_and_resize():
    torch.manual_seed(0)
    # fp16 output rounding of means ~1: < 1e-3; max is exact.
    x = torch.randn(1, 3, 9, 7).half()
    check_op(lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (x,), ops=[AAVG],
             rtol=1e-3, atol=1e-3)
    check_op(lambda x: F.adaptive_max_pool2d(x, (2, 3)), (x,), ops=[AMAX], rtol=0, atol=0)
    h = torch.export.Dim("h", min=4, max=16)
    check_op(lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (torch.randn(1, 3, 9, 7),),
             ops=[AAVG], dynamic_shapes=({2: h},), resize_inputs=(torch.randn(1, 3, 16, 7),))


def _random_pool(seed: int):
    """Seeded random max/avg pooling arguments and input within ATen's constraints."""
    g = torch.Generator().manual_seed(seed)

    def pick(*options):
        return options[int(torch.randint(len(options), (1,), generator=g))]
    k = [pick(1, 2, 3, 4) for _ in range(2)]
    stride = [pick(1, 2, 3) for _ in range(2)]
    dilation = [pick(1, 2) for _ in range(2)]
    padding = [pick(*range(kk // 2 + 1)) for kk in k]
    size = [max(pick(1, 4, 7, 9), (kk - 1) * d + 1) for kk, d in zip(k, dilation)]
    x = torch.randn((pick(1, 2), pick(1, 3), *size), generator=g)
    return x, k, stride, padding, dilation, pick(False, True), pick(False, True), \
        pick(None, None, 2, 5)


@pytest.mark.parametrize("seed", range(10))
def test_random_pools(seed):
    x, k, stride, padding, dilation, ceil_mode, include_pad, divisor = _random_pool(seed)
    check_op(lambda x: F.max_pool2d(x, k, stride, padding, dilation, ceil_mode=ceil_mode,
                                    return_indices=True), (x,), ops=[MAX])
    check_op(lambda x: F.avg_pool2d(x, k, stride, padding, ceil_mode=ceil_mode,
                                    count_include_pad=include_pad,
                                    divisor_override=divisor), (x,), ops=[AVG])


def test_more_planes_than_one_grid_column():
    # 65600 planes of 8x8 outputs: workgroups of 8x8x1, so more than the usual 65535
    # workgroups along z (lavapipe's limit too); the shader strides over the planes.
    torch.manual_seed(0)
    x = torch.randn(1, 65600, 8, 8)
    check_op(lambda x: F.max_pool2d(x, 3, 1, 1), (x,), ops=[MAX], rtol=0, atol=0)


def test_windows_longer_than_llvmpipes_loop_budget():
    # 300 x 300 windows: 90000 taps, more than the 65535 loop iterations llvmpipe runs
    # per invocation; 16 taps per iteration keep them whole.
    torch.manual_seed(0)
    x = torch.randn(1, 2, 600, 600)
    check_op(lambda x: F.adaptive_avg_pool2d(x, (2, 2)), (x,), ops=[AAVG])
    check_op(lambda x: F.adaptive_max_pool2d(x, (2, 2), return_indices=True), (x,),
             ops=[AMAX], rtol=0, atol=0)
    check_op(lambda x: F.max_pool2d(x, (300, 250), dilation=(1, 2), return_indices=True),
             (x,), ops=[MAX], rtol=0, atol=0)
    check_op(lambda x: F.avg_pool2d(x, 300), (x,), ops=[AVG])


def test_window_beyond_the_loop_budget_fails_at_load(monkeypatch, vk_device):
    # A DeviceLimitError at load; with torch the program layer runs such a delegate
    # on the CPU instead, so torch is hidden from it here.
    from vkdelegate.backend import program as program_layer

    if not is_llvmpipe(vk_device.info):
        pytest.skip("only llvmpipe limits shader loops")
    monkeypatch.setattr(program_layer, "_torch_or_none", lambda: None)
    x = torch.randn(1, 1, 2000, 2000)
    ep = torch.export.export(torch.nn.AdaptiveMaxPool2d(1), (x,))
    program = to_backend(ep, VulkanPartitioner())
    with pytest.raises(DeviceLimitError, match="pooling window of 2001 x 2001"):
        program(x)


def test_small_windows_unroll_large_ones_loop(monkeypatch, vk_device):
    """Windows of up to STATIC_TAPS taps run pool2d.glsl's STATIC_WINDOW form (geometry
    as specialization constants, taps unrolled), larger ones and adaptive pools the
    loops; both bit-equal to eager's values and max indices on CPU drivers (padding,
    dilation and ceil_mode clip windows at both borders; eager's adaptive average sums
    in another order, so that one gets the usual tolerance). GPUs may round the
    average's division by up to 2.5 ulp (the Vulkan spec's precision of a float
    division; the H200 is 1 ulp off in about a sixth of them): one ulp of tolerance
    there, which a wrong window or a wrong maximum still exceeds by far."""
    from tests.ops.harness import spy_dispatches
    from vkdelegate.ops.families.pool import STATIC_TAPS
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "STATIC_WINDOW" in d))
    torch.manual_seed(0)
    x = torch.randn(2, 3, 23, 19)
    check_op(lambda t: (F.max_pool2d(t, (3, 2), (2, 1), (1, 1), (2, 3), ceil_mode=True,
                                     return_indices=True),
                        F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                        F.max_pool2d(t, 9, 1, 4, return_indices=True)),
             (x,), ops=[MAX, AVG], atol=0,
             rtol=0 if vk_device.info.type == "cpu" else 3 * 2.0 ** -24)
    check_op(lambda t: F.adaptive_avg_pool2d(t, (4, 3)), (x,), ops=[AAVG])
    assert 9 * 9 > STATIC_TAPS >= 3 * 3
    assert [s for s in seen if s[0] == "pool2d"] == [
        ("pool2d", True), ("pool2d", True), ("pool2d", False), ("pool2d", False)]


@pytest.mark.parametrize("shape, size", [((2, 32, 49), 1), ((32, 10), 3), ((1, 8, 7), 7)])
def test_adaptive_avg_pool1d(shape, size):
    """adaptive_avg_pool1d (HF Swin's pooler), of a contiguous input and of a transposed
    one (Swin pools x.transpose(1, 2): its decomposition then ends in an as_strided,
    which passes/as_strided_views makes a view)."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    op = AAVG if size > 1 else "aten.mean.dim"
    check_op(lambda x: F.adaptive_avg_pool1d(x, size), (x,), ops=[op])
    check_op(lambda x: F.adaptive_avg_pool1d(x.transpose(-1, -2), size),
             (x.transpose(-1, -2).contiguous(),), ops=[op])
