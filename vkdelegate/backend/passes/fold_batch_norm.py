"""Fold an inference batch norm into the convolution or linear layer before it.

``bn(conv(x, w, b))`` equals ``conv(x, w * s, (b - mean) * s + beta)`` with
``s = gamma / sqrt(var + eps)`` per output channel: one op instead of two, and the
batch norm's statistics never reach the device. A linear layer may appear as
``aten.linear``, or decomposed as ``addmm(b, x, permute(w, [1, 0]))`` / ``mm(x,
permute(w, [1, 0]))``. Only folds when the weights and the statistics are constants
and nothing else reads the layer's output (or the transposed weight).
"""
from __future__ import annotations

import operator

import torch

aten = torch.ops.aten

_BN = aten._native_batch_norm_legit_no_training.default


def _const(pg, node):
    """The constant tensor of a placeholder node, or None."""
    if isinstance(node, torch.fx.Node) and node.op == "placeholder":
        return pg.constants.get(node.name)
    return None


def _transposed_weight(pg, node):
    """w if ``node`` is ``permute(w, [1, 0])`` of a constant and has one user."""
    if (isinstance(node, torch.fx.Node) and node.target == aten.permute.default
            and list(node.args[1]) == [1, 0] and len(node.users) == 1
            and _const(pg, node.args[0]) is not None):
        return node.args[0]
    return None


def _layer(pg, producer):
    """(weight node, bias node or None, apply(w_node, b_node)) of a foldable layer."""
    args = list(producer.args)
    if producer.target == aten.convolution.default and not args[6]:  # not transposed
        def apply(w, b):
            producer.args = tuple(args[:1] + [w, b] + args[3:])
        return args[1], args[2], apply
    if producer.target == aten.linear.default:
        def apply(w, b):
            producer.args = (args[0], w, b)
        return args[1], args[2] if len(args) > 2 else None, apply
    if producer.target in (aten.addmm.default, aten.mm.default) and not producer.kwargs:
        is_addmm = producer.target == aten.addmm.default
        permute = args[2] if is_addmm else args[1]
        weight = _transposed_weight(pg, permute)
        if weight is None:
            return None
        x = args[1] if is_addmm else args[0]

        def apply(w, b):
            permute.args = (w, [1, 0])
            producer.target = aten.addmm.default
            producer.args = (b, x, permute)
        return weight, args[0] if is_addmm else None, apply
    return None


def _folded(pg, weight, bias, bn):
    """(new weight, new bias) tensors, or None if a needed value is not constant."""
    _inp, gamma, beta, mean, var, _momentum, eps = bn.args
    mean_t, var_t = _const(pg, mean), _const(pg, var)
    if mean_t is None or var_t is None:
        return None
    gamma_t = _const(pg, gamma) if gamma is not None else torch.ones_like(mean_t)
    beta_t = _const(pg, beta) if beta is not None else torch.zeros_like(mean_t)
    w = _const(pg, weight)
    b = _const(pg, bias) if bias is not None else torch.zeros_like(mean_t)
    if gamma_t is None or beta_t is None or w is None or b is None or b.dim() != 1:
        return None
    # Compute in float64 so that folding adds no rounding error of its own.
    scale = gamma_t.double() / torch.sqrt(var_t.double() + eps)
    shape = (-1,) + (1,) * (w.dim() - 1)
    new_w = (w.double() * scale.reshape(shape)).to(w.dtype)
    new_b = ((b.double() - mean_t.double()) * scale + beta_t.double()).to(w.dtype)
    return new_w, new_b


def fold_batch_norm(pg) -> bool:
    """Fold every foldable conv/linear -> batch norm pair; True if any folded."""
    changed = False
    graph = pg.gm.graph
    for bn in list(graph.nodes):
        if bn.op != "call_function" or bn.target != _BN:
            continue
        producer = bn.args[0]
        if not isinstance(producer, torch.fx.Node) or len(producer.users) != 1:
            continue
        users = list(bn.users)
        # Only output 0 (the normalized tensor) may be used; the saved statistics
        # outputs have no folded equivalent.
        if not all(u.target is operator.getitem and u.args[1] == 0 for u in users):
            continue
        layer = _layer(pg, producer)
        if layer is None:
            continue
        weight, bias, apply = layer
        folded = _folded(pg, weight, bias, bn)
        if folded is None:
            continue
        apply(pg.add_constant(f"{producer.name}_folded_weight", folded[0]),
              pg.add_constant(f"{producer.name}_folded_bias", folded[1]))
        for user in users:
            user.replace_all_uses_with(producer)
            graph.erase_node(user)
        graph.erase_node(bn)
        changed = True
    return changed
