"""sdpa_coopmat_wg.glsl (float16 prefill attention on workgroup-scope cooperative
matrices, VK_NV_cooperative_matrix2) against eager, and its choice
(kernels/attention.py ``coop2_fits``).

The choice tests are pure Python. The kernel cases need a device whose capability table
has VK_NV_cooperative_matrix2 (NVIDIA, with glslang 15 to compile the shader) and the
validation layer off (the suite's layer rejects the cooperative-matrix features), so
they run in a subprocess with VKDELEGATE_VALIDATION=0, as test_sdpa_coopmat.py's do;
elsewhere (lavapipe) the test skips with the reason. Each case asserts against eager
(check_op, the fp16 tolerance of tests/ops/attention_reference.py), that
sdpa_coopmat_wg.glsl ran and, where marked, that the early exit is exact (bit-identical
outputs with it off). Cases: causal and not, grouped-query heads, query and key
lengths that are no multiple of the 64-row / 64-key tiles, keys fewer and more than
queries, head dims 64, 128 and 80 / 48 (padded to the bucket: zeros past E).
"""
import sys
from types import SimpleNamespace


from tests.ops.unvalidated import NO_DEVICE, run_cases_unvalidated
from tests.ops.test_gemm_coopmat_wg import FP16, nv2_caps
from vkdelegate.capabilities import Capabilities, FlexibleMatrixShape
from vkdelegate.kernels import attention

CAPS = nv2_caps((32, 16, 16), 128, 1024, attention.COOP2_REQUIRES)
INFO = SimpleNamespace(type="discrete", capabilities=CAPS, subgroup_ops=("shuffle",),
                       max_shared_memory=49152)


def _t(*shape, dtype="float16"):
    return SimpleNamespace(max_shape=shape, dtype=dtype)


def _attention(**kw):
    a = dict(q=_t(1, 32, 2048, 128), k=_t(1, 8, 2048, 128), v=_t(1, 8, 2048, 128),
             out=_t(1, 32, 2048, 128), causal=True)
    a.update(kw)
    return attention.Attention(**a)


def test_choice():
    assert attention.coop2_fits(INFO, _attention(), 128) == 128
    assert attention.coop2_fits(INFO, _attention(), 64) == 128
    # What it does not cover goes to sdpa_coopmat.glsl.
    for why, a, d in [
        ("a mask tensor", _attention(mask=_t(1, 1, 2048, 2048, dtype="bool")), 128),
        ("a window", _attention(window=128), 128),
        ("[B, L, H, D]", _attention(seq_first=True), 128),
        ("a head dim not a multiple of 8", _attention(q=_t(1, 32, 2048, 36)), 64),
        ("head-dim bucket 32", _attention(), 32),
        ("fp32", _attention(q=_t(1, 32, 2048, 128, dtype="float32")), 128),
        ("start_pos on the device (not yet run on a GPU)", _attention(start=_t(1)), 128),
        ("NaN rows (not yet run on a GPU)", _attention(nan_rows=True), 128),
    ]:
        assert attention.coop2_fits(INFO, a, d) == 0, why
    assert attention.coop2_fits(
        SimpleNamespace(**{**vars(INFO), "capabilities": CAPS.without(
            "cooperativeMatrixTensorAddressing")}), _attention(), 128) == 0
    coarse = Capabilities(**{**vars(CAPS), "flexible_matrix_shapes": (
        FlexibleMatrixShape(32, 128, 16, *FP16, "WORKGROUP", 256),)})
    assert attention.coop2_threads(coarse, 128) == 0  # 128 does not divide BC = 64
    attention.COOP2_ENABLED = False
    try:
        assert attention.coop2_fits(INFO, _attention(), 128) == 0
    finally:
        attention.COOP2_ENABLED = True


def test_workgroup_scope_attention_matches_eager():
    run_cases_unvalidated("tests.ops.test_sdpa_coopmat_wg")


def run_cases() -> None:
    """The cases (in the subprocess): exit NO_DEVICE when the device cannot run
    sdpa_coopmat_wg.glsl, else raise on the first mismatch."""
    from tests.ops.attention_reference import check_kernel_case, half_qkv, sdpa_fn
    from vkdelegate.runtime import default_device

    info = default_device().info
    threads = attention.coop2_threads(info.capabilities, 128)
    half = ("float16", "float16")
    if not threads or not attention.coop_fits(info, half, half, half):
        print(f"{info.name} cannot run sdpa_coopmat_wg.glsl (needs "
              f"{', '.join(attention.COOP2_REQUIRES)} with a fitting flexible shape, "
              f"glslang 15 and validation off)")
        sys.exit(NO_DEVICE)

    def case(what, fn, args, exact=False):
        check_kernel_case(what, attention.COOP2, fn, args, exact=exact)

    q, k, v = half_qkv(4, 2, 200, 200, 64)
    case("causal 200, gqa 2, E 64", sdpa_fn(is_causal=True, enable_gqa=True), (q, k, v),
         exact=True)
    q, k, v = half_qkv(4, 4, 37, 70, 48, 16, seed=1)
    case("no mask 37 x 70, E 48, Ev 16", sdpa_fn(), (q, k, v))
    q, k, v = half_qkv(4, 2, 320, 320, 128, seed=3)
    case("causal 320, E 128", sdpa_fn(is_causal=True, enable_gqa=True), (q, k, v), exact=True)
    q, k, v = half_qkv(2, 2, 130, 300, 80, seed=4)
    case("no mask 130 x 300, E 80", sdpa_fn(), (q, k, v))
    q, k, v = half_qkv(2, 2, 300, 130, 128, seed=5)
    case("causal 300 x 130 (fewer keys than queries)", sdpa_fn(is_causal=True), (q, k, v),
         exact=True)
    q, k, v = half_qkv(2, 2, 1024, 1024, 128, seed=6)
    case("causal 1024, E 128", sdpa_fn(is_causal=True), (q, k, v), exact=True)
    print("all cases passed")
