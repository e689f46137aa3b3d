"""Attention over a KV cache: ExecuTorch's llama.custom_sdpa and llama.sdpa_with_kv_cache,
vkdelegate.sliding_window_sdpa and vkdelegate.sdpa_at, on the fused attention shaders
(kernels/attention.py).

Schemas (backend/custom_ops.py, ExecuTorch's extension/llm/custom_ops/op_sdpa_aot.cpp):
``custom_sdpa(query, key, value, SymInt start_pos, attn_mask=None, drpout_p=0.0,
is_causal=False, scale=None)``; ``sdpa_with_kv_cache(query, key, value, key_cache!,
value_cache!, SymInt start_pos, SymInt seq_len, attn_mask=None, drpout_p=0.0,
is_causal=False, scale=None)``; ``sliding_window_sdpa(query, key, value, int window,
SymInt start_pos=0, attn_mask=None, scale=None)``; ``sdpa_at(query, key, value, Tensor
start_pos, int window=0, float? scale=None)`` (backend/custom_ops_llm.py).

The llama ops are [B, L, H, E] (seq before heads): query [B, L, Hq, E], the caches
[B, S, Hk, E], Hq a multiple of Hk. Query row i is at absolute position start_pos + i;
is_causal masks keys j > start_pos + i; without attn_mask only keys j < start_pos + L
(custom_sdpa) or start_pos + seq_len (sdpa_with_kv_cache) exist, with one (2-D [L, S],
ET's is float; a bool one is accepted too) all S. sdpa_with_kv_cache first writes key
and value into the caches at rows start_pos.. (in place, as ET-VK's op does; the caches
are the node's inputs). sliding_window_sdpa is ATen's layout ([B, H, L, E]), causal
with a window: keys start_pos + i - window < j <= start_pos + i. start_pos may be a
SymInt (a size), re-read after every resize. Fully masked rows are NaN (the ops'
references are plain softmaxes). dropout is refused.

sdpa_at is sliding_window_sdpa without a mask whose start_pos is a one-element int64 (or
int32) TENSOR, read by the shaders on the device (POS_TENSOR: sdpa.h's sdpa_offset), so
it can be program state (an LLM decode loop's ``loop.pos``) and no attention mask is
built: query row i at p + i (p = start_pos[0]) sees keys j <= p + i, and with window > 0
only j > p + i - window (window 0: causal only). The early exit (compile option
sdpa_skip_masked_tiles) skips the key tiles past the last row's position and before
the first row's window on every kernel form, so a decode step's cost grows with the
position, not the cache length. A position outside 0..S-1 is data: the shaders clamp it
to [-L, S + window] (sdpa.h), which changes no output (a row at a negative position
sees no key and is NaN, one past the cache all keys or, past the window, none); loops
stay bounded by S. Load checks: start_pos of one element and an index dtype, window an
int in 0..2^30 - 1 (position sums stay within int32), the shapes as sliding_window_sdpa.
"""
from __future__ import annotations

from vkdelegate.kernels import attention, attention_variants
from vkdelegate.kernels.affine_copy import CopyDim, CopyPlan, affine_copy
from vkdelegate.kernels.attention import MAX_HEAD_DIM, Attention
from vkdelegate.ops.registry import FLOAT_DTYPES, NodeSpec, OpSpec, TensorSpec, register

CUSTOM_SDPA = "llama.custom_sdpa.default"
WITH_KV_CACHE = "llama.sdpa_with_kv_cache.default"
SLIDING = "vkdelegate.sliding_window_sdpa.default"
SDPA_AT = "vkdelegate.sdpa_at.default"
DTYPES = FLOAT_DTYPES
MASK_DTYPES = frozenset({"bool"}) | FLOAT_DTYPES

