"""Fused attention: aten.scaled_dot_product_attention.default, ET-VK's et_vk.sdpa and
vkdelegate.sdpa_seq_first.

Schemas: ``scaled_dot_product_attention(query, key, value, attn_mask=None,
dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False)`` (ATen) and
``sdpa(q, k, v, attn_mask=None, scale=None)`` (ExecuTorch's backends/vulkan/
custom_ops_lib.py since 1.4: matmul, additive mask, softmax, matmul).

query [..., Hq, L, E], key [..., Hk, S, E], value [..., Hk, S, Ev] (rank 3 or 4), out
[..., Hq, L, Ev]. The fused attention kernels (kernels/attention.py: online softmax
over key tiles, fp32 accumulation, the L x S scores never stored; key tiles masked for
a whole workgroup skipped, exactly; prefill on the tiled flash-attention kernel or, in
float16, on cooperative matrices; split-K for few queries over many keys; grouped-query
heads packed per workgroup). Supported:
is_causal (ATen's top-left aligned tril when L != S), a boolean mask (True = attend) or
an additive float mask of the query's dtype broadcasting to [..., Hq, L, S], custom
``scale`` (default 1 / sqrt(E)), grouped-query attention (``enable_gqa`` and Hq % Hk
== 0; without it Hk is Hq or 1, ATen's matmul broadcast), E and Ev up to 256, fp32 and
fp16. dropout_p > 0 stays on the CPU (the partitioner then lets torch decompose the
node). A fully masked row is 0 for ATen (its math decomposition and CPU flash kernel)
and NaN for et_vk.sdpa (its reference softmax of all -inf).

``vkdelegate.sdpa_seq_first(query, key, value, attn_mask=None, is_causal=False,
scale=None, enable_gqa=False)`` (backend/custom_ops.py) is the ATen op on [B, L, H, E]
tensors (4-D only; out [B, L, Hq, Ev]; the mask in ATen's [B, Hq, L, S] layout): the
same kernels in their SEQ_FIRST forms, so that an encoder's four head transposes
around its attention are not copied (passes/sdpa_seq_first.py).
"""
from __future__ import annotations

from vkdelegate.kernels import attention, attention_variants
from vkdelegate.kernels.attention import MAX_HEAD_DIM, Attention
from vkdelegate.ops.registry import FLOAT_DTYPES, NodeSpec, OpSpec, TensorSpec, register

ATEN = "aten.scaled_dot_product_attention.default"
ET_VK = "et_vk.sdpa.default"
SEQ_FIRST = "vkdelegate.sdpa_seq_first.default"
DTYPES = FLOAT_DTYPES
MASK_DTYPES = frozenset({"bool"}) | FLOAT_DTYPES


def _args(op: str, args) -> tuple:
    """(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) of each schema."""
    if op == ET_VK:
        q, k, v, mask, scale = args[:5]
        return q, k, v, mask, 0.0, False, scale, False
    if op == SEQ_FIRST:
        q, k, v, mask, is_causal, scale, enable_gqa = args[:7]
        return q, k, v, mask, 0.0, is_causal, scale, enable_gqa
    return tuple(args[:8])


def _heads_first(t):
    """A 4-D [B, L, H, E] TensorSpec as the [B, H, L, E] tensor ATen's rules read."""
    if not hasattr(t, "rank") or t.rank != 4:
        return t
    order = (0, 2, 1, 3)
    dynamic = tuple(t.dynamic[i] for i in order) if t.dynamic else ()
    return TensorSpec(t.dtype, tuple(t.shape[i] for i in order), dynamic)


def _broadcast_reason(q, k, v, enable_gqa: bool, et_vk: bool):
    """Why k/v's batch and head dims cannot serve q's (None if they can)."""
    if k.shape[:-1] != v.shape[:-1]:
        return f"key {list(k.shape)} and value {list(v.shape)} differ before the last dim"
    for dim in range(q.rank - 2):
        qs, ks = q.shape[dim], k.shape[dim]
        heads = dim == q.rank - 3
        if ks == qs or ks == 1:
            continue
        if heads and enable_gqa and not et_vk and ks and qs % ks == 0:
            continue
        what = "heads" if heads else f"dim {dim}"
        gqa = " (grouped-query attention needs enable_gqa=True)" if heads and not \
            enable_gqa and not et_vk and ks and qs % ks == 0 else ""
        return f"query {what} {qs} cannot use key/value {what} {ks}{gqa}"
    return None


def _mask_reason(mask, q, k):
    if mask.dtype != "bool" and mask.dtype != q.dtype:
        return f"attn_mask dtype {mask.dtype} is neither bool nor the query's {q.dtype}"
    target = tuple(q.shape[:-1]) + (k.shape[-2],)
    if mask.rank > len(target):
        return f"attn_mask rank {mask.rank} > {len(target)}"
    for ms, ts in zip(reversed(mask.shape), reversed(target)):
        if ms not in (1, ts):
            return f"attn_mask {list(mask.shape)} does not broadcast to {list(target)}"
    return None


