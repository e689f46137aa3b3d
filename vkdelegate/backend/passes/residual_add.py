"""The shared step of the add-epilogue fusions (fuse_conv_add, fuse_linear_add): an
``aten.add.Tensor(producer, other)`` with alpha 1, either operand order (float addition
is commutative), whose producer nothing else reads and whose ``other`` has the
producer's and the add's dtype and provably equal sizes (no broadcasting, no type
promotion), becomes one call of a fused op taking ``other`` as its last argument."""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten


def same_tensor_type(a: torch.fx.Node, b, dtypes=None) -> bool:
    """Whether a and b are floating tensors of one dtype (one of ``dtypes`` when given)
    and provably equal sizes (symbolic sizes too)."""
    va = a.meta.get("val")
    vb = b.meta.get("val") if isinstance(b, torch.fx.Node) else None
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)) or \
            va.dtype != vb.dtype or not va.dtype.is_floating_point or \
            (dtypes is not None and va.dtype not in dtypes) or va.dim() != vb.dim():
        return False
    return all(statically_known_true(x == y) for x, y in zip(va.shape, vb.shape))


def plain_add(node) -> bool:
    """Whether ``node`` is ``aten.add.Tensor(a, b)`` with alpha 1 (no other kwargs)."""
    return node.op == "call_function" and node.target == aten.add.Tensor and \
        len(node.args) == 2 and node.kwargs.get("alpha", 1) == 1 and \
        not set(node.kwargs) - {"alpha"}


def fuse_adds(graph: torch.fx.Graph, match, dtypes=None) -> bool:
    """Replace each such add (module docstring) of a producer ``match`` accepts:
    ``match(node)`` gives (fused target, the producer's arguments) or None; the fused
    call gets those arguments plus the other operand. True if any add was fused."""
    changed = False
    for add in list(graph.nodes):
        if not plain_add(add):
            continue
        for producer, other in (add.args, add.args[::-1]):
            found = match(producer)
            if found is None or len(producer.users) != 1 or producer is other or \
                    not same_tensor_type(producer, other, dtypes) or \
                    not same_tensor_type(producer, add, dtypes):
                continue
            target, args = found
            with graph.inserting_before(add):
                fused = graph.call_function(target, tuple(args) + (other,))
            fused.meta = dict(add.meta)
            add.replace_all_uses_with(fused)
            graph.erase_node(add)
            graph.erase_node(producer)
            changed = True
            break
    return changed