#: op -> positions of (query, key, value, start_pos, mask, is_causal, scale, window,
#: dropout); None where the op has no such argument.
_ARGS = {
    CUSTOM_SDPA: (0, 1, 2, 3, 4, 6, 7, None, 5),
    WITH_KV_CACHE: (0, 3, 4, 5, 7, 9, 10, None, 8),
    SLIDING: (0, 1, 2, 4, 5, None, 6, 3, None),
    SDPA_AT: (0, 1, 2, 3, None, None, 5, 4, None),
}
#: The start_pos tensor's dtypes (stored as int32 on the device) and the largest window
#: of sdpa_at.
START_DTYPES = frozenset({"int64", "int32"})
MAX_WINDOW = (1 << 30) - 1


def _get(args, i, default=None):
    return default if i is None or i >= len(args) else args[i]


def _rule(node: NodeSpec):
    qi, ki, vi, _, mi, ci, _, wi, di = _ARGS[node.op]
    q, k, v, mask = (_get(node.args, i) for i in (qi, ki, vi, mi))
    seq_first = node.op not in (SLIDING, SDPA_AT)
    if not all(hasattr(t, "rank") and t.rank == 4 for t in (q, k, v)):
        return "query, key and value must be 4-D tensors"
    if _get(node.args, di, 0.0):
        return f"dropout_p={_get(node.args, di)} is not supported"
    if mask is not None and _get(node.args, ci, False):
        return "is_causal with an attn_mask (ExecuTorch refuses it)"
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        return f"mixed dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1]:
        return f"query {list(q.shape)}, key {list(k.shape)}, value {list(v.shape)} differ"
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return f"head dims {q.shape[-1]}, {v.shape[-1]}: at most {MAX_HEAD_DIM}"
    if any(t.dynamic and t.dynamic[-1] for t in (q, k, v)):
        return "dynamic head dim"
    hq, hk = (q.shape[2], k.shape[2]) if seq_first else (q.shape[1], k.shape[1])
    if not hk or hq % hk or k.shape[0] not in (1, q.shape[0]):
        return f"query heads {hq} / batch {q.shape[0]} cannot use key/value {list(k.shape)}"
    if node.op == SDPA_AT:
        window = _get(node.args, wi, 0)
        if isinstance(window, bool) or not isinstance(window, int) or \
                not 0 <= window <= MAX_WINDOW:
            return f"window {window!r}: an int in 0..{MAX_WINDOW}"
        start = _get(node.args, 3)
        if not isinstance(start, TensorSpec) or tuple(start.shape) not in ((1,), ()) or \
                start.is_dynamic:
            return f"start_pos {getattr(start, 'shape', start)!r}: one element expected"
    elif wi is not None and not (isinstance(node.args[wi], int) and node.args[wi] > 0):
        return f"window {node.args[wi]!r}: a positive int"
    if mask is not None:
        if mask.dtype != "bool" and mask.dtype != q.dtype:
            return f"attn_mask dtype {mask.dtype} is neither bool nor the query's {q.dtype}"
        lq, s = (q.shape[1], k.shape[1]) if seq_first else (q.shape[2], k.shape[2])
        if mask.rank != 2 or tuple(mask.shape) != (lq, s):
            return f"attn_mask {list(mask.shape)}: expected 2-D [{lq}, {s}]"
    return None


def _shape(args) -> tuple:
    return tuple(args[0].shape)


def _shape_at(args) -> tuple:
    return tuple(args[0].shape[:-1]) + tuple(args[2].shape[-1:])


def _write_rows(b, cache, x, start) -> None:
    """cache[:, start() : start() + L] = x, both [B, *, Hk, E] (an affine copy)."""
    def plan() -> CopyPlan:
        bsz, n, hk, e = x.shape
        row = hk * e
        return CopyPlan([CopyDim(bsz, cache.shape[1] * row, n * row),
                         CopyDim(n * row, 1, 1)], out_offset=int(start()) * row)
    affine_copy(b, cache, x, plan)


