"""0-d operands of an elementwise op cast to the op's result dtype.

ATen lets a dimensioned tensor win over a 0-d one of its category: ``float16[n]``
clamped to ``float32[]`` bounds is float16 (T5's fp16 clamp of its hidden states to
``finfo.max`` computed as a 0-d float32 tensor), and ATen's clamp and where compute
it by casting the 0-d operand to float16 first. The op families take one dtype per category
(kernels/elementwise.py ``promote``), so such a node stayed on the CPU. Here each 0-d
operand whose dtype differs from the node's result, in the same category, gets an
explicit ``_to_copy`` to it: the same values ATen computes with, and a constant one
folds at lowering (fold_constants). Static 0-d shapes only.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.node_specs import dtype_name
from vkdelegate.kernels.elementwise import category
from vkdelegate.serialization.builder import op_name

aten = torch.ops.aten

#: op name -> the argument positions that are elementwise operands of the result.
#: Only ops whose ATen kernels cast every operand to the result dtype first: ATen's
#: CPU add / sub / mul / div of a reduced float type keep a 0-d operand in float
#: (``original_scalar_value<opmath_t>``), which a cast to float16 would round.
_OPERANDS = {"aten.where.self": (1, 2), "aten.clamp.Tensor": (0, 1, 2)}


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def zero_dim_operands(pg) -> bool:
    """Insert the casts (see the module docstring); True if any was inserted."""
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        positions = _OPERANDS.get(op_name(node.target))
        out = node.meta.get("val")
        if positions is None or not isinstance(out, torch.Tensor):
            continue
        vals = [(i, _val(node.args[i])) for i in positions if i < len(node.args)]
        tensors = [(i, v) for i, v in vals if isinstance(v, torch.Tensor)]
        dimensioned = [v for _, v in tensors if v.dim() > 0]
        if not dimensioned:
            continue
        want = dtype_name(out.dtype)
        for i, v in tensors:
            have = dtype_name(v.dtype)
            if v.dim() != 0 or have == want or category(have) != category(want):
                continue
            with graph.inserting_before(node):
                cast = graph.call_function(aten._to_copy.default, (node.args[i],),
                                           {"dtype": out.dtype})
            cast.meta["val"] = v.to(out.dtype)
            node.update_arg(i, cast)
            changed = True
    return changed
