"""Fold a decode layer's rotary embedding and K/V cache writes into its merged q/k/v
GEMV: ``rotary_index_put_pair(q, k, cos, sin, cache, cache2, indices, v)`` whose q, k
and v are the three ``narrow_last`` parts of one ``rms_norm_linear(x, norm_weight,
eps, weight, bias)`` (through ``aten.view`` nodes) becomes
``vkdelegate.rms_norm_linear_rotary_cache(x, norm_weight, eps, weight, bias, cos, sin,
cache, cache2, indices, q_sizes, kv_sizes)`` (ops/families/cache_update.py): on the
GEMV path one dispatch where there were two (the rotary pairs rotated and the caches
written in gemv.glsl's epilogue, the product's row never stored), with the bits of the
two; elsewhere the op records the two ops' dispatches. The weight-only quantized
products likewise: parts of ``rms_norm_linear_q4gsw(x, norm_weight, eps, weights,
weight_scales, group_size, bias)`` give ``vkdelegate.rms_norm_linear_q4gsw_rotary_cache(
<its arguments, bias None where absent>, cos, sin, cache, cache2, indices, q_sizes,
kv_sizes)``, of ``rms_norm_weight_int8pack_mm(x, norm_weight, eps, mat2, scales)``
``vkdelegate.rms_norm_weight_int8pack_mm_rotary_cache(<its arguments>, cos, ...)``
(ops/families/quantized_linear.py: linear_qw_gemv.glsl's ROTARY epilogue, one dispatch
on GPUs); an 8da4w product (``et_vk.linear_dq8ca_q4gsw``, whose norm stays before it:
its activation is quantized per row) ``vkdelegate.linear_dq8ca_q4gsw_rotary_cache(<its
arguments, bias None where absent>, cos, ...)``.

In an HF Llama/Qwen2/Mistral decode step passes/merge_linears merges q_proj, k_proj
and v_proj (a one-row input) into one linear whose parts, viewed to [1, H, 1, D] (the
heads' transposes become views: permute_to_view), feed the layer's
rotary_index_put_pair (fuse_rotary, pair_cache_updates); fuse_rms_norm_linear folds
the input norm into that linear (an int4 / int8 weight-only model's merged product
likewise: its rms_norm_* form). Fused only when exactly that is there:

- the rotary node's q, k and v are each a ``narrow_last`` part of one producer,
  directly or through a chain of ``aten.view`` nodes (a view keeps the elements'
  order), each part and view read only by the next node of its chain, and the parts
  are the producer's only readers;
- the parts are q = [0, Nq), k = [Nq, Nq + Nk) and v = [Nq + Nk, Nq + 2 Nk) of the
  producer's last dim of Nq + 2 Nk (merge_linears' order: q_proj, k_proj, v_proj),
  k's and v's sizes equal (kv_sizes), q's sizes q_sizes;
- the producer is ``vkdelegate.rms_norm_linear``, ``rms_norm_linear_q4gsw``,
  ``rms_norm_weight_int8pack_mm`` or ``et_vk.linear_dq8ca_q4gsw`` of an x of rank 1-4
  whose every dim but the last is statically 1 (decode's one row; prefill's merged q/k/v is left alone);
- x, the norm weight, the float weight (or the quantized one's scales), the bias, cos,
  sin and the caches share one dtype, float32 or float16.

Runs after permute_to_view (the heads' transposes are views by then) and
fuse_rms_norm_linear; off with compile option ``fuse_linear_rotary_cache`` = False
(the graph then keeps the product, its parts and rotary_index_put_pair), and for each
producer where the registry lacks its fused op.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vkdelegate.backend.custom_ops import (
    LINEAR_DQ8CA_Q4GSW, LINEAR_DQ8CA_Q4GSW_ROTARY_CACHE,
    RMS_NORM_LINEAR, RMS_NORM_LINEAR_Q4GSW, RMS_NORM_LINEAR_Q4GSW_ROTARY_CACHE,
    RMS_NORM_LINEAR_ROTARY_CACHE, RMS_NORM_WEIGHT_INT8PACK_MM,
    RMS_NORM_WEIGHT_INT8PACK_MM_ROTARY_CACHE, CustomOp)
from vkdelegate.backend.custom_ops_llm import NARROW_LAST, ROTARY_INDEX_PUT_PAIR
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float16)


@dataclass(frozen=True)
class _Producer:
    """A merged product the pass fuses: its op, the fused op made of it, its
    arguments' count without the optional bias (``arity``; the bias is the last,
    at ``arity``, where ``bias``), and the positions of its float arguments besides x
    (``floats``: of x's dtype)."""

    op: CustomOp
    fused: CustomOp
    arity: int
    bias: bool
    floats: tuple


_PRODUCERS = (
    _Producer(RMS_NORM_LINEAR, RMS_NORM_LINEAR_ROTARY_CACHE, 4, True, (1, 3)),
    _Producer(RMS_NORM_LINEAR_Q4GSW, RMS_NORM_LINEAR_Q4GSW_ROTARY_CACHE, 6, True, (1, 4)),
    _Producer(RMS_NORM_WEIGHT_INT8PACK_MM, RMS_NORM_WEIGHT_INT8PACK_MM_ROTARY_CACHE, 5,
              False, (1, 4)),
    # 8da4w: x, its scales (x's dtype) and zero points, weights, sums, scales, group size
    _Producer(LINEAR_DQ8CA_Q4GSW, LINEAR_DQ8CA_Q4GSW_ROTARY_CACHE, 7, True, (1, 5)),
)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _static(v) -> bool:
    return isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape)


