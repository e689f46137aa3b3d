"""Fold a zero ``constant_pad_nd`` into the 2-D convolutions that read it.

TensorFlow-style models (EfficientNet-Lite, MobileNet ports) pad asymmetrically before
strided convolutions ("SAME": one more row and column at the end than at the start),
which aten.convolution's symmetric ``padding`` cannot express, so export keeps a
``constant_pad_nd`` that writes a padded copy of every such input: 27% of
EfficientNet-Lite0's GPU time on lavapipe (docs/PERF.md). The fold replaces
``convolution(constant_pad_nd(x, [l, r, t, b], 0), ...)`` (and ``et_vk.conv_with_clamp``
of one) by ``vkdelegate.padded_conv_with_clamp`` on ``x`` with begin padding
[t + p_h, l + p_w] and end padding [b + p_h, r + p_w] (p: the convolution's own
padding), whose shader reads zeros outside ``x``. Only for 2-D, non-transposed
convolutions of a 4-D input padded by non-negative amounts on its last two dims with
the value 0; the pad node goes once no convolution reads it any more. Runs only when
the registry has the fused op.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import CONV_WITH_CLAMP, PADDED_CONV_WITH_CLAMP
from vkdelegate.ops import registry

aten = torch.ops.aten


def _spatial_pads(pad_node: torch.fx.Node):
    """([top, left], [bottom, right]) of a zero constant_pad_nd of a 4-D tensor's last
    two dims, or None."""
    if pad_node.op != "call_function" or pad_node.target != aten.constant_pad_nd.default:
        return None
    x = pad_node.args[0]
    pads = list(pad_node.args[1])
    value = pad_node.kwargs.get("value", pad_node.args[2] if len(pad_node.args) > 2 else 0)
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if val is None or val.dim() != 4 or value != 0 or len(pads) not in (2, 4):
        return None
    if not all(isinstance(p, int) and p >= 0 for p in pads):
        return None
    left, right, top, bottom = (pads + [0, 0])[:4]
    return [top, left], [bottom, right]


def _conv_args(conv: torch.fx.Node):
    """(aten.convolution's 9 arguments, output_min, output_max) of a foldable 2-D
    convolution node, or None."""
    if conv.target == aten.convolution.default and not conv.kwargs:
        args, bounds = list(conv.args), [None, None]
    elif conv.target == CONV_WITH_CLAMP.overload() and not conv.kwargs:
        args, bounds = list(conv.args[:9]), (list(conv.args[9:11]) + [None, None])[:2]
    else:
        return None
    if len(args) != 9 or args[6] or len(args[4]) not in (1, 2):
        return None
    return args, bounds


def fold_conv_padding(pg) -> bool:
    """Replace each zero-pad -> 2-D convolution pair by the padded convolution; True
    if any was folded."""
    if PADDED_CONV_WITH_CLAMP.name not in registry.load_all():
        return False
    padded_op = PADDED_CONV_WITH_CLAMP.overload()
    graph = pg.gm.graph
    changed = False
    for conv in list(graph.nodes):
        if conv.op != "call_function":
            continue
        parsed = _conv_args(conv)
        if parsed is None or not isinstance(conv.args[0], torch.fx.Node):
            continue
        pads = _spatial_pads(conv.args[0])
        if pads is None:
            continue
        args, (lo, hi) = parsed
        pad_node = conv.args[0]
        own = list(args[4]) * (2 if len(args[4]) == 1 else 1)
        begin = [pads[0][i] + own[i] for i in range(2)]
        end = [pads[1][i] + own[i] for i in range(2)]
        new_args = (pad_node.args[0],) + tuple(args[1:4]) + (begin,) + tuple(args[5:9]) \
            + (lo, hi, end)
        with graph.inserting_before(conv):
            fused = graph.call_function(padded_op, new_args)
        fused.meta = dict(conv.meta)
        conv.replace_all_uses_with(fused)
        graph.erase_node(conv)
        if not pad_node.users:
            graph.erase_node(pad_node)
        changed = True
    return changed
