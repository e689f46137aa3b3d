"""The decode attention kernel (sdpa_decode.glsl, kernels/attention_decode.py: the
keys of few query rows spread over a workgroup; GPUs only, forced here on lavapipe)
against eager: the Llama-3.2-1B decode step (32 / 8 heads, head dim 64, a static
256-position cache with HF's boolean mask), several rows per workgroup, causal,
sliding windows, float masks, head dims that are not multiples of 4 (scalar loads)
and 256, split-K over long caches, ExecuTorch's [B, S, H, D] layout with start_pos,
fully masked rows, fp32 and fp16, subgroup and shared-memory reductions, and the
early exit bit-identical on and off. The one-row cases run in both forms: the
workgroup form and the lanes form (sdpa_decode_lanes.glsl, ``dec.LANES_FORM``)."""
import pytest
import torch

from tests.ops.attention_reference import (CUSTOM, FP16_TOL, FP32_TOL, OFF, SDPA, SLIDING,
                                           cache_qkv, custom_fn, eager_cache_attention,
                                           sdpa_fn, sliding_fn)
from tests.ops import coverage
from tests.ops.harness import check_op
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.kernels import attention_decode as dec

ensure_defined()


@pytest.fixture
def decode(monkeypatch):
    """sdpa_decode.glsl wherever its rows fit, on the CPU driver too; asserts that the
    test dispatched it."""
    calls = []
    dispatch = dec.dispatch
    monkeypatch.setattr(dec, "use_decode", lambda info, l, hq, hk, d:
                        dec.pack(l, hq, hk, d) is not None)
    monkeypatch.setattr(dec, "dispatch", lambda *a, **kw: calls.append(1) or
                        dispatch(*a, **kw))
    yield
    assert calls, "sdpa_decode.glsl was not dispatched"


@pytest.fixture(params=[False, True], ids=["workgroup", "lanes"])
def form(request, monkeypatch):
    """Both one-row forms: sdpa_decode.glsl and sdpa_decode_lanes.glsl (asserted to
    have been taken when on: the device has subgroup shuffles)."""
    monkeypatch.setattr(dec, "LANES_FORM", request.param)
    taken = []
    lanes_for = dec.lanes_for
    monkeypatch.setattr(dec, "lanes_for", lambda *a: taken.append(lanes_for(*a)) or taken[-1])
    yield request.param
    if request.param:
        assert any(t is not None for t in taken), "the lanes form was not taken"


def _tol(dtype):
    return FP32_TOL if dtype == torch.float32 else FP16_TOL


def _on_off(fn, args, ops, dtype):
    """Vulkan's output (checked against eager), asserted bit-identical with the early
    exit switched off."""
    on = check_op(fn, args, ops=ops, **_tol(dtype))
    off = check_op(fn, args, ops=ops, **_tol(dtype), options=OFF)
    out = on(*args)
    assert torch.equal(out, off(*args))
    return out


