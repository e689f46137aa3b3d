"""aten.convolution.default and et_vk.conv_with_clamp.default against eager.

Covers every shader path (pointwise, direct with 4 or 1 output channels per
invocation, depthwise, transposed, weights computed at run time), 1-D and 2-D, prime
sizes, batch 1..3, fp16, the fused clamp, resizes and the partition-time rejections.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vkdelegate.backend import custom_ops
from tests.ops import coverage
from tests.ops.harness import check_op
from tests.runtime.graphs import GraphMaker, rand
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.kernels.conv_pointwise import LAST_SUM as LAST_SUM_DEFAULT
from vkdelegate.runtime import Device

CONV = "aten.convolution.default"
CLAMP = custom_ops.CONV_WITH_CLAMP.name
custom_ops.ensure_defined()  # torch.ops.et_vk.conv_with_clamp for the eager references


def _conv(weight, bias, **kw):
    return lambda x: F.conv2d(x, weight, bias, **kw)


# (input shape, weight shape, bias, kwargs): ids say which path the case exercises.
CASES_2D = {
    "pointwise_tile4": ((2, 7, 5, 3), (12, 7, 1, 1), True, {}),
    "pointwise_tile1": ((1, 5, 11, 13), (3, 5, 1, 1), False, {}),
    "pointwise_aligned": ((2, 6, 4, 6), (8, 6, 1, 1), True, {}),
    "pointwise_aligned_tail": ((1, 5, 3, 4), (4, 5, 1, 1), False, {}),
    "pointwise_strided": ((1, 6, 9, 7), (8, 6, 1, 1), True, {"stride": 2}),
    "k3_s2_p1": ((2, 3, 11, 13), (8, 3, 3, 3), True, {"stride": 2, "padding": 1}),
    "k3_dilated_asym_pad": ((1, 3, 13, 11), (5, 3, 3, 3), False,
                            {"padding": (2, 1), "dilation": (2, 1)}),
    "k5_s3_rect": ((3, 4, 17, 19), (8, 4, 5, 3), True, {"stride": (3, 2), "padding": (2, 0)}),
    "groups2": ((1, 6, 9, 7), (8, 3, 3, 3), True, {"padding": 1, "groups": 2}),
    "depthwise": ((2, 7, 13, 11), (7, 1, 3, 3), True, {"padding": 1, "groups": 7}),
    "depthwise_s2_k5": ((1, 3, 9, 7), (3, 1, 5, 5), False,
                        {"stride": 2, "padding": 2, "groups": 3}),
    "depthwise_multiplier2": ((1, 3, 7, 5), (6, 1, 3, 3), True, {"groups": 3}),
    # conv2d_col.glsl, depthwise: dilation, rectangular strides and kernels, output
    # heights not a multiple of its 8 rows per invocation, a 7 x 7 window; 9 x 9 is
    # past its unrolling bound (conv2d.glsl's direct path).
    "depthwise_dilated_rect": ((2, 5, 11, 9), (5, 1, 3, 5), True,
                               {"padding": (2, 1), "dilation": (2, 1), "stride": (1, 2),
                                "groups": 5}),
    "depthwise_k7_w_stride2": ((3, 4, 19, 17), (4, 1, 7, 7), False,
                               {"padding": 3, "stride": (1, 2), "groups": 4}),
    "depthwise_k9_general_path": ((1, 2, 12, 12), (2, 1, 9, 9), True,
                                  {"padding": 4, "groups": 2}),
    "one_by_one_image": ((2, 4, 1, 1), (8, 4, 1, 1), True, {}),
    "kernel_covers_input": ((1, 3, 5, 5), (4, 3, 5, 5), True, {}),
}


@pytest.mark.parametrize("case", CASES_2D.values(), ids=CASES_2D.keys())
def test_conv2d(case):
    torch.manual_seed(0)
    x_shape, w_shape, has_bias, kw = case
    w = torch.randn(w_shape)
    b = torch.randn(w_shape[0]) if has_bias else None
    check_op(_conv(w, b, **kw), (torch.randn(x_shape),), ops=[CONV])


TRANSPOSED = {
    "s2_p1_outpad1_groups2": ((2, 6, 5, 4), (6, 4, 3, 3), True,
                              {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}),
    "s1_p0": ((1, 3, 7, 5), (3, 5, 3, 3), False, {}),
    "s3_dilated": ((1, 4, 5, 3), (4, 8, 3, 2), True,
                   {"stride": (3, 2), "padding": (1, 0), "dilation": (2, 1)}),
}


@pytest.mark.parametrize("case", TRANSPOSED.values(), ids=TRANSPOSED.keys())
def test_conv_transpose2d(case):
    torch.manual_seed(0)
    x_shape, w_shape, has_bias, kw = case
    w = torch.randn(w_shape)
    b = torch.randn(w_shape[1] * kw.get("groups", 1)) if has_bias else None
    check_op(lambda x: F.conv_transpose2d(x, w, b, **kw), (torch.randn(x_shape),),
             ops=[CONV])


def test_conv1d_and_conv_transpose1d():
    torch.manual_seed(0)
    w, b = torch.randn(8, 3, 3), torch.randn(8)
    wt = torch.randn(8, 5, 4)
    check_op(lambda x: F.conv1d(x, w, b, stride=2, padding=1, dilation=2),
             (torch.randn(2, 3, 29),), ops=[CONV])
    check_op(lambda x: F.conv_transpose1d(x, wt, None, stride=3, padding=1,
                                          output_padding=2),
             (torch.randn(1, 8, 11),), ops=[CONV])


def test_column_kernel_bounds():
    from vkdelegate.kernels.conv_columns import applies
    assert applies(False, True, [5, 5], [2, 2], [1, 1])      # EfficientNet's 5x5 s2
    assert not applies(False, True, [7, 7], [2, 2], [1, 1])  # past MAX_UNROLLED
    assert not applies(True, True, [3, 3], [1, 1], [1, 1])   # transposed
    assert not applies(False, False, [3, 3], [1, 1], [1, 1])  # weight at run time


def test_depthwise_1d_and_resize():
    torch.manual_seed(0)
    w1, b1 = torch.randn(6, 1, 5), torch.randn(6)
    check_op(lambda x: F.conv1d(x, w1, b1, padding=2, stride=2, groups=6),
             (torch.randn(2, 6, 23),), ops=[CONV])
    w, b = torch.randn(7, 1, 3, 3), torch.randn(7)
    n, h = torch.export.Dim("n", max=4), torch.export.Dim("h", min=3, max=20)
    check_op(_conv(w, b, padding=1, groups=7), (torch.randn(2, 7, 13, 6),), ops=[CONV],
             dynamic_shapes=({0: n, 2: h},),
             resize_inputs=[(torch.randn(1, 7, 3, 6),), (torch.randn(4, 7, 20, 6),)])


@pytest.mark.parametrize("case", ["stem_k3_s2_tile4", "depthwise_k5_s1_7x7",
                                  "depthwise_k3_s2_resize"])
def test_column_kernel_gpu_rows(monkeypatch, case):
    # GPUs' GPU_ROWS outputs per invocation (forced on llvmpipe) against eager: a
    # partly used last row block (13 / 4, 7 / 4) and a resize across row blocks.
    from vkdelegate.kernels import conv_columns
    monkeypatch.setattr(conv_columns, "rows_for", lambda info: conv_columns.GPU_ROWS)
    torch.manual_seed(0)
    if case == "stem_k3_s2_tile4":
        w, b = torch.randn(8, 3, 3, 3), torch.randn(8)
        check_op(_conv(w, b, padding=1, stride=2), (torch.randn(2, 3, 25, 18),),
                 ops=[CONV])
    elif case == "depthwise_k5_s1_7x7":
        w, b = torch.randn(12, 1, 5, 5), torch.randn(12)
        check_op(_conv(w, b, padding=2, groups=12), (torch.randn(1, 12, 7, 7),),
                 ops=[CONV])
    else:
        w, b = torch.randn(5, 1, 3, 3), torch.randn(5)
        h = torch.export.Dim("h", min=3, max=21)
        check_op(_conv(w, b, padding=1, stride=2, groups=5), (torch.randn(1, 5, 13, 9),),
                 ops=[CONV], dynamic_shapes=({2: h},),
                 resize_inputs=[(torch.randn(1, 5, 3, 9),), (torch.randn(1, 5, 21, 9),)])


@pytest.mark.parametrize("case", ["depthwise_k5_s2", "dense_k3_tile4", "groups3_tile1"])
def test_column_kernel_matches_the_direct_path(monkeypatch, case):
    # The same layer through conv2d_col.glsl and through conv2d.glsl's direct path.
    from vkdelegate.ops.families import convolution
    torch.manual_seed(0)
    w_shape, kw = {"depthwise_k5_s2": ((9, 1, 5, 5), {"padding": 2, "stride": 2,
                                                        "groups": 9}),
                   "dense_k3_tile4": ((8, 9, 3, 3), {"padding": 1}),
                   "groups3_tile1": ((6, 3, 3, 2), {"groups": 3, "stride": (2, 1)})}[case]
    w, b = torch.randn(w_shape), torch.randn(w_shape[0])
    x = torch.randn(2, 9, 14, 15)
    outs = []
    for use in (True, False):
        monkeypatch.setattr(convolution, "USE_COLUMNS", use)
        program = check_op(_conv(w, b, **kw), (x,), ops=[CONV])
        outs.append(program(x))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_constant_weight_with_a_bias_computed_at_run_time():
    # The column and pointwise kernels read an fp32 bias; an fp16 one computed at run
    # time keeps conv2d.glsl. Tolerance of fp16: the output rounding (test_conv2d_fp16).
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 1e-2)):
        w, wp = torch.randn(8, 3, 3, 3).to(dtype), torch.randn(8, 3, 1, 1).to(dtype)
        x, b = torch.randn(2, 3, 9, 7).to(dtype), torch.randn(8).to(dtype)
        check_op(lambda x, b: F.conv2d(x, w, b * 2, padding=1), (x, b), ops=[CONV],
                 rtol=tol, atol=tol)
        check_op(lambda x, b: F.conv2d(x, wp, b * 2), (x, b), ops=[CONV],
                 rtol=tol, atol=tol)


def test_weight_and_bias_computed_at_run_time():
    # Not constants: the shader reads the weight as stored, one channel at a time.
    torch.manual_seed(0)
    check_op(lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=2),
             (torch.randn(2, 4, 7, 5), torch.randn(6, 2, 3, 3), torch.randn(6)), ops=[CONV])
    check_op(lambda x, w: F.conv_transpose2d(x, w, stride=2),
             (torch.randn(1, 4, 5, 3), torch.randn(4, 3, 3, 3)), ops=[CONV])


def test_conv2d_fp16():
    # fp16 storage: inputs and outputs carry 11 significant bits, so an output of
    # magnitude ~10 is only known to ~5e-3; accumulation is fp32 on the device and in
    # eager's CPU kernel, so the difference is the output rounding plus one fp16 ulp.
    torch.manual_seed(0)
    w, b = torch.randn(8, 4, 3, 3).half(), torch.randn(8).half()
    wd, wp = torch.randn(4, 1, 3, 3).half(), torch.randn(4, 4, 1, 1).half()
    check_op(lambda x: F.conv2d(F.conv2d(x, wd, None, padding=1, groups=4), w, b,
                                stride=2),
             (torch.randn(2, 4, 11, 7).half(),), ops=[CONV], rtol=1e-2, atol=1e-2)
    # Pointwise over planes of 12 pixels: the 4-at-a-time loads of fp16 data.
    check_op(lambda x: F.conv2d(x, wp), (torch.randn(2, 4, 3, 4).half(),), ops=[CONV],
             rtol=1e-2, atol=1e-2)


def test_conv2d_dynamic_batch_and_size():
    torch.manual_seed(0)
    w, b = torch.randn(8, 3, 3, 3), torch.randn(8)
    batch, h, wd = (torch.export.Dim("n", max=4), torch.export.Dim("h", min=4, max=16),
                    torch.export.Dim("w", min=4, max=16))
    check_op(_conv(w, b, stride=2, padding=1), (torch.randn(3, 3, 13, 11),), ops=[CONV],
             dynamic_shapes=({0: batch, 2: h, 3: wd},),
             resize_inputs=[(torch.randn(1, 3, 7, 5),), (torch.randn(4, 3, 16, 16),)])


def test_pointwise_and_transposed_resize():
    torch.manual_seed(0)
    wp, wt = torch.randn(8, 5, 1, 1), torch.randn(8, 3, 2, 2)
    h = torch.export.Dim("h", min=2, max=12)

    def fn(x):
        return F.conv_transpose2d(F.conv2d(x, wp), wt, stride=2)
    check_op(fn, (torch.randn(1, 5, 11, 7),), ops=[CONV], dynamic_shapes=({2: h},),
             resize_inputs=(torch.randn(1, 5, 3, 7),))


@pytest.mark.parametrize("bounds", [(0.0, 6.0), (0.0, None), (None, 0.5), (-1, 1)],
                         ids=["relu6", "relu", "max_only", "int_bounds"])
def test_conv_with_clamp(bounds):
    torch.manual_seed(0)
    w, b = torch.randn(8, 3, 3, 3), torch.randn(8)
    lo, hi = bounds

    def fn(x):
        return torch.ops.et_vk.conv_with_clamp(x, w, b, [2, 2], [1, 1], [1, 1], False,
                                               [0, 0], 1, lo, hi)
    check_op(fn, (torch.randn(2, 3, 11, 7),), ops=[CLAMP])


def test_conv_with_clamp_depthwise_fp16():
    # Tolerance: fp16 output rounding, as in test_conv2d_fp16.
    torch.manual_seed(0)
    w = torch.randn(5, 1, 3, 3).half()

    def fn(x):
        return torch.ops.et_vk.conv_with_clamp(x, w, None, [1, 1], [1, 1], [1, 1], False,
                                               [0, 0], 5, 0.0, 6.0)
    check_op(fn, (torch.randn(1, 5, 7, 7).half(),), ops=[CLAMP], rtol=1e-2, atol=1e-2)


def _cpu_reasons(fn, inputs):
    ep = torch.export.export(type("M", (torch.nn.Module,), {"forward": lambda s, *a: fn(*a)})(),
                             inputs)
    program = to_backend(ep, VulkanPartitioner())
    report = next(iter(program.methods.values())).report
    return {d.op: "; ".join(d.reasons) for d in report.cpu_nodes}


def test_unsupported_convolutions_stay_on_cpu_with_a_reason():
    torch.manual_seed(0)
    w3 = torch.randn(2, 3, 3, 3, 3)
    reasons = _cpu_reasons(lambda x: F.conv3d(x, w3), (torch.randn(1, 3, 5, 5, 5),))
    assert "only 1-D and 2-D convolutions" in reasons[CONV]
    w = torch.randn(4, 3, 3, 3)
    reasons = _cpu_reasons(lambda x: F.conv2d(x.double(), w.double()),
                           (torch.randn(1, 3, 5, 5),))
    assert "float64" in reasons[CONV]


def test_conv2d_empty_batch():
    torch.manual_seed(0)
    w = torch.randn(4, 3, 3, 3)
    check_op(_conv(w, None, padding=1), (torch.randn(0, 3, 5, 7),), ops=[CONV])


def _random_case(seed: int):
    """A seeded random convolution: (fn, input) with every argument drawn."""
    g = torch.Generator().manual_seed(seed)

    def pick(*options):
        return options[int(torch.randint(len(options), (1,), generator=g))]
    spatial, transposed = pick(1, 2), pick(False, True)
    groups = pick(1, 1, 2, 3)
    icg, ocg = pick(1, 2, 3, 4), pick(1, 3, 4, 8)
    k = [pick(1, 2, 3, 5) for _ in range(spatial)]
    stride = [pick(1, 2, 3) for _ in range(spatial)]
    dilation = [pick(1, 1, 2) for _ in range(spatial)]
    padding = [pick(*range((kk - 1) * d // 2 + 1)) for kk, d in zip(k, dilation)]
    size = [pick(1, 5, 7, 11) for _ in range(spatial)]
    if not transposed:  # the window must fit: grow the input where it does not
        size = [max(s, d * (kk - 1) + 1 - 2 * p) for s, kk, d, p in
                zip(size, k, dilation, padding)]
    x = torch.randn((pick(1, 2, 3), groups * icg, *size), generator=g)
    bias = torch.randn(groups * ocg, generator=g) if pick(True, False) else None
    if transposed:
        w = torch.randn((groups * icg, ocg, *k), generator=g)
        out_pad = [pick(*range(max(s, d))) for s, d in zip(stride, dilation)]
        conv = F.conv_transpose1d if spatial == 1 else F.conv_transpose2d
        return (lambda x: conv(x, w, bias, stride, padding, out_pad, groups, dilation)), x
    w = torch.randn((groups * ocg, icg, *k), generator=g)
    conv = F.conv1d if spatial == 1 else F.conv2d
    return (lambda x: conv(x, w, bias, stride, padding, dilation, groups)), x


@pytest.mark.parametrize("seed", range(16))
def test_random_convolutions(seed):
    fn, x = _random_case(seed)
    check_op(fn, (x,), ops=[CONV])


def test_conv_with_clamp_keeps_nan_and_inf():
    # ATen's clamp propagates NaN, and an absent bound leaves +-inf untouched.
    torch.manual_seed(0)
    w = torch.ones(2, 1, 1, 1)
    x = torch.tensor([[[[float("nan"), float("inf"), -float("inf"), 3.0, -2.0]]]])

    def fn(x):
        return torch.ops.et_vk.conv_with_clamp(x, w, None, [1, 1], [0, 0], [1, 1], False,
                                               [0, 0], 1, 0.0, None)
    check_op(fn, (x,), ops=[CLAMP])


@pytest.mark.parametrize("gemm", [False, True, "tiled"],
                         ids=["default", "pointwise_gemm", "pointwise_tiled"])
def test_fp16_on_a_device_without_16bit_storage(vk_device, gemm, monkeypatch):
    # fp16 tensors held in 32-bit words (the IN4_T vec4 loads and OUT4_T stores of the
    # pointwise paths hold them as fp32): results round to fp16 at each store, like
    # eager's fp16. gemm: the GPUs' pointwise kernels (kernels/conv_pointwise.py), forced
    # on llvmpipe: conv2d_pw.glsl, or conv2d_pw_tiled.glsl on this 12-pixel plane.
    if gemm:
        from vkdelegate.kernels import conv_pointwise
        monkeypatch.setattr(conv_pointwise, "use_gemm", lambda info: True)
        monkeypatch.setattr(conv_pointwise, "TILED_ALIGNED", gemm == "tiled")
    rng = np.random.default_rng(5)
    x = rand(rng, (1, 4, 3, 4), "float16")
    w1, w2 = rand(rng, (8, 4, 1, 1), "float16"), rand(rng, (8, 1, 3, 3), "float16")
    m = GraphMaker()
    ix = m.input(x.shape, "float16")
    ints = [m.scalar([1, 1]), m.scalar([0, 0]), m.scalar([1, 1])]
    pw = m.op(CONV, [ix, m.constant(w1), m.scalar(None), *ints, m.scalar(False),
                     m.scalar([0, 0]), m.scalar(1)], (1, 8, 3, 4), "float16")
    dw = m.op(CONV, [pw, m.constant(w2), m.scalar(None), ints[0], ints[0], ints[2],
                     m.scalar(False), m.scalar([0, 0]), m.scalar(8)], (1, 8, 3, 4),
              "float16")
    m.output(dw)
    dev = Device(vk_device.info.name, validation=True, small_storage=False)
    try:
        with m.build(dev) as graph:
            assert graph.resolve(pw).device_dtype == "float32"
            got = graph.execute([x])[0]
        assert not dev.validation_messages
    finally:
        dev.close()
    ref = F.conv2d(torch.from_numpy(x).float(), torch.from_numpy(w1).float()).half()
    ref = F.conv2d(ref.float(), torch.from_numpy(w2).float(), padding=1, groups=8).half()
    assert got.dtype == np.float16
    # One fp16 rounding of the intermediate and of the result (values ~5): 1e-2.
    np.testing.assert_allclose(got.astype(np.float32), ref.float().numpy(),
                               rtol=1e-2, atol=1e-2)


def test_unbatched_conv2d():
    # F.conv2d on (C, H, W) exports as unsqueeze -> convolution -> squeeze.
    torch.manual_seed(0)
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    check_op(lambda x: F.conv2d(x, w, b, padding=1), (torch.randn(3, 7, 5),), ops=[CONV])


# ---- the pointwise implicit GEMM (kernels/conv_pointwise.py) -------------------------
# LAST_SUM_DEFAULT: whether the lowering picks LAST_SUM (its variants declared); tests
# that force it otherwise leave the declared-variant check out.
# GPUs take it by default; on llvmpipe the fixture forces it (use_gemm is read at load),
# in each form: conv2d_pw.glsl's "single" pass (SPLIT_K off) and "split" (the
# cross-workgroup split of the reduction, conv2d_pw.glsl SPLIT_OUT +
# conv2d_pw_reduce.glsl, wherever the input channels allow two splits:
# SPLIT_WORKGROUPS past any test's blocks); conv2d_pw_tiled.glsl (the batch as one
# GEMM) in its default blocks ("tiled": 32 x 128 up to 32 output channels, else 64 x
# 64), in 128 x 128 blocks ("tiled_large") and split across workgroups wherever 16
# channels a split allow ("tiled_split"); both splits also in one pass, the last split
# of each block adding the sums ("*_last_sum", LAST_SUM).
@pytest.fixture(params=["single", "split", "split_last_sum", "tiled", "tiled_large",
                        "tiled_split", "tiled_split_last_sum"])
def pointwise_gemm(request, monkeypatch):
    from vkdelegate.kernels import conv_pointwise
    form = request.param
    monkeypatch.setattr(conv_pointwise, "use_gemm", lambda info: True)
    monkeypatch.setattr(conv_pointwise, "TILED", form.startswith("tiled"))
    monkeypatch.setattr(conv_pointwise, "TILED_ALIGNED", True)
    monkeypatch.setattr(conv_pointwise, "SPLIT_K", form.startswith("split"))
    monkeypatch.setattr(conv_pointwise, "LAST_SUM", form.endswith("last_sum"))
    if form.endswith("last_sum") and not LAST_SUM_DEFAULT:
        # A form the lowering does not pick yet: its variants are not declared.
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)
    monkeypatch.setattr(conv_pointwise, "SPLIT_WORKGROUPS", 1 << 20)
    monkeypatch.setattr(conv_pointwise, "TILED_LARGE_BLOCKS",
                        0 if form == "tiled_large" else 1 << 20)
    monkeypatch.setattr(conv_pointwise, "TILED_SPLIT_BELOW",
                        1 << 20 if form.startswith("tiled_split") else 0)
    monkeypatch.setattr(conv_pointwise, "TILED_MIN_SPLIT_K", 16)
    if form == "tiled_large":  # every layer in 128 x 128 blocks, the narrow one too
        monkeypatch.setattr(conv_pointwise, "TILED_NARROW_OC", 0)
    from tests.ops.harness import spy_dispatches
    seen = spy_dispatches(monkeypatch)
    yield conv_pointwise
    want = "conv2d_pw_tiled" if form.startswith("tiled") else "conv2d_pw"
    assert want in seen, seen


@pytest.fixture(params=[False, True], ids=["two_pass", "last_sum"])
def pointwise_split(request, monkeypatch):
    """The split form forced (as ``pointwise_gemm``'s "split" and "split_last_sum");
    returns the list of (shader, SPLIT_OUT in its defines) of every dispatch recorded
    from then on (one convolution's: ``split_passes()``)."""
    from tests.ops.harness import spy_dispatches
    from vkdelegate.kernels import conv_pointwise
    monkeypatch.setattr(conv_pointwise, "use_gemm", lambda info: True)
    monkeypatch.setattr(conv_pointwise, "TILED", False)
    monkeypatch.setattr(conv_pointwise, "SPLIT_K", True)
    monkeypatch.setattr(conv_pointwise, "LAST_SUM", request.param)
    if request.param and not LAST_SUM_DEFAULT:
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # not declared yet
    monkeypatch.setattr(conv_pointwise, "SPLIT_WORKGROUPS", 1 << 20)
    return spy_dispatches(monkeypatch, lambda shader, d: (shader, "SPLIT_OUT" in d))


SPLIT_PASSES = [("conv2d_pw", True), ("conv2d_pw_reduce", False)]


def split_passes() -> list:
    """The dispatches of one split convolution in the form now set: two passes, or
    LAST_SUM's one."""
    from vkdelegate.kernels import conv_pointwise
    return [("conv2d_pw", True)] if conv_pointwise.LAST_SUM else SPLIT_PASSES


PW_CASES = {  # (input shape, output channels, bias): which part of the kernel
    "aligned_one_block": ((1, 8, 4, 4), 12, True),
    "unaligned_tail_blocks": ((2, 5, 7, 9), 37, False),       # P % 4 != 0, OC % 4 != 0
    "two_slices": ((1, 96, 3, 5), 20, True),                  # 96 channels: 2 K slices
    "eight_slices_uneven_k": ((3, 261, 5, 5), 70, True),      # 261 = 7 slices of 33, 30
    "eight_slices": ((2, 1152, 7, 7), 40, True),              # EfficientNet's 7 x 7 K
    "large_plane": ((2, 16, 37, 41), 24, True),               # many pixel blocks
    "one_pixel": ((2, 40, 1, 1), 9, False),
    "aligned_batches": ((3, 20, 4, 6), 70, True),           # P % 4 == 0: 4-vector stores
}


@pytest.mark.parametrize("case", PW_CASES.values(), ids=PW_CASES.keys())
def test_pointwise_gemm(pointwise_gemm, case):
    torch.manual_seed(0)
    x_shape, oc, has_bias = case
    w = torch.randn(oc, x_shape[1], 1, 1)
    b = torch.randn(oc) if has_bias else None
    check_op(_conv(w, b), (torch.randn(x_shape),), ops=[CONV])


def test_pointwise_gemm_slices():
    from types import SimpleNamespace

    from vkdelegate.kernels.conv_pointwise import slices
    gpu = SimpleNamespace(max_workgroup_invocations=1024, max_shared_memory=49152)
    assert slices(gpu, 1, 49, 192, 1152) == 8  # EfficientNet's 1152 -> 192 at 7 x 7
    assert slices(gpu, 8, 49, 320, 1152) == 8  # batch 8: 160 blocks
    assert slices(gpu, 1, 12544, 96, 16) == 1  # many blocks, short K
    assert slices(gpu, 1, 49, 192, 100) == 2   # 4 slices would sum 25 channels each
    assert slices(SimpleNamespace(max_workgroup_invocations=128, max_shared_memory=49152),
                  1, 49, 192, 1152) == 2
    # Vulkan's minimum 16 KiB of shared memory holds 3 slices' partial sums: 4 slices.
    assert slices(SimpleNamespace(max_workgroup_invocations=1024, max_shared_memory=16384),
                  1, 49, 192, 1152) == 4


def test_pointwise_split_k_form(monkeypatch):
    from types import SimpleNamespace

    from vkdelegate.kernels import conv_pointwise
    from vkdelegate.kernels.conv_pointwise import split_k
    gpu = SimpleNamespace(max_workgroup_invocations=1024, max_shared_memory=49152)
    # The default target (64 workgroups): 12 blocks of 1152 -> 192 take 9 splits of 4
    # slices (108 workgroups); 96 blocks at batch 8 and 147 keep one pass.
    assert conv_pointwise.SPLIT_WORKGROUPS == 64
    assert split_k(gpu, 1, 49, 192, 1152) == (9, 4)
    assert split_k(gpu, 1, 49, 192, 672) == (10, 2)
    assert split_k(gpu, 8, 49, 192, 1152) == (1, 8)
    assert split_k(gpu, 1, 196, 672, 112) == (1, 2)
    # A target of 132 workgroups (the H100's SMs):
    monkeypatch.setattr(conv_pointwise, "SPLIT_WORKGROUPS", 132)
    # EfficientNet-Lite0 at 7 x 7, batch 1: 12 blocks of 1152 -> 192 take 18 splits of
    # 2 slices (36 parts of 32 channels, 216 workgroups), 1152 -> 320 9 x 4.
    assert split_k(gpu, 1, 49, 192, 1152) == (18, 2)
    assert split_k(gpu, 1, 49, 320, 1152) == (9, 4)
    assert split_k(gpu, 1, 49, 192, 672) == (21, 1)
    assert split_k(gpu, 1, 196, 80, 480) == (7, 2)
    # batch 8: 96 blocks, 2 splits of 8 slices; 160 blocks and more keep one pass.
    assert split_k(gpu, 8, 49, 192, 1152) == (2, 8)
    assert split_k(gpu, 8, 49, 320, 1152) == (1, 8)
    assert split_k(gpu, 1, 196, 672, 112) == (1, 2)  # 147 blocks
    assert split_k(gpu, 1, 49, 192, 40) == (1, 1)     # 40 channels: one part of 32
    assert split_k(gpu, 1, 49, 192, 4608) == (18, 8)
    # One slice per workgroup (64 invocations at most): splits take every part, up to
    # MAX_SPLITS.
    one = SimpleNamespace(max_workgroup_invocations=64, max_shared_memory=49152)
    assert split_k(one, 1, 49, 192, 1152) == (conv_pointwise.MAX_SPLITS, 1)  # 36 parts


def test_pointwise_tiled_form(monkeypatch):
    """conv2d_pw_tiled.glsl's block and splits per layer (kernels/conv_pointwise.py
    ``tiled``) at EfficientNet-Lite0's shapes; None on CPU drivers and with TILED off."""
    from types import SimpleNamespace

    from vkdelegate.kernels import conv_pointwise
    from vkdelegate.kernels.conv_pointwise import tiled
    gpu = SimpleNamespace(type="discrete", max_workgroup_invocations=1024,
                          max_shared_memory=49152)
    # batch 8, 1152 -> 320 at 7 x 7: 392 columns; 12 blocks of 128 x 128, 35 of 64 x 64,
    # so 64 x 64 in 4 splits (140 workgroups).
    assert tiled(gpu, 8, 49, 320, 1152) == ((4, 4, 16), 4)
    # Planes of a multiple of 4 pixels: the tiled form where its blocks alone fill the
    # GPU (TILED_ALIGNED_FULL). batch 8, 16 -> 96 at 112 x 112: 784 blocks of 128 x 128,
    # one pass; 240 -> 80 at 14 x 14: 50 blocks of 64 x 64 would split, so
    # conv2d_pw.glsl; batch 1, 16 -> 96: 98 blocks of 128 x 128, 392 of 64 x 64.
    assert tiled(gpu, 8, 12544, 96, 16) == ((8, 8, 16), 1)
    assert tiled(gpu, 8, 196, 80, 240) is None
    assert tiled(gpu, 1, 12544, 96, 16) == ((4, 4, 16), 1)
    monkeypatch.setattr(conv_pointwise, "TILED_ALIGNED_FULL", False)
    assert tiled(gpu, 8, 12544, 96, 16) is None
    # TILED_ALIGNED: every aligned plane, split where it has few blocks.
    monkeypatch.setattr(conv_pointwise, "TILED_ALIGNED", True)
    assert tiled(gpu, 8, 12544, 96, 16) == ((8, 8, 16), 1)
    assert tiled(gpu, 8, 196, 80, 240) == ((4, 4, 16), 3)
    # 24 output channels: the narrow 32 x 128 block (196 workgroups at batch 8).
    assert tiled(gpu, 8, 3136, 24, 144) == (conv_pointwise.TILED_NARROW, 1)
    # Vulkan's guaranteed 16 KiB of shared memory: no 128 x 128 block (16.5 KiB).
    small = SimpleNamespace(type="discrete", max_workgroup_invocations=1024,
                            max_shared_memory=16384)
    assert conv_pointwise.tiled_shared_bytes((8, 8, 16)) > 16384
    assert tiled(small, 8, 12544, 96, 16) == ((4, 4, 16), 1)
    # A device of 128 invocations a workgroup (Vulkan's minimum) keeps conv2d_pw.glsl.
    assert tiled(SimpleNamespace(type="discrete", max_workgroup_invocations=128,
                                 max_shared_memory=49152), 8, 49, 320, 1152) is None
    # batch 1, 1152 -> 192 at 7 x 7: 3 blocks; 18 splits of 64 channels.
    assert tiled(gpu, 1, 49, 192, 1152) == ((4, 4, 16), 18)
    # Too few channels to split: one pass however few the blocks.
    assert tiled(gpu, 1, 49, 192, 100) == ((4, 4, 16), 1)
    assert tiled(SimpleNamespace(type="cpu"), 8, 49, 320, 1152) is None
    monkeypatch.setattr(conv_pointwise, "TILED", False)
    assert tiled(gpu, 8, 49, 320, 1152) is None


def test_pointwise_split_k_off(monkeypatch):
    from types import SimpleNamespace

    from vkdelegate.kernels import conv_pointwise
    gpu = SimpleNamespace(max_workgroup_invocations=1024, max_shared_memory=49152)
    monkeypatch.setattr(conv_pointwise, "SPLIT_K", False)
    assert conv_pointwise.split_k(gpu, 1, 49, 192, 1152) == (1, 8)


SPLIT_CASES = {  # (input shape, output channels, bias, dtype)
    "efficientnet_7x7_1152_to_192": ((1, 1152, 7, 7), 192, True, torch.float32),
    "batch3_14x14_fp16": ((3, 480, 14, 14), 80, True, torch.float16),
    "ic_uneven_oc37": ((1, 261, 7, 7), 37, False, torch.float32),  # 30-channel last split
    "batch3_7x7_fp16_no_bias_oc70": ((3, 672, 7, 7), 70, False, torch.float16),
    "batch3_14x14_aligned_oc33": ((3, 100, 14, 14), 33, True, torch.float32),
}


@pytest.mark.parametrize("case", SPLIT_CASES.values(), ids=SPLIT_CASES.keys())
def test_pointwise_split(pointwise_split, case):
    # Weights scaled by 1 / sqrt(IC): outputs ~1, so that fp16's tolerance (one fp16
    # rounding of the output, as test_pointwise_gemm_clamp_fp16_1d_and_resize) holds.
    torch.manual_seed(0)
    x_shape, oc, has_bias, dtype = case
    w = (torch.randn(oc, x_shape[1], 1, 1) / x_shape[1] ** 0.5).to(dtype)
    b = torch.randn(oc).to(dtype) if has_bias else None
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else {}
    check_op(_conv(w, b), (torch.randn(x_shape).to(dtype),), ops=[CONV], **tol)
    assert pointwise_split == split_passes()


def test_pointwise_split_1d(pointwise_split):
    torch.manual_seed(0)
    w, b = torch.randn(45, 200, 1) / 200 ** 0.5, torch.randn(45)
    check_op(lambda x: F.conv1d(x, w, b), (torch.randn(2, 200, 13),), ops=[CONV])
    assert pointwise_split == split_passes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_pointwise_split_clamp_keeps_nan_and_inf(pointwise_split, dtype):
    # conv_with_clamp's epilogue in the reduction pass: NaN (a NaN input channel)
    # stays NaN, +-inf (an inf input channel, weights of either sign) clamps to the
    # bounds, the rest is clamped to [0, 6] (relu6) or [-inf, 0.5] (no lower bound).
    torch.manual_seed(0)
    w = torch.randn(12, 96, 1, 1).to(dtype)
    b = torch.randn(12).to(dtype)
    x = torch.randn(3, 96, 5, 5)
    x[0, 7, 1, 2] = float("nan")
    x[1, 50, 3, 3] = float("inf")
    x[2, 95, 0, 4] = -float("inf")
    x = x.to(dtype)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else {}
    for lo, hi in ((0.0, 6.0), (None, 0.5)):
        pointwise_split.clear()

        def fn(x):
            return torch.ops.et_vk.conv_with_clamp(x, w, b, [1, 1], [0, 0], [1, 1], False,
                                                   [0, 0], 1, lo, hi)
        check_op(fn, (x,), ops=[CLAMP], **tol)
        assert pointwise_split == split_passes()


@pytest.mark.parametrize("tiled", [False, True], ids=["conv2d_pw", "conv2d_pw_tiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_pointwise_last_sum_same_bits_as_two_passes(tiled, dtype, monkeypatch):
    """LAST_SUM's one pass adds the splits' sums in the reduce pass's order with its
    float operations: bit for bit conv2d_pw_reduce.glsl's result, through the clamp
    (NaN and inf inputs included) and the fused residual add, on unaligned (7 x 7) and
    aligned (4 x 6) planes; and near eager."""
    import vkdelegate
    from tests.ops.harness import spy_dispatches
    from vkdelegate.kernels import conv_pointwise
    monkeypatch.setattr(conv_pointwise, "use_gemm", lambda info: True)
    monkeypatch.setattr(conv_pointwise, "TILED", tiled)
    monkeypatch.setattr(conv_pointwise, "TILED_ALIGNED", True)
    monkeypatch.setattr(conv_pointwise, "SPLIT_K", True)
    monkeypatch.setattr(conv_pointwise, "SPLIT_WORKGROUPS", 1 << 20)
    monkeypatch.setattr(conv_pointwise, "TILED_SPLIT_BELOW", 1 << 20)
    monkeypatch.setattr(conv_pointwise, "TILED_MIN_SPLIT_K", 16)
    seen = spy_dispatches(monkeypatch)
    if not LAST_SUM_DEFAULT:
        monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)  # not declared yet

    class Block(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv = torch.nn.Conv2d(c, c, 1)

        def forward(self, x):
            return torch.clamp(self.conv(x), -1.0, 6.0) + x

    torch.manual_seed(0)
    for shape in ((2, 96, 7, 7), (3, 64, 4, 6)):
        module = Block(shape[1]).to(dtype)
        x = torch.randn(shape)
        x[0, 5, 1, 2] = float("nan")
        x[1, 9, 3, 3] = float("inf")
        x = x.to(dtype)
        ep = torch.export.export(module, (x,))
        outs = []
        for last_sum in (False, True):
            monkeypatch.setattr(conv_pointwise, "LAST_SUM", last_sum)
            seen.clear()
            program = vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner())
            outs.append(program(x).numpy())
            program.close()
            assert ("conv2d_pw_reduce" in seen) != last_sum, seen
        np.testing.assert_array_equal(outs[1], outs[0])
        with torch.no_grad():
            want = module.float()(x.float()).numpy()
        module.to(dtype)
        tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-5,
                                                                             atol=1e-5)
        np.testing.assert_allclose(outs[1].astype(np.float32), want, **tol)


def test_pointwise_split_resize(pointwise_split):
    # The scratch is sized for the upper bounds; batch and height change at run time.
    torch.manual_seed(0)
    w, b = torch.randn(40, 200, 1, 1) / 200 ** 0.5, torch.randn(40)
    n, h = torch.export.Dim("n", max=4), torch.export.Dim("h", min=2, max=12)
    check_op(_conv(w, b), (torch.randn(2, 200, 11, 7),), ops=[CONV],
             dynamic_shapes=({0: n, 2: h},),
             resize_inputs=[(torch.randn(1, 200, 3, 7),), (torch.randn(4, 200, 12, 7),)])
    assert pointwise_split == split_passes()


def test_pointwise_gemm_clamp_fp16_1d_and_resize(pointwise_gemm):
    # Tolerance of the fp16 case: fp16 output rounding, as in test_conv2d_fp16.
    torch.manual_seed(0)
    w, b = torch.randn(40, 130, 1, 1), torch.randn(40)

    def fn(x):
        return torch.ops.et_vk.conv_with_clamp(x, w, b, [1, 1], [0, 0], [1, 1], False,
                                               [0, 0], 1, 0.0, 6.0)
    check_op(fn, (torch.randn(2, 130, 6, 5),), ops=[CLAMP])
    wh, bh = torch.randn(20, 72, 1, 1).half(), torch.randn(20).half()
    check_op(_conv(wh, bh), (torch.randn(3, 72, 5, 7).half(),), ops=[CONV],
             rtol=1e-2, atol=1e-2)
    check_op(_conv(wh, bh), (torch.randn(3, 72, 4, 5).half(),), ops=[CONV],
             rtol=1e-2, atol=1e-2)  # 20 pixels: the aligned loads and stores
    w1 = torch.randn(6, 9, 1)
    check_op(lambda x: F.conv1d(x, w1), (torch.randn(2, 9, 13),), ops=[CONV])
    n, h = torch.export.Dim("n", max=4), torch.export.Dim("h", min=2, max=12)
    check_op(_conv(w, b), (torch.randn(2, 130, 11, 7),), ops=[CONV],
             dynamic_shapes=({0: n, 2: h},),
             resize_inputs=[(torch.randn(1, 130, 3, 7),), (torch.randn(4, 130, 12, 7),)])


def test_pointwise_planes_not_a_multiple_of_four(monkeypatch):
    """CPU drivers' pointwise form (conv2d.glsl POINTWISE): planes whose size is not a
    multiple of 4 (7 x 7, after a resize 5 x 3) read as vec4s when the input channels
    are a multiple of 4 (PW_SHIFTED, the tile's pixels picked out of 3 vec4s; the last
    batch element's last tile reads past the input's end, clamped, and stores nothing
    from there), element by element otherwise; both against eager, with bias, clamp
    and the residual add."""
    from tests.ops.harness import spy_dispatches
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "PW_SHIFTED" in d,
                                                          "POINTWISE" in d))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(8, 12, 1), torch.nn.Conv2d(12, 12, 1)
            self.c = torch.nn.Conv2d(6, 4, 1)

        def forward(self, x, y):
            h = torch.clamp(self.a(x), 0, 6)
            return self.b(h) + h, self.c(y)

    torch.manual_seed(0)
    h, w = torch.export.Dim("h", min=1, max=7), torch.export.Dim("w", min=1, max=7)
    check_op(Net(), (torch.randn(2, 8, 7, 7), torch.randn(3, 6, 7, 7)),
             ops=["aten.convolution.default"],
             dynamic_shapes={"x": {2: h, 3: w}, "y": None},
             resize_inputs=(torch.randn(2, 8, 5, 3), torch.randn(3, 6, 7, 7)))
    pointwise = [s[1] for s in seen if s[0] == "conv2d" and s[2]]
    if not pointwise:
        pytest.skip("this device runs pointwise convolutions on conv2d_pw.glsl")
    assert sorted(pointwise) == [False, True, True], seen