def _rule(node: NodeSpec):
    et_vk = node.op == ET_VK
    q, k, v, mask, dropout_p, is_causal, _scale, enable_gqa = _args(node.op, node.args)
    if not all(hasattr(t, "rank") for t in (q, k, v)):
        return "query, key and value must be tensors"
    if node.op == SEQ_FIRST:
        if not q.rank == k.rank == v.rank == 4:
            return f"query/key/value ranks {q.rank}/{k.rank}/{v.rank}: 4 expected"
        q, k, v = (_heads_first(t) for t in (q, k, v))
    if not (q.rank == k.rank == v.rank and q.rank in (3, 4)):
        return f"query/key/value ranks {q.rank}/{k.rank}/{v.rank}: 3 or 4, all alike"
    if dropout_p:
        return f"dropout_p={dropout_p} (training) is not supported"
    if is_causal and mask is not None:
        return "is_causal with an attn_mask (ATen refuses it)"
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        return f"mixed dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] != k.shape[-1]:
        return f"query head dim {q.shape[-1]} != key head dim {k.shape[-1]}"
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return f"head dims {q.shape[-1]}, {v.shape[-1]}: at most {MAX_HEAD_DIM}"
    if any(t.dynamic and t.dynamic[-1] for t in (q, k, v)):
        return "dynamic head dim"
    if mask is not None:
        if et_vk and mask.dtype == "bool":
            return "a boolean attn_mask for et_vk.sdpa (its mask is additive)"
        reason = _mask_reason(mask, q, k)
        if reason:
            return reason
    return _broadcast_reason(q, k, v, bool(enable_gqa), et_vk)


def _shape(args) -> tuple:
    q, v = args[0], args[2]
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _make_impl(op: str):
    et_vk = op == ET_VK
    seq_first = op == SEQ_FIRST

    def impl(b, node):
        *arg_ids, out_id = node.args
        if et_vk:
            q_id, k_id, v_id, mask_id, scale_id = arg_ids[:5]
            drop_id = causal_id = None
        elif seq_first:
            q_id, k_id, v_id, mask_id, causal_id, scale_id = arg_ids[:6]
            drop_id = None
        else:
            q_id, k_id, v_id, mask_id, drop_id, causal_id, scale_id = arg_ids[:7]
        q, k, v, out = (b.tensor(i) for i in (q_id, k_id, v_id, out_id))
        mask = b.value(mask_id)
        mask = b.tensor(mask_id) if mask is not None else None
        if drop_id is not None and b.scalar(drop_id):
            raise b.error("dropout_p > 0 is not supported")
        causal = bool(b.scalar(causal_id)) if causal_id is not None else False
        if len({q.dtype, k.dtype, v.dtype, out.dtype}) != 1:
            raise b.error(f"mixed dtypes {q.dtype}, {k.dtype}, {v.dtype}, {out.dtype}")
        ranks = (4,) if seq_first else (3, 4)
        if not (q.ndim == k.ndim == v.ndim and q.ndim in ranks):
            raise b.error(f"query/key/value ranks {q.ndim}/{k.ndim}/{v.ndim}: "
                          f"{' or '.join(map(str, ranks))}")
        attention.dispatch(b, Attention(q, k, v, out, mask, scale=b.scalar(scale_id),
                                        causal=causal, nan_rows=et_vk,
                                        seq_first=seq_first))
    return impl


register(OpSpec(name=ATEN, dtypes=DTYPES, impl=_make_impl(ATEN), shape_fn=_shape,
                rules=(_rule,), max_rank=4, arg_dtypes={3: MASK_DTYPES},
                notes="fused flash attention: causal, bool/float masks, scale, GQA, "
                      "E, Ev <= 256; dropout_p > 0 on the CPU"))
register(OpSpec(name=ET_VK, dtypes=DTYPES, impl=_make_impl(ET_VK), shape_fn=_shape,
                rules=(_rule,), max_rank=4, arg_dtypes={3: FLOAT_DTYPES},
                notes="ExecuTorch's fused SDPA: additive mask, scale; NaN rows "
                      "where fully masked"))
register(OpSpec(name=SEQ_FIRST, dtypes=DTYPES, impl=_make_impl(SEQ_FIRST), shape_fn=_shape,
                rules=(_rule,), max_rank=4, arg_dtypes={3: MASK_DTYPES},
                notes="ATen's SDPA on [B, L, H, E] tensors (the head transposes around "
                      "an encoder's attention, not copied): as aten's"))


#: (mask, causal, window, nan_rows, seq_first) of the forms these ops dispatch.
_FORMS = [(None, False, False, False, False), (None, True, False, False, False),
          ("bool", False, False, False, False), ("float", False, False, False, False),
          (None, False, False, True, False), ("float", False, False, True, False),
          (None, False, False, False, True), (None, True, False, False, True),
          ("bool", False, False, False, True), ("float", False, False, False, True)]
attention_variants.declare(_FORMS, DTYPES)
