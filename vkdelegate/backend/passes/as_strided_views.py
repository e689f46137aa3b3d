"""``as_strided`` calls that are views of a contiguous tensor become ``aten.view``.

Decompositions leave ``as_strided`` where a result's strides must match eager's
memory format: torchvision's ConvNeXt pools a channels-last activation, and
``adaptive_avg_pool2d(x, 1)`` decomposes to ``mean(x, [-1, -2], keepdim=True)``
then ``as_strided(mean, [1, C, 1, 1], [C, 1, C, C])``. Over a contiguous input whose
storage offset is 0, sizes with the same element count and strides equal to the
contiguous strides of those sizes wherever a size is not 1 (a size-1 dim's stride
addresses nothing) read every element where ``view`` does. Nothing may run
``as_strided`` itself (raw strides into storage: not on the CPU glue's allow-list);
other uses stay and are refused by name. Static sizes only.
"""
from __future__ import annotations

import math

import torch

from vkdelegate.kernels.affine_copy import contiguous_strides

aten = torch.ops.aten


def _is_view(node: torch.fx.Node) -> bool:
    args = list(node.args) + [None] * 4
    src, sizes, strides, offset = args[:4]
    offset = node.kwargs.get("storage_offset", offset)
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if val is None or offset not in (None, 0) or not isinstance(sizes, (list, tuple)) \
            or not isinstance(strides, (list, tuple)) or len(sizes) != len(strides):
        return False
    if not all(isinstance(v, int) for v in list(sizes) + list(strides) + list(val.shape)):
        return False
    if not val.is_contiguous() or val.storage_offset() != 0 \
            or math.prod(sizes) != math.prod(val.shape):
        return False
    return all(s == 1 or st == want
               for s, st, want in zip(sizes, strides, contiguous_strides(sizes)))


def as_strided_views(pg) -> bool:
    """Replace each ``aten.as_strided.default`` that is a view (see the module
    docstring) by ``aten.view.default``; True if any was replaced."""
    changed = False
    graph = pg.gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.as_strided.default \
                or not _is_view(node):
            continue
        with graph.inserting_before(node):
            view = graph.call_function(aten.view.default, (node.args[0], list(node.args[1])))
        view.meta = dict(node.meta)
        node.replace_all_uses_with(view)
        graph.erase_node(node)
        changed = True
    return changed
