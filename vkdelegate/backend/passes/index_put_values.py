"""index_put values that broadcast to the written region -> an explicit expand.

``aten.index_put(x, indices, values)`` broadcasts ``values`` to the region it writes
(ATen: ``x.shape[:d] + index.shape + x.shape[d + 1:]`` for one index tensor on dim
``d``). The index_put kernels (and the cache-pair ops made from them,
kernels/cache_pair.py) fill the region element for element or from one element, so
a values tensor that broadcasts along some other dim stayed on the CPU with every
op after it. A multi-query model writes one K/V head into a cache of several that
way: Falcon on transformers releases that keep its own attention stores its
[1, 1, 1, E] key row into a cache region of [1, Hk, 1, E]. Here such values get an
``aten.expand`` to the region's sizes first (a copy on Vulkan, the values ATen's
broadcast reads). Only regions whose broadcast dims are static, and one index
tensor (the kernels' form); anything else is left for the op rule to explain.
"""
from __future__ import annotations

import torch

from vkdelegate.kernels.cache_pair import fits

aten = torch.ops.aten


def _region(x, indices):
    """The written region's sizes, or None when it is not one index tensor's."""
    tensors = [(d, t) for d, t in enumerate(indices) if t is not None]
    if len(tensors) != 1:
        return None
    d, index = tensors[0]
    index = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
    if not isinstance(index, torch.Tensor) or d >= x.dim():
        return None
    return tuple(x.shape[:d]) + tuple(index.shape) + tuple(x.shape[d + 1:])


def _expand_sizes(values, region):
    """expand()'s sizes taking ``values`` to ``region`` (-1 keeps a dim), or None
    when it does not broadcast there or a broadcast dim is symbolic."""
    if values.dim() > len(region):
        return None
    lead = len(region) - values.dim()
    sizes = []
    for i, size in enumerate(region):
        have = values.shape[i - lead] if i >= lead else None
        if have is not None and have is size:
            sizes.append(-1)
        elif not isinstance(size, int):
            return None
        elif have is None or have == 1:
            sizes.append(size)
        elif have == size:
            sizes.append(-1)
        else:
            return None
    return sizes


def index_put_values(pg) -> bool:
    """Insert the expands (module docstring); True if any was inserted."""
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.index_put.default,
                                                                aten.index_put_.default):
            continue
        x_node, indices, v_node = node.args[:3]
        if len(node.args) > 3 and node.args[3]:
            continue  # accumulate: another op (unique_index_put)
        x = x_node.meta.get("val") if isinstance(x_node, torch.fx.Node) else None
        values = v_node.meta.get("val") if isinstance(v_node, torch.fx.Node) else None
        if not isinstance(x, torch.Tensor) or not isinstance(values, torch.Tensor):
            continue
        region = _region(x, indices)
        if region is None or fits(values.shape, region):
            continue
        sizes = _expand_sizes(values, region)
        if sizes is None:
            continue
        with graph.inserting_before(node):
            expand = graph.call_function(aten.expand.default, (v_node, sizes))
        expand.meta["val"] = values.expand(region)
        node.update_arg(2, expand)
        changed = True
    return changed