def test_kernel_choice(monkeypatch):
    assert dec.pack(1, 32, 8, 64) == 1      # Llama-3.2-1B decode: one head per workgroup
    assert dec.pack(3, 32, 8, 64) == 1      # one head's 3 rows per workgroup
    assert dec.pack(9, 4, 4, 64) is None    # 9 rows of one head: sdpa.glsl
    assert dec.pack(2, 8, 2, 256) == 1      # 4 rows at most at head dim 256
    monkeypatch.setattr(dec, "PACK_GQA", True)
    assert dec.pack(1, 32, 8, 64) == 4      # packed: the 4 heads of a K/V head together
    assert dec.pack(3, 32, 8, 64) == 1      # 12 rows do not fit 8
    assert [dec.rows_for(r) for r in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert dec.splits_for(8, 256) == 1 and dec.splits_for(8, 4096) == 16
    assert dec.splits_for(256, 4096) == 1


@pytest.fixture(params=[False, True], ids=["one_head", "packed"])
def packed(request, monkeypatch):
    """Both workgroup forms: one query head per workgroup (the default) and the query
    heads of one K/V head together (PACK_GQA)."""
    monkeypatch.setattr(dec, "PACK_GQA", request.param)
    return request.param


def test_llama_decode_step_packed(decode, monkeypatch):
    # The Llama-3.2-1B step below with its 4 query heads per K/V head in one workgroup.
    monkeypatch.setattr(dec, "PACK_GQA", True)
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, h, n, 64).to(torch.float16)
               for h, n in ((32, 1), (8, 256), (8, 256)))
    mask = (torch.arange(256) <= 77)[None, None, None, :]
    _on_off(sdpa_fn(enable_gqa=True), (q, k, v, mask), [SDPA], torch.float16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("subgroup", [True, False])
@pytest.mark.parametrize("start", [0, 37, 255])
def test_llama_decode_step_static_cache(decode, form, monkeypatch, dtype, subgroup, start):
    # One token of 32 query heads over a 256-position cache of 8 K/V heads, the keys
    # up to the token's position attended (HF's static-cache mask).
    if not subgroup:
        monkeypatch.setattr(dec, "has_subgroup_arithmetic", lambda info: False)
    torch.manual_seed(start)
    q, k, v = (torch.randn(1, h, n, 64).to(dtype) for h, n in ((32, 1), (8, 256), (8, 256)))
    mask = (torch.arange(256) <= start)[None, None, None, :]
    _on_off(sdpa_fn(enable_gqa=True), (q, k, v, mask), [SDPA], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mode", ["causal", "float", "none"])
def test_rows_and_masks(decode, packed, dtype, mode):
    # 2 query rows x 4 heads per K/V head (8 rows per workgroup packed, else 2), 300
    # keys (not a multiple of the 128-key chunk); an additive float mask with -inf
    # entries.
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, h, n, 32).to(dtype) for h, n in ((8, 2), (2, 300), (2, 300)))
    if mode == "float":
        mask = torch.randn(2, 8, 2, 300).to(dtype)
        mask[..., 100:180] = float("-inf")
        _on_off(sdpa_fn(enable_gqa=True), (q, k, v, mask), [SDPA], dtype)
    else:
        _on_off(sdpa_fn(enable_gqa=True, is_causal=mode == "causal"), (q, k, v), [SDPA],
                dtype)


@pytest.mark.parametrize("e,ev", [(30, 30), (64, 20), (18, 40)])
def test_head_dims_not_multiples_of_four_and_different_ev(decode, e, ev):
    # Scalar K / V loads (a head dim not a multiple of 4), Ev != E; 3 heads of 3 rows.
    torch.manual_seed(2)
    q, k = torch.randn(1, 3, 3, e), torch.randn(1, 3, 200, e)
    v = torch.randn(1, 3, 200, ev)
    check_op(sdpa_fn(), (q, k, v), ops=[SDPA], **FP32_TOL)


def test_head_dim_256(decode):
    # The workgroup form: the lanes form leaves a 256-wide head to it (8 vec4s a lane at
    # LANES 8 is past 2 * LANES_DL4), so no lanes variant for it is declared either.
    assert dec.lanes_shape(256, 32) is None
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, h, n, 256) for h, n in ((4, 1), (2, 150), (2, 150)))
    check_op(sdpa_fn(enable_gqa=True, is_causal=False), (q, k, v), ops=[SDPA], **FP32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_split_k_long_cache(decode, form, dtype):
    # 1500 keys over 2 groups: 6 splits and the combine pass; masked blocks, whole
    # splits masked.
    assert dec.splits_for(2, 1500) == 6
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, h, n, 64).to(dtype) for h, n in ((8, 1), (2, 1500), (2, 1500)))
    mask = torch.rand(1, 1500) > 0.3
    mask[:, 200:1100] = False
    _on_off(sdpa_fn(enable_gqa=True), (q, k, v, mask), [SDPA], dtype)


@pytest.mark.parametrize("start_pos,lq", [(0, 1), (130, 1), (700, 2)])
def test_executorch_layout_start_pos(decode, monkeypatch, start_pos, lq):
    # llama.custom_sdpa: [B, S, H, D], causal from start_pos; keys past it unread.
    q, k, v = cache_qkv(1, lq, 8, 1024, 2, 64, torch.float16)
    k[:, start_pos + lq:] = float("nan")
    got = check_op(custom_fn(start_pos), (q, k, v), ops=[CUSTOM], **FP16_TOL)
    torch.testing.assert_close(got(q, k, v), eager_cache_attention(
        q, k, v, start_pos, start_pos + lq, True), **FP16_TOL)


def test_sliding_window_and_fully_masked_row(decode):
    torch.manual_seed(9)
    q, k, v = (torch.randn(1, h, n, 64) for h, n in ((4, 2), (2, 600), (2, 600)))
    _on_off(sliding_fn(100, 450), (q, k, v), [SLIDING], torch.float32)
    mask = torch.ones(1, 1, 2, 600, dtype=torch.bool)
    mask[:, :, 1] = False  # row 1 sees no key: 0 as ATen gives
    out = _on_off(sdpa_fn(enable_gqa=True), (q, k, v, mask), [SDPA], torch.float32)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mode", ["causal", "float", "bool", "none"])
