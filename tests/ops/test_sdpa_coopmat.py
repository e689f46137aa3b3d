"""sdpa_coopmat.glsl (float16 prefill attention on cooperative matrices) against eager,
on devices that have VK_KHR_cooperative_matrix.

The suite runs under the Khronos validation layer, and the one it installs (Debian 12's
1.3.239) rejects the cooperative-matrix feature, so devices created for tests run the
portable kernels (vkdelegate/runtime/device.py). These cases therefore run in a
subprocess with VKDELEGATE_VALIDATION=0; there each asserts (through check_op) against
eager, that sdpa_coopmat.glsl ran (the variants check_op records) and, where marked,
that the early exit is exact. Without cooperative matrices (lavapipe) the test
skips with the reason.
"""
import sys

import pytest
import torch

from tests.ops.unvalidated import NO_DEVICE, run_cases_unvalidated



def test_coopmat_forms_match_eager():
    run_cases_unvalidated("tests.ops.test_sdpa_coopmat")


def test_shared_arrays_are_whole_16_byte_units():
    # coopMatLoad / coopMatStore need 16-byte aligned shared addresses, and the driver
    # lays the shared arrays out in an order of its own: a 12-byte tile_live[3] (the
    # per-tile vote of boolean masks with the early exit, replaced by the block map
    # since) put the arrays after it off that alignment on the H200 (wrong outputs).
    # Every form's shared arrays, boolean masks included whatever COOP_BOOL_MASK says,
    # must be whole 16-byte units. Compiles only: runs on lavapipe.
    from tests.runtime.spirv_reflect import Module
    from vkdelegate.shaders.bindings import binding_defines
    from vkdelegate.shaders.compiler import default_compiler
    from vkdelegate.kernels import attention

    compiler = default_compiler()
    if not compiler.supports("GL_KHR_cooperative_matrix"):
        pytest.skip("glslang cannot compile GL_KHR_cooperative_matrix")
    half = ("float16", "float16")
    masks = {"none": None, "bool": ("bool", "bool"), "float": half}
    for name, mask in masks.items():
        for d_max in (32, 64, 128):
            for skip in (True, False):
                for causal in (False, True) if mask is None else (False,):
                    d = attention.coop_defines(half, half, half, half, mask, causal=causal,
                                               window=False, d_max=d_max, skip=skip)
                    spirv = compiler.compile(attention.COOP,
                                             binding_defines(attention.COOP, d), "vulkan1.3")
                    sizes = Module(spirv).workgroup_bytes()
                    assert "k_sh" in sizes and "s_sh" in sizes, sizes
                    # NVIDIA's maxComputeSharedMemorySize (48 KiB) with both buffers
                    assert sum(sizes.values()) <= 49152, (name, d_max, sizes)
                    # boolean masks with the early exit read the block map: no vote
                    assert ("TILE_MAP" in d) == (mask == masks["bool"] and skip), d
                    assert "tile_live" not in sizes, sizes
                    odd = {k: n for k, n in sizes.items() if n % 16}
                    assert not odd, f"mask {name}, D {d_max}, skip {skip}: {odd}"


