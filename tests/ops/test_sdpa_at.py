"""vkdelegate.sdpa_at on Vulkan (issue 14): causal / sliding-window attention at a
position read from a tensor on the device (no mask), against eager
F.scaled_dot_product_attention with the mask transformers would build
(tests/ops/attention_reference.window_mask, built independently of the op): fp32 and
fp16, decode (L = 1: sdpa.glsl with split-K, and sdpa_decode.glsl forced on lavapipe,
whole and split) and prefill (L > 1: sdpa.glsl, sdpa_tiled.glsl from 16 rows),
grouped-query heads, window 0 and > 0, positions 0, in the middle, S - L and outside
the cache (negative, past S, past S + window: no crash, as the CPU reference), one
program run at several positions (the value is read at every run), the early exit
bit-identical on and off, and the load checks of a crafted blob."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import vkdelegate
from tests.ops.attention_reference import FP16_TOL, FP32_TOL, OFF
from tests.ops.harness import check_op
from tests.ops.test_sdpa_decode import decode  # noqa: F401 (a fixture)
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.custom_ops_llm import sdpa_at_reference
from vkdelegate.kernels import attention_decode as dec
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob

ensure_defined()

AT = "vkdelegate.sdpa_at.default"


def _qkv(b, hq, lq, hk, s, e, dtype, seed=0):
    """q [B, Hq, L, E], k/v [B, Hk, S, E] (ATen's layout, transformers' static cache)."""
    torch.manual_seed(seed)
    return (torch.randn(b, hq, lq, e).to(dtype), torch.randn(b, hk, s, e).to(dtype),
            torch.randn(b, hk, s, e).to(dtype))


def _eager(q, k, v, p: int, window: int, scale=None):
    """transformers' semantics spelt with eager SDPA and an explicit bool mask: row i at
    p + i sees keys j <= p + i (and j > p + i - window); NaN where a row sees no key."""
    lq, s = q.shape[-2], k.shape[-2]
    i = torch.arange(lq)[:, None] + p
    j = torch.arange(s)[None, :]
    allowed = j <= i
    if window:
        allowed &= j > i - window
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allowed,
                                         enable_gqa=True, scale=scale)
    dead = ~allowed.any(-1)  # rows that see no key: NaN (the op's reference), not 0
    return out.masked_fill(dead[:, None], float("nan")).to(q.dtype)


def _fn(window=0, scale=None):
    def fn(q, k, v, pos):
        return torch.ops.vkdelegate.sdpa_at(q, k, v, pos, window, scale)
    return fn


def _same_bits(a, b) -> bool:
    """Bit-identical (NaN rows included)."""
    ints = {torch.float32: torch.int32, torch.float16: torch.int16}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))


def _tol(dtype):
    return FP32_TOL if dtype == torch.float32 else FP16_TOL


def _run(q, k, v, p, window=0, positions=(), options=None, scale=None):
    """The lowered op's outputs at position p and then at each of ``positions`` (the
    same program: the position is an input the shader reads), each checked against
    _eager."""
    pos = torch.tensor([p])
    prog = check_op(_fn(window, scale), (q, k, v, pos), ops=[AT], options=options,
                    **_tol(q.dtype))
    outs = []
    for p2 in (p, *positions):
        got = prog(q, k, v, torch.tensor([p2]))
        torch.testing.assert_close(got.float(), _eager(q, k, v, p2, window, scale).float(),
                                   equal_nan=True, **_tol(q.dtype))
        outs.append(got)
    return outs


# sdpa_decode.glsl forced on any device, asserting that it ran (test_sdpa_decode's).


def test_reference_is_eager_masked_attention():
    q, k, v = _qkv(2, 8, 5, 2, 40, 16, torch.float32)
    for p, window in [(0, 0), (17, 0), (17, 6), (35, 0), (-2, 0), (-9, 3), (60, 0),
                      (60, 10), (50, 4)]:
        got = sdpa_at_reference(q, k, v, torch.tensor([p]), window)
        torch.testing.assert_close(got, _eager(q, k, v, p, window), equal_nan=True,
                                   **FP32_TOL)
    got = sdpa_at_reference(q, k, v, torch.tensor([3], dtype=torch.int32), 0, 0.25)
    torch.testing.assert_close(got, _eager(q, k, v, 3, 0, 0.25), **FP32_TOL)
    with pytest.raises(ValueError, match="window -1"):
        sdpa_at_reference(q, k, v, torch.tensor([3]), -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("window", [0, 24])
def test_decode_gqa_positions(dtype, window):
    # One query of 8 heads over 2 K/V heads, 256 cached positions (sdpa.glsl, split-K):
    # the first, a middle and the last position, and past the window's reach.
    q, k, v = _qkv(1, 8, 1, 2, 256, 64, dtype)
    _run(q, k, v, 0, window, positions=(97, 255, 40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("lq", [5, 20])
def test_prefill(dtype, window, lq):
    # 5 rows: sdpa.glsl; 20 rows: sdpa_tiled.glsl (or the cooperative form on GPUs).
    s = 96
    q, k, v = _qkv(1, 4, lq, 2, s, 32, dtype, seed=lq)
    _run(q, k, v, 0, window, positions=(33, s - lq))


@pytest.mark.parametrize("window", [0, 16])
def test_early_exit_on_and_off_bit_identical(window):
    q, k, v = _qkv(1, 4, 1, 2, 192, 32, torch.float32)
    on = _run(q, k, v, 70, window, positions=(5, 191))
    off = _run(q, k, v, 70, window, positions=(5, 191), options=OFF)
    for a, b in zip(on, off):
        assert _same_bits(a, b)
    q, k, v = _qkv(1, 2, 20, 1, 96, 32, torch.float16, seed=3)  # tiled prefill
    on = _run(q, k, v, 40, window)
    off = _run(q, k, v, 40, window, options=OFF)
    assert _same_bits(on[0], off[0])


@pytest.mark.parametrize("window", [0, 8])
def test_positions_outside_the_cache(window):
    # Data, not indices: a negative position (rows that see no key: NaN, as the CPU
    # reference), past S (every key, or with a window the last few or none), and far
    # out of range (int32 sums stay bounded: the shader clamps, changing no output).
    q, k, v = _qkv(1, 4, 3, 2, 64, 32, torch.float32)
    _run(q, k, v, 0, window, positions=(-1, -2, -1000, 64, 66, 70, 1 << 30, -(1 << 31)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("window", [0, 40])
def test_decode_kernel(decode, dtype, window):
    # sdpa_decode.glsl: 4 query heads per K/V head in one workgroup, every position kind.
    q, k, v = _qkv(1, 8, 1, 2, 256, 64, dtype)
    on = _run(q, k, v, 0, window, positions=(129, 255, 300, -1))
    off = _run(q, k, v, 0, window, positions=(129, 255, 300, -1), options=OFF)
    for a, b in zip(on, off):
        assert _same_bits(a, b)


def test_decode_kernel_split_keys(decode):
    # 1200 positions: the keys split over workgroups (SPLIT_KEYS) and merged by
    # sdpa_combine.glsl; splits wholly past the position see no key.
    assert dec.splits_for(2, 1200) > 1
    q, k, v = _qkv(1, 4, 2, 2, 1200, 32, torch.float32)
    _run(q, k, v, 3, 0, positions=(700, 1198))
    _run(q, k, v, 900, 100, positions=(10,))


def test_int32_position_and_scale():
    q, k, v = _qkv(1, 2, 1, 2, 48, 32, torch.float32)
    pos = torch.tensor([30], dtype=torch.int32)
    prog = check_op(_fn(0, 0.2), (q, k, v, pos), ops=[AT], **FP32_TOL)
    torch.testing.assert_close(prog(q, k, v, pos), _eager(q, k, v, 30, 0, 0.2), **FP32_TOL)


def _blob_graph():
    q, k, v = _qkv(1, 4, 1, 2, 32, 32, torch.float32)
    prog = check_op(_fn(4), (q, k, v, torch.tensor([3])), ops=[AT], **FP32_TOL)
    (delegate,) = [d for m in prog.methods.values() for d in m.delegates]
    graph = read_blob(delegate.blob).graph
    (call,) = [c for c in graph.chain if c.name == AT]
    return graph, call


@pytest.mark.parametrize("change,match", [
    ("start", "start_pos .*one element expected"),
    ("start_dtype", "argument 3 has dtype float32"),
    ("key", "cannot use key/value|differ"),
    ("out", "declares output value .* the op gives"),
    ("window", r"window -3: an int in 0\.\.")])
def test_crafted_blob_is_refused_at_load(change, match):
    from vkdelegate.ops.load_checks import check_nodes
    graph, call = _blob_graph()
    check_nodes(graph)  # as lowered: accepted
    q, k, v, pos, window = call.args[:5]
    out = call.args[-1]
    t = graph.values
    if change == "start":
        t[pos] = dataclasses.replace(t[pos], dims=[2])
    elif change == "start_dtype":
        t[pos] = dataclasses.replace(t[pos], datatype=vk.VkDataType.FLOAT32)
    elif change == "key":
        t[k] = dataclasses.replace(t[k], dims=[1, 3, 32, 32])
    elif change == "out":
        t[out] = dataclasses.replace(t[out], dims=[1, 4, 2, 32])
    else:
        t[window] = vk.Int(-3)
    with pytest.raises(vkdelegate.VkDelegateError, match=match):
        check_nodes(graph)


@pytest.mark.parametrize("kernel", ["sdpa", "decode"])
def test_keys_past_the_position_are_not_read(request, kernel):
    # The early exit reads no key tile past the last row's position: NaN rows there (as
    # an unused cache could hold) do not reach the output.
    if kernel == "decode":
        request.getfixturevalue("decode")
    q, k, v = _qkv(1, 8, 1, 2, 512, 64, torch.float32)
    want = _eager(q, k, v, 40, 0)
    prog = check_op(_fn(), (q, k, v, torch.tensor([40])), ops=[AT], **FP32_TOL)
    k[:, :, 128:], v[:, :, 128:] = float("nan"), float("nan")
    torch.testing.assert_close(prog(q, k, v, torch.tensor([40])), want, **FP32_TOL)
