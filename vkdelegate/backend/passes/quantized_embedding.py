"""Fuse torchao's int4 embedding (``IntxWeightOnlyConfig(torch.int4, PerGroup(g))``
applied to an ``nn.Embedding``: ``embedding(dequantize(q), indices)`` after
decomposition) into ExecuTorch's ``et_vk.embedding_q4gsw`` (as ExecuTorch's
backends/vulkan/patterns/quantized_embedding.py does).

The dequantized table must be fp32 (ExecuTorch's op returns fp32 whatever the
scales' dtype), symmetric and checked bit for bit as in ``passes/quantized_linear``;
the table is packed two values per byte in linear_q4gsw's order
(``is_linear_weight=True``: k even in the low nibble). Runs only when the registry
has the op.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import EMBEDDING_Q4GSW
from vkdelegate.backend.passes.quantized_linear import (_call, _dequantized_weight,
                                                        _erase_dead, _val, pack_4bit)
from vkdelegate.ops import registry

aten = torch.ops.aten


def fuse_quantized_embedding(pg) -> bool:
    """Replace each int4 dequantize -> embedding by ``et_vk.embedding_q4gsw``; True if
    any."""
    if EMBEDDING_Q4GSW.name not in registry.load_all():
        return False
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        if not _call(node, aten.embedding.default) or len(node.args) < 2:
            continue
        table, indices = node.args[:2]
        found = _dequantized_weight(pg, table)
        if found is None or _val(table).dtype != torch.float32 or found[2] != 4:
            continue
        q_node, scales, _ = found
        v, d = _val(table).shape
        group = d // scales.shape[1]
        if d % 8 or group % 8:
            continue
        packed = pg.add_constant(q_node.name + "_q4", pack_4bit(
            pg.constants[q_node.name].reshape(v, d)))
        s_node = pg.add_constant(q_node.name + "_scales", scales.contiguous())
        with graph.inserting_before(node):
            fused = graph.call_function(EMBEDDING_Q4GSW.overload(),
                                        (packed, s_node, group, indices, True))
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        todo, inner = [table], []
        while todo:
            n = todo.pop()
            if isinstance(n, torch.fx.Node) and n.op == "call_function" and n not in inner:
                inner.append(n)
                todo.extend(n.args)
        _erase_dead(graph, inner)
        changed = True
    return changed