def test_one_row_masks(decode, form, dtype, mode):
    # One query row of 8 heads over 300 keys (not a multiple of any chunk) of 2 K/V
    # heads, head dim 32; an additive float mask with -inf entries, a boolean mask
    # with a dead stretch of keys.
    torch.manual_seed(11)
    q, k, v = (torch.randn(2, h, n, 32).to(dtype) for h, n in ((8, 1), (2, 300), (2, 300)))
    if mode == "float":
        mask = torch.randn(2, 8, 1, 300).to(dtype)
        mask[..., 100:180] = float("-inf")
    elif mode == "bool":
        mask = torch.rand(2, 1, 1, 300) > 0.5
        mask[..., :150] = False
    if mode in ("float", "bool"):
        _on_off(sdpa_fn(enable_gqa=True), (q, k, v, mask), [SDPA], dtype)
    else:
        _on_off(sdpa_fn(enable_gqa=True, is_causal=mode == "causal"), (q, k, v), [SDPA],
                dtype)


@pytest.mark.parametrize("e,ev", [(30, 30), (64, 20), (18, 40), (128, 128)])
def test_one_row_head_dims(decode, form, e, ev):
    # Scalar K / V loads (a head dim not a multiple of 4), Ev != E, head dim 128.
    torch.manual_seed(12)
    q, k = torch.randn(1, 3, 1, e), torch.randn(1, 3, 200, e)
    v = torch.randn(1, 3, 200, ev)
    check_op(sdpa_fn(), (q, k, v), ops=[SDPA], **FP32_TOL)


@pytest.mark.parametrize("start_pos", [0, 130, 1023])
def test_one_row_executorch_layout(decode, form, start_pos):
    # llama.custom_sdpa: [B, S, H, D], causal from start_pos (on the device); keys
    # past it are NaN and must not be read.
    q, k, v = cache_qkv(1, 1, 8, 1024, 2, 64, torch.float16)
    k[:, start_pos + 1:] = float("nan")
    got = check_op(custom_fn(start_pos), (q, k, v), ops=[CUSTOM], **FP16_TOL)
    torch.testing.assert_close(got(q, k, v), eager_cache_attention(
        q, k, v, start_pos, start_pos + 1, True), **FP16_TOL)


def test_one_row_sliding_window_and_fully_masked(decode, form):
    torch.manual_seed(13)
    q, k, v = (torch.randn(1, h, n, 64) for h, n in ((4, 1), (2, 600), (2, 600)))
    _on_off(sliding_fn(100, 450), (q, k, v), [SLIDING], torch.float32)
    mask = torch.zeros(1, 1, 1, 600, dtype=torch.bool)  # the row sees no key: 0
    out = _on_off(sdpa_fn(enable_gqa=True), (q, k, v, mask), [SDPA], torch.float32)
    assert torch.equal(out, torch.zeros_like(out))


def test_lanes_form_choice(monkeypatch):
    from vkdelegate.capabilities import Capabilities
    from vkdelegate.runtime.device_info import DeviceInfo

    def info(smallest, ops=("basic", "shuffle"), shared=49152):
        return DeviceInfo(index=0, name="x", type="gpu", driver="", api_version="1.3",
                          subgroup_ops=list(ops), max_shared_memory=shared,
                          capabilities=Capabilities(subgroup_size=smallest,
                                                    min_subgroup_size=smallest,
                                                    max_subgroup_size=smallest))

    assert dec.LANES_FORM and (dec.LANES_WG, dec.LANES_DL4) == (256, 2)  # the defaults
    assert dec.lanes_for(info(32), 1, 64) == 8      # 2 vec4s of 64 dims a lane
    assert dec.lanes_for(info(32), 1, 128) == 8     # at most LANES_MAX: 4 vec4s a lane
    assert dec.lanes_for(info(8), 1, 128) == 8
    assert dec.lanes_for(info(32), 1, 256) is None  # 8 vec4s a lane: > 2 * LANES_DL4
    assert dec.lanes_for(info(4), 1, 64) is None    # subgroups below LANES_MAX
    assert dec.lanes_for(info(32), 2, 64) is None   # two rows: the workgroup form
    assert dec.lanes_for(info(32, ops=("basic",)), 1, 64) is None
    assert dec.lanes_for(info(32, shared=16384), 1, 128) is None  # 32 x 520 bytes
    assert dec.lanes_for(info(32, shared=16384), 1, 64) == 8      # 32 x 264 bytes
    monkeypatch.setattr(dec, "LANES_FORM", False)
    assert dec.lanes_for(info(32), 1, 64) is None