def test_pointwise_texel_form(monkeypatch):
    """CPU drivers read the pointwise path's packed weights and input vec4s as uniform
    texel buffers (conv2d.glsl PW_TEXEL, runtime/texel.py): against eager with clamp
    and the residual add, 7 x 7 planes (PW_SHIFTED) resized to 8 x 8 (aligned) and
    3 x 5, and fp16 with one output channel per invocation (an r32f weight view).
    GPUs never take it (conv2d_pw.glsl)."""
    from tests.ops.harness import spy_dispatches
    from vkdelegate.runtime import default_device
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "POINTWISE" in d,
                                                          "PW_TEXEL" in d))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(16, 12, 1), torch.nn.Conv2d(12, 12, 1)

        def forward(self, x):
            h = torch.clamp(self.a(x), 0, 6)
            return self.b(h) + h

    torch.manual_seed(0)
    h, w = torch.export.Dim("h", min=1, max=8), torch.export.Dim("w", min=1, max=8)
    check_op(Net(), (torch.randn(2, 16, 7, 7),), ops=[CLAMP, "vkdelegate.conv_add.default"],
             dynamic_shapes=({2: h, 3: w},),
             resize_inputs=[(torch.randn(2, 16, 8, 8),), (torch.randn(2, 16, 3, 5),)])
    wh, bh = torch.randn(6, 8, 1, 1).half(), torch.randn(6).half()
    check_op(_conv(wh, bh), (torch.randn(1, 8, 5, 5).half(),), ops=[CONV],
             rtol=1e-2, atol=1e-2)
    texel = [s[2] for s in seen if s[0] == "conv2d" and s[1]]
    if default_device().texel_inputs:
        assert texel == [True] * 3, seen
    else:
        assert not any(s[2] for s in seen), seen