def _make_impl(op: str):
    qi, ki, vi, pi, mi, ci, si, wi, _ = _ARGS[op]

    def impl(b, node):
        ids = node.args[:-1]
        q, k, v = (b.tensor(ids[i]) for i in (qi, ki, vi))
        out = b.tensor(node.args[-1])
        if len({q.dtype, k.dtype, v.dtype, out.dtype}) != 1:
            raise b.error(f"mixed dtypes {q.dtype}, {k.dtype}, {v.dtype}, {out.dtype}")
        window = int(b.scalar(ids[wi])) if wi is not None and wi < len(ids) else 0
        scale = b.scalar(ids[si]) if si < len(ids) else None
        if op == SDPA_AT:  # the position is a tensor the shaders read (POS_TENSOR)
            start_pos = b.tensor(ids[pi])
            if start_pos.max_numel != 1 or start_pos.dtype not in START_DTYPES:
                raise b.error(f"start_pos {start_pos.dtype}{list(start_pos.max_shape)}: "
                              f"one int64/int32 element expected")
            attention.dispatch(b, Attention(q, k, v, out, None, scale=scale, causal=True,
                                            window=window, nan_rows=True, start=start_pos))
            return
        causal = bool(b.scalar(ids[ci])) if ci is not None and ci < len(ids) else op == SLIDING
        mask = b.tensor(ids[mi]) if mi < len(ids) and b.value(ids[mi]) is not None \
            else None
        start_id = ids[pi] if pi < len(ids) else None

        def start() -> int:
            return 0 if start_id is None else int(b.value(start_id))

        seq_first = op != SLIDING
        if op == WITH_KV_CACHE:
            _write_rows(b, k, b.tensor(ids[1]), start)
            _write_rows(b, v, b.tensor(ids[2]), start)

        def positions():
            if mask is not None or op == SLIDING:
                return start(), attention.NO_LIMIT
            count = int(b.value(ids[6])) if op == WITH_KV_CACHE else q.shape[1]
            return start(), start() + count

        attention.dispatch(b, Attention(q, k, v, out, mask, scale=scale, causal=causal,
                                        window=window, seq_first=seq_first,
                                        nan_rows=True, positions=positions))
    return impl


_NOTES = {
    CUSTOM_SDPA: "ExecuTorch's attention over a KV cache ([B, S, H, D]): start_pos, "
                 "causal, 2-D mask, GQA; fused, block-sparse",
    WITH_KV_CACHE: "ExecuTorch's cache update + custom_sdpa (writes the caches in place)",
    SLIDING: "causal sliding-window attention (window, start_pos), fused, block-sparse",
    SDPA_AT: "causal (sliding-window) attention at start_pos read from a tensor on the "
             "device (no mask; HF decoders), fused, block-sparse",
}
_ARG_DTYPES = {CUSTOM_SDPA: {4: MASK_DTYPES}, WITH_KV_CACHE: {7: MASK_DTYPES},
               SLIDING: {5: MASK_DTYPES}, SDPA_AT: {3: START_DTYPES}}
_SYMBOLIC = {CUSTOM_SDPA: {3}, WITH_KV_CACHE: {5, 6}, SLIDING: {4}, SDPA_AT: set()}

for _op in (CUSTOM_SDPA, WITH_KV_CACHE, SLIDING, SDPA_AT):
    register(OpSpec(name=_op, dtypes=DTYPES, impl=_make_impl(_op),
                    shape_fn=_shape_at if _op == SDPA_AT else _shape,
                    rules=(_rule,), max_rank=4, arg_dtypes=_ARG_DTYPES[_op],
                    notes=_NOTES[_op], symbolic_args=frozenset(_SYMBOLIC[_op])))

#: (mask, causal, window, nan_rows, seq_first) of the forms these ops dispatch.
_FORMS = [(None, False, False, True, True), (None, True, False, True, True),
          ("bool", False, False, True, True), ("float", False, False, True, True),
          (None, True, True, True, False), ("bool", True, True, True, False),
          ("float", True, True, True, False)]
#: sdpa_at's: causal, with and without a window, the start_pos tensor's dtypes.
_FORMS += [(None, True, window, True, False, start) for window in (False, True)
           for start in sorted(START_DTYPES)]
attention_variants.declare(_FORMS, DTYPES)