def run_cases() -> None:
    """The cases (in the subprocess): exit NO_DEVICE when the device cannot run
    sdpa_coopmat.glsl for float16, else raise on the first mismatch."""
    from tests.ops.attention_reference import (CUSTOM, SDPA, SLIDING, check_kernel_case,
                                               custom_fn, half_qkv, sdpa_fn, sliding_fn,
                                               window_mask)
    from vkdelegate.backend.custom_ops import ensure_defined
    from vkdelegate.kernels import attention
    from vkdelegate.runtime import default_device

    half = ("float16", "float16")
    if not attention.coop_fits(default_device().info, half, half, half):
        print("the device has no cooperative matrices sdpa_coopmat.glsl can use")
        sys.exit(NO_DEVICE)
    ensure_defined()
    # The forms sdpa_coopmat_wg.glsl would take on a device with VK_NV_cooperative_
    # matrix2 (no mask tensor) stay on this kernel here (test_sdpa_coopmat_wg.py).
    attention.COOP2_ENABLED = False

    def case(what, fn, args, ops=(SDPA,), exact=False):
        check_kernel_case(f"STAGES {attention.COOP_STAGES}: {what}", attention.COOP, fn,
                          args, ops, exact)

    # Both forms of the K / V buffers (kernels/attention.py COOP_STAGES): one buffer,
    # and two with the next tile loaded during the current one's products.
    for stages in (1, 2):
        attention.COOP_STAGES = stages
        q, k, v = half_qkv(4, 2, 200, 200, 64)
        case("causal 200, gqa 2", sdpa_fn(is_causal=True, enable_gqa=True), (q, k, v), exact=True)
        q, k, v = half_qkv(4, 4, 37, 70, 48, 16, seed=1)
        case("no mask 37 x 70, E 48, Ev 16", sdpa_fn(), (q, k, v))
        q, k, v = half_qkv(2, 2, 100, 130, 32, seed=2)
        mask = torch.randn(1, 2, 100, 130).half()
        mask[:, :, 7] = float("-inf")  # a fully masked row: 0, as ATen
        case("float mask 100 x 130, a fully masked row", sdpa_fn(), (q, k, v, mask))
        q, k, v = half_qkv(4, 2, 320, 320, 128, seed=3)
        case("causal 320, E 128", sdpa_fn(is_causal=True, enable_gqa=True), (q, k, v),
             exact=True)
        fmask = torch.where(window_mask(320, 320, 100)[None, None], torch.randn(320, 320),
                            torch.tensor(float("-inf"))).half()
        case("float window mask 320, E 128", sdpa_fn(enable_gqa=True), (q, k, v, fmask),
             exact=True)
        case("sliding window op 320, window 100", sliding_fn(100, 0), (q, k, v), ops=(SLIDING,),
             exact=True)
        torch.manual_seed(4)
        qc, kc, vc = (torch.randn(1, n, h, 64).half() for n, h in ((40, 8), (120, 2), (120, 2)))
        case("custom_sdpa [B, L, H, D], start_pos 50", custom_fn(50), (qc, kc, vc), ops=(CUSTOM,))
        q, k, v = half_qkv(4, 2, 320, 320, 128, seed=3)
        if attention.COOP_BOOL_MASK:  # else boolean masks run sdpa_tiled.glsl
            case("bool window mask 320, E 128", sdpa_fn(enable_gqa=True),
                 (q, k, v, window_mask(320, 320, 100)[None, None]), exact=True)
            torch.manual_seed(6)
            bmask = torch.rand(200, 200) > 0.5  # random keys, 32-key blocks off, a dead row
            bmask[:, 32:96] = False
            bmask[:64, 128:] = False
            bmask[5] = False
            q, k, v = half_qkv(2, 2, 200, 200, 64, seed=6)
            case("bool blocks 200, a fully masked row", sdpa_fn(), (q, k, v, bmask), exact=True)
            # The block map (64 x 32 blocks): per-head and broadcast block-sparse masks with
            # dead query blocks, full and partial tiles, lengths not multiples of the tiles.
            from tests.ops.test_sdpa_tile_map import block_mask
            q, k, v = half_qkv(4, 2, 141, 203, 128, seed=8)
            case("bool per-head block mask 141 x 203, E 128", sdpa_fn(enable_gqa=True),
                 (q, k, v, block_mask((1, 4, 141, 203), seed=8)), exact=True)
            case("bool broadcast block mask 141 x 203, E 128", sdpa_fn(enable_gqa=True),
                 (q, k, v, block_mask((1, 1, 141, 203), seed=9)), exact=True)
        q, k, v = half_qkv(2, 2, 90, 75, 36, 20, seed=7)  # head dims not multiples of 8: scalar loads
        case("causal 90 x 75, E 36, Ev 20", sdpa_fn(is_causal=True), (q, k, v))
        q, k, v = half_qkv(2, 2, 1024, 1024, 128, seed=5)
        case("causal 1024, E 128", sdpa_fn(is_causal=True), (q, k, v), exact=True)
    print("all cases passed")