def _part(node, reader):
    """(part node, [the chain's nodes, ``node`` first, the part last], producer,
    start, length) where ``node`` is a narrow_last part (int bounds) of a producer,
    directly or through aten.view nodes, each read only by the next (``node`` by
    ``reader``); None otherwise."""
    chain = []
    while True:
        if not isinstance(node, torch.fx.Node) or node.op != "call_function" \
                or node.kwargs or set(node.users) != {reader} or not node.args:
            return None
        chain.append(node)
        if node.target != aten.view.default:
            break
        reader, node = node, node.args[0]
    if node.target != NARROW_LAST.overload() or len(node.args) != 3:
        return None
    producer, start, length = node.args
    if not isinstance(producer, torch.fx.Node) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (start, length)):
        return None
    return node, chain, producer, start, length


def _match(rotary, producers: dict):
    """(the fused op, its arguments, the nodes it replaces but the rotary node, readers
    first) for a fusable rotary_index_put_pair (module docstring) of a product in
    ``producers`` (op overload -> _Producer), else None."""
    if rotary.kwargs or len(rotary.args) != 8:
        return None
    q, k, cos, sin, cache, cache2, indices, v = rotary.args
    if len({q, k, v}) != 3:
        return None
    parts = [_part(t, rotary) for t in (q, k, v)]
    if any(p is None for p in parts):
        return None
    producer = parts[0][2]
    kind = producers.get(producer.target) if producer.op == "call_function" else None
    if any(p[2] is not producer for p in parts) or kind is None or producer.kwargs \
            or len(producer.args) not in (kind.arity, kind.arity + kind.bias) \
            or set(producer.users) != {p[0] for p in parts}:
        return None
    x = producer.args[0]
    qv, kv, vv, xv, yv = (_val(n) for n in (q, k, v, x, producer))
    if not all(_static(t) for t in (qv, kv, vv, xv, yv)) or not 1 <= xv.dim() <= 4 \
            or any(s != 1 for s in xv.shape[:-1]) or tuple(kv.shape) != tuple(vv.shape):
        return None
    nq, nk = qv.numel(), kv.numel()
    if [(p[3], p[4]) for p in parts] != [(0, nq), (nq, nk), (nq + nk, nk)] \
            or yv.shape[-1] != nq + 2 * nk:
        return None
    product = tuple(producer.args[:kind.arity])
    if kind.bias:
        product += (producer.args[kind.arity] if len(producer.args) > kind.arity else None,)
    floats = (x, cos, sin, cache, cache2, q, k, v, producer) \
        + tuple(product[i] for i in kind.floats) \
        + ((product[-1],) if kind.bias and product[-1] is not None else ())
    if any(not isinstance(_val(n), torch.Tensor) or _val(n).dtype != xv.dtype
           for n in floats) or xv.dtype not in _DTYPES:
        return None
    args = product + (cos, sin, cache, cache2, indices, list(qv.shape), list(kv.shape))
    dead = [n for p in parts for n in p[1]] + [producer]  # each chain reader first
    return kind.fused, args, dead


def fuse_linear_rotary_cache(pg) -> bool:
    """Replace each fusable rms_norm product -> parts -> rotary_index_put_pair by its
    rotary_cache op (module docstring); True if any."""
    options = getattr(pg, "options", None)
    if options is not None and not options.fuse_linear_rotary_cache:
        return False
    ops = registry.load_all()
    producers = {p.op.overload(): p for p in _PRODUCERS if p.fused.name in ops}
    if not producers:
        return False
    graph = pg.gm.graph
    rotary_op = ROTARY_INDEX_PUT_PAIR.overload()
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not rotary_op:
            continue
        found = _match(node, producers)
        if found is None:
            continue
        fused_op, args, dead = found
        with graph.inserting_before(node):
            fused = graph.call_function(fused_op.overload(), args)
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        for n in dead:
            graph.erase_node(n)
        changed = True
    return changed

