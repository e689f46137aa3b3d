"""Nearest and bilinear upsampling (the .vec overloads) against eager."""
import pytest
import torch
import torch.nn.functional as F

from tests.ops.harness import check_op

NEAREST_VEC, BILINEAR_VEC = "aten.upsample_nearest2d.vec", "aten.upsample_bilinear2d.vec"

RESIZES = {
    "scale2": dict(scale_factor=2),
    "scale_1_7": dict(scale_factor=1.7),
    "scale_rect": dict(scale_factor=(3, 0.5)),
    "size_up": dict(size=(11, 13)),
    "size_down": dict(size=(3, 2)),
    "size_same": dict(size=(5, 7)),
}


@pytest.mark.parametrize("kw", RESIZES.values(), ids=RESIZES.keys())
def test_nearest(kw):
    torch.manual_seed(0)
    # Nearest copies input values: exact.
    check_op(lambda x: F.interpolate(x, mode="nearest", **kw), (torch.randn(2, 3, 5, 7),),
             ops=[NEAREST_VEC], rtol=0, atol=0)


@pytest.mark.parametrize("align_corners", [False, True], ids=["half_pixel", "align"])
@pytest.mark.parametrize("kw", RESIZES.values(), ids=RESIZES.keys())
def test_bilinear(kw, align_corners):
    torch.manual_seed(0)
    check_op(lambda x: F.interpolate(x, mode="bilinear", align_corners=align_corners, **kw),
             (torch.randn(2, 3, 5, 7),), ops=[BILINEAR_VEC])


def test_bilinear_to_one_pixel_and_from_one_pixel():
    torch.manual_seed(0)
    for align in (False, True):
        check_op(lambda x: F.interpolate(x, size=(1, 1), mode="bilinear",
                                         align_corners=align),
                 (torch.randn(1, 2, 5, 3),), ops=[BILINEAR_VEC])
        check_op(lambda x: F.interpolate(x, size=(3, 4), mode="bilinear",
                                         align_corners=align),
                 (torch.randn(1, 2, 1, 1),), ops=[BILINEAR_VEC])


def test_fp16():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 5, 7).half()
    check_op(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), (x,),
             ops=[NEAREST_VEC], rtol=0, atol=0)
    check_op(lambda x: F.interpolate(x, size=(9, 9), mode="nearest"), (x,),
             ops=[NEAREST_VEC], rtol=0, atol=0)
    # Bilinear: a convex combination of inputs ~1 computed in fp32, rounded to fp16
    # (11 bits): within 1e-3 of eager, which computes in fp32 as well.
    check_op(lambda x: F.interpolate(x, size=(9, 11), mode="bilinear"), (x,),
             ops=[BILINEAR_VEC], rtol=1e-3, atol=1e-3)
    check_op(lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear",
                                     align_corners=True), (x,),
             ops=[BILINEAR_VEC], rtol=1e-3, atol=1e-3)


def test_resize():
    torch.manual_seed(0)
    h, w = torch.export.Dim("h", min=2, max=12), torch.export.Dim("w", min=2, max=12)
    check_op(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
             (torch.randn(1, 3, 5, 7),), ops=[NEAREST_VEC], dynamic_shapes=({2: h, 3: w},),
             resize_inputs=(torch.randn(1, 3, 12, 3),))
    check_op(lambda x: F.interpolate(x, size=(8, 8), mode="bilinear"),
             (torch.randn(1, 3, 5, 7),), ops=[BILINEAR_VEC], dynamic_shapes=({2: h},),
             resize_inputs=(torch.randn(1, 3, 11, 7),))


@pytest.mark.parametrize("seed", range(8))
def test_random_sizes_and_scales(seed):
    # Sizes and scale factors whose source indices fall on and between input pixels.
    g = torch.Generator().manual_seed(seed)

    def pick(*options):
        return options[int(torch.randint(len(options), (1,), generator=g))]
    x = torch.randn((pick(1, 2), pick(1, 3), pick(2, 3, 5, 8), pick(2, 4, 7)), generator=g)
    if pick(True, False):
        kw = dict(size=(pick(1, 2, 6, 13), pick(1, 3, 9, 16)))
    else:
        kw = dict(scale_factor=(pick(0.5, 1.5, 2.0, 2.7), pick(0.75, 1.0, 3.0, 3.3)))
    check_op(lambda x: F.interpolate(x, mode="nearest", **kw), (x,), ops=[NEAREST_VEC],
             rtol=0, atol=0)
    align = pick(False, True)
    check_op(lambda x: F.interpolate(x, mode="bilinear", align_corners=align, **kw), (x,),
             ops=[BILINEAR_VEC])


def test_more_planes_than_one_grid_column():
    # 65600 output planes of 8x8: more than 65535 workgroups along z (see test_pool.py).
    torch.manual_seed(0)
    check_op(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
             (torch.randn(1, 65600, 4, 4),), ops=[NEAREST_VEC], rtol=0, atol=0)