def test_column_texel_form(monkeypatch):
    """CPU drivers read conv2d_col.glsl's input and packed weights as uniform texel
    buffers (COL_TEXEL; an input load outside the plane reads a clamped index and
    keeps 0): depthwise 3 x 3 at stride 2 resized, a dense 3 x 3 with 4 output
    channels per invocation, fp16 depthwise 5 x 5 (an r16f input view), against eager.
    GPUs never take it."""
    from tests.ops.harness import spy_dispatches
    from vkdelegate.runtime import default_device
    seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "COL_TEXEL" in d))
    torch.manual_seed(0)
    wd, bd = torch.randn(6, 1, 3, 3), torch.randn(6)
    h = torch.export.Dim("h", min=3, max=13)
    check_op(_conv(wd, bd, stride=2, padding=1, groups=6), (torch.randn(2, 6, 11, 9),),
             ops=[CONV], dynamic_shapes=({2: h},),
             resize_inputs=[(torch.randn(2, 6, 13, 9),), (torch.randn(2, 6, 3, 9),)])
    check_op(_conv(torch.randn(8, 3, 3, 3), None, padding=1), (torch.randn(1, 3, 7, 5),),
             ops=[CONV])
    wh = torch.randn(4, 1, 5, 5).half()
    check_op(_conv(wh, None, padding=2, groups=4), (torch.randn(1, 4, 9, 9).half(),),
             ops=[CONV], rtol=1e-2, atol=1e-2)
    col = [s[1] for s in seen if s[0] == "conv2d_col"]
    assert len(col) == 3, seen
    assert all(col) if default_device().texel_inputs else not any(col), seen