@pytest.fixture
def last_merge(decode, monkeypatch):
    """The lanes form with LAST_MERGE: the splits merged by the last one to finish (no
    sdpa_combine.glsl dispatch; both asserted), in splits of 64 keys. A form the
    lowering does not pick yet (LAST_MERGE off): its variants are not declared."""
    monkeypatch.setattr(coverage, "RECORD_VARIANTS", False)
    monkeypatch.setattr(dec, "LANES_FORM", True)
    monkeypatch.setattr(dec, "LAST_MERGE", True)
    monkeypatch.setattr(dec, "LANES_SPLIT_KEYS", 64)
    merged = []
    lanes_defines = dec.lanes_defines
    monkeypatch.setattr(dec, "lanes_defines", lambda *a, **kw: merged.append(
        kw.get("last_merge")) or lanes_defines(*a, **kw))

    def no_combine(*a, **kw):
        raise AssertionError("sdpa_combine.glsl dispatched with LAST_MERGE")

    monkeypatch.setattr(dec.at, "dispatch_combine", no_combine)
    yield
    assert any(merged), "the lanes form's LAST_MERGE was not taken"


def _again(fn, eager, args, dtype):
    """The lowered fn (check_op's program: its delegates closed, so built again by the
    first call here) on ``args`` and then, built, on another query (the first arg),
    each against eager: the first call's split counters went back to zero (else no
    split would merge and the output would keep the first call's values)."""
    again = (torch.randn_like(args[0].float()).to(dtype),) + tuple(args[1:])
    for call in (args, again):
        torch.testing.assert_close(fn(*call), eager(*call), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("start", [0, 37, 200, 255])
def test_last_merge_llama_step(last_merge, dtype, start):
    # The 1B decode step's attention at 256 cached positions: 4 splits of 64 keys (of
    # which those past the position see no key), 32 rows of counters.
    torch.manual_seed(20 + start)
    q, k, v = (torch.randn(1, h, n, 64).to(dtype) for h, n in ((32, 1), (8, 256), (8, 256)))
    mask = (torch.arange(256) <= start)[None, None, None, :]
    fn = sdpa_fn(enable_gqa=True)
    _on_off(fn, (q, k, v, mask), [SDPA], dtype)
    _again(check_op(fn, (q, k, v, mask), ops=[SDPA], **_tol(dtype)), fn, (q, k, v, mask),
           dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_last_merge_long_cache_and_batch(last_merge, dtype):
    # 2 batches x 8 heads over 1500 keys: 24 splits, whole splits masked, a boolean mask
    # per batch; one batch's row sees no key at all (0, as ATen gives).
    torch.manual_seed(21)
    q, k, v = (torch.randn(2, h, n, 64).to(dtype) for h, n in ((8, 1), (2, 1500), (2, 1500)))
    mask = torch.rand(2, 1, 1, 1500) > 0.3
    mask[:, :, :, 200:1100] = False
    mask[1] = False
    fn = sdpa_fn(enable_gqa=True)
    out = _on_off(fn, (q, k, v, mask), [SDPA], dtype)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    _again(check_op(fn, (q, k, v, mask), ops=[SDPA], **_tol(dtype)), fn, (q, k, v, mask),
           dtype)


@pytest.mark.parametrize("start_pos", [0, 130, 1023])
def test_last_merge_executorch_layout(last_merge, start_pos):
    # llama.custom_sdpa, start_pos read on the device: splits past it see no key and
    # must not read the NaN keys there.
    q, k, v = cache_qkv(1, 1, 8, 1024, 2, 64, torch.float16)
    k[:, start_pos + 1:] = float("nan")
    got = check_op(custom_fn(start_pos), (q, k, v), ops=[CUSTOM], **FP16_TOL)
    for query in (q, torch.randn_like(q.float()).half()):  # twice: the counters reset
        torch.testing.assert_close(got(query, k, v), eager_cache_attention(
            query, k, v, start_pos, start_pos + 1, True), **FP16_TOL)


def test_last_merge_sliding_window(last_merge):
    torch.manual_seed(22)
    q, k, v = (torch.randn(1, h, n, 64) for h, n in ((4, 1), (2, 600), (2, 600)))
    fn = sliding_fn(100, 450)
    _on_off(fn, (q, k, v), [SLIDING], torch.float32)
    _again(check_op(fn, (q, k, v), ops=[SLIDING], **FP32_TOL), fn, (q, k, v), torch.float32)
