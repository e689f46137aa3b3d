"""Eager references and inputs for the attention tests (test_sdpa_kv.py,
test_sdpa_block_sparse.py): ExecuTorch's KV-cache attention semantics spelt with eager
F.scaled_dot_product_attention and explicit masks, and the ops under test as plain
functions for check_op."""
import torch
import torch.nn.functional as F

CUSTOM = "llama.custom_sdpa.default"
SLIDING = "vkdelegate.sliding_window_sdpa.default"
SDPA = "aten.scaled_dot_product_attention.default"
# As tests/ops/test_sdpa.py: fp32 accumulation-order differences; fp16 output rounding
# plus eager's fp16 intermediates.
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
FP16_TOL = dict(rtol=4e-3, atol=4e-3)
#: Compile options with the block-sparse early exit switched off.
OFF = {"sdpa_skip_masked_tiles": False}


def cache_qkv(b, lq, hq, s, hk, e, dtype=torch.float32, seed=0):
    """q [B, L, Hq, E], k/v caches [B, S, Hk, E] (ExecuTorch's layout)."""
    torch.manual_seed(seed)
    return (torch.randn(b, lq, hq, e).to(dtype), torch.randn(b, s, hk, e).to(dtype),
            torch.randn(b, s, hk, e).to(dtype))


def eager_cache_attention(q, k, v, start_pos, keys, causal, mask=None, window=0):
    """ExecuTorch's semantics spelt with eager SDPA: keys 0..keys-1 of the cache, query
    row i at start_pos + i; returns [B, L, Hq, E]."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k[:, :keys], v[:, :keys]))
    i = torch.arange(q.shape[1])[:, None] + start_pos
    j = torch.arange(keys)[None, :]
    allowed = torch.ones(q.shape[1], keys, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window:
        allowed &= j > i - window
    attn = allowed if mask is None else mask[:, :keys]
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn, enable_gqa=True)
    return out.transpose(1, 2)


def sdpa_fn(**kw):
    """F.scaled_dot_product_attention(q, k, v[, mask], **kw) as a function."""
    def fn(q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **kw)
    return fn


def sliding_fn(window, start_pos):
    """vkdelegate.sliding_window_sdpa(q, k, v, window, start_pos[, mask])."""
    def fn(q, k, v, *mask):
        return torch.ops.vkdelegate.sliding_window_sdpa(q, k, v, window, start_pos, *mask)
    return fn


def custom_fn(start_pos, causal=True):
    """llama.custom_sdpa(q, k, v, start_pos, None, 0.0, causal, None)."""
    def fn(q, k, v):
        return torch.ops.llama.custom_sdpa(q, k, v, start_pos, None, 0.0, causal, None)
    return fn


def window_mask(lq, s, window, start_pos=0):
    """[lq, s] bool: causal sliding window, rows at start_pos.., i - window < j <= i."""
    i = torch.arange(lq)[:, None] + start_pos
    j = torch.arange(s)[None, :]
    return (j <= i) & (j > i - window)


def half_qkv(hq, hk, lq, s, e, ev=None, seed=0):
    """fp16 q [1, Hq, Lq, E], k [1, Hk, S, E], v [1, Hk, S, Ev or E] (seeded)."""
    torch.manual_seed(seed)
    return (torch.randn(1, hq, lq, e).half(), torch.randn(1, hk, s, e).half(),
            torch.randn(1, hk, s, ev or e).half())


def check_kernel_case(what, shader, fn, args, ops=(SDPA,), exact=False):
    """fp16 ``fn(*args)`` lowered against eager (check_op, FP16_TOL), asserting that
    ``shader`` was among the variants it dispatched and, with ``exact``, that the
    block-sparse early exit is bit-exact (the program with it off gives the same
    bits); prints "ok WHAT" (the unvalidated subprocess's progress)."""
    from tests.ops import coverage
    from tests.ops.harness import check_op

    coverage.VARIANTS.clear()  # check_op records the shader variants it dispatched
    on = check_op(fn, args, ops=list(ops), **FP16_TOL)
    ran = {key[0] for keys in coverage.VARIANTS.values() for key in keys}
    assert shader in ran, f"{what}: ran {sorted(ran)}"
    if exact:
        off = check_op(fn, args, ops=list(ops), **FP16_TOL, options=OFF)
        assert torch.equal(on(*args), off(*args)), f"{what}: early exit not exact"
    print("ok", what, flush=True)
