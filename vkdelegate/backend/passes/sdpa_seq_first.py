"""Attention on the [B, L, H, E] layout: an ATen SDPA whose query, key and value are
head transposes of [B, L, H, E] tensors and whose output is only transposed back
becomes ``vkdelegate.sdpa_seq_first`` of the untransposed tensors (backend/custom_ops.py),
so that none of the four transposes is copied.

HF encoders (BERT, RoBERTa, ViT, CLIP, ...) split each projection into heads with
``x.view(B, L, H, E).transpose(1, 2)`` and merge them back with
``out.transpose(1, 2).reshape(B, L, H * E)``; exported, these are ``aten.permute`` (or
``aten.transpose.int``) nodes that each cost a copy dispatch, four per layer (a quarter
of a MiniLM's dispatches). The attention kernels read either layout (their SEQ_FIRST
forms, as ExecuTorch's llama ops use), with the same sums in the same order, so the
outputs are bitwise the unfused graph's.

Fused only when exactly that is there:

- the node is ``aten.scaled_dot_product_attention.default`` with dropout_p 0 and 4-D
  query, key and value, each the swap of dims 1 and 2 (``permute(x, [0, 2, 1, 3])``
  or ``transpose(x, 1, 2)``, negative dims alike) of a 4-D x; a transpose other nodes
  also read stays for them;
- every reader of its output is such a swap back, directly or through views to the
  same shape (export leaves one), and those swaps are then replaced by the new node;
- the node would run on Vulkan and the lists let ``vkdelegate.sdpa_seq_first`` run
  (``ProgramGraph.runs_on_vulkan`` / ``op_allowed``, set by the partitioner).

Runs after permute_to_view (a transpose that moves only size-1 dims, as in a one-token
decode, is a view by then and is left alone); off with compile option
``sdpa_seq_first`` = False.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import SDPA_SEQ_FIRST
from vkdelegate.ops import registry

aten = torch.ops.aten
_SWAP = (0, 2, 1, 3)


def _rank(node) -> int:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else -1


def _is_swap(node) -> bool:
    """Whether ``node`` swaps dims 1 and 2 of a 4-D tensor (its only change)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.kwargs:
        return False
    if _rank(node) != 4 or _rank(node.args[0]) != 4:
        return False
    if node.target is aten.permute.default and len(node.args) == 2:
        return tuple(d % 4 for d in node.args[1]) == _SWAP
    if node.target is aten.transpose.int and len(node.args) == 3:
        return {node.args[1] % 4, node.args[2] % 4} == {1, 2}
    return False


def _match(node):
    """(the new node's arguments) for a fusable SDPA node, else None."""
    args = list(node.args) + [None] * (6 - len(node.args))
    q, k, v, mask, dropout, causal = args[:6]
    kwargs = dict(node.kwargs)
    mask = kwargs.pop("attn_mask", mask)
    dropout = kwargs.pop("dropout_p", dropout) or 0.0
    causal = bool(kwargs.pop("is_causal", causal) or False)
    scale = kwargs.pop("scale", None)
    gqa = bool(kwargs.pop("enable_gqa", False))
    if kwargs or dropout or not all(_is_swap(t) for t in (q, k, v)):
        return None
    return (q.args[0], k.args[0], v.args[0], mask, causal, scale, gqa)


def _same_shape_view(node, src) -> bool:
    return node.op == "call_function" and node.target is aten.view.default \
        and not node.kwargs and node.args[0] is src and _rank(node) == _rank(src) \
        and tuple(node.meta["val"].shape) == tuple(src.meta["val"].shape)


def _backs(node):
    """(the swaps back that read ``node``'s output, directly or through views to the
    same shape, and those views) if those are its only readers, else None."""
    swaps, views = [], []
    frontier = [node]
    while frontier:
        src = frontier.pop()
        if not src.users:
            return None
        for user in src.users:
            if _same_shape_view(user, src):
                views.append(user)
                frontier.append(user)
            elif _is_swap(user) and user.args[0] is src:
                swaps.append(user)
            else:
                return None
    return swaps, views


def sdpa_seq_first(pg) -> bool:
    """Replace each fusable ATen SDPA and its transposes by ``vkdelegate.sdpa_seq_first``
    (module docstring); True if any."""
    options = getattr(pg, "options", None)
    if options is not None and not options.sdpa_seq_first:
        return False
    if SDPA_SEQ_FIRST.name not in registry.load_all():
        return False
    allowed = getattr(pg, "op_allowed", None)
    if allowed is not None and not allowed(SDPA_SEQ_FIRST.name):
        return False
    on_vulkan = getattr(pg, "runs_on_vulkan", None)
    graph = pg.gm.graph
    target = SDPA_SEQ_FIRST.overload()
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or \
                node.target is not aten.scaled_dot_product_attention.default:
            continue
        args, backs = _match(node), _backs(node)
        if args is None or backs is None or (on_vulkan is not None and not on_vulkan(node)):
            continue
        swaps, views = backs
        inputs = node.args[:3]
        with graph.inserting_before(node):
            fused = graph.call_function(target, args)
        fused.meta = dict(swaps[0].meta)
        val = fused.meta.get("val")
        if isinstance(val, torch.Tensor) and not val.is_contiguous():
            with val.fake_mode:
                fused.meta["val"] = val.contiguous()
        for swap in swaps:
            swap.replace_all_uses_with(fused)
            graph.erase_node(swap)
        for view in reversed(views):  # readers before what they read
            graph.erase_node(view)
        graph.erase_node(node)
        for t in dict.fromkeys(inputs):
            if not t.users:
                graph.erase_node(t)
        changed = True
    return changed
