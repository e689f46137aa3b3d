"""Fold an inference batch norm into the convolution or linear layer before it.

``bn(conv(x, w, b))`` equals ``conv(x, w * s, (b - mean) * s + beta)`` with
``s = gamma / sqrt(var + eps)`` per output channel: one op instead of two, and the
batch norm's statistics never reach the device. Only folds when the weights and the
batch-norm statistics are constants and nothing else reads the conv/linear output.
"""
from __future__ import annotations

import operator

import torch

aten = torch.ops.aten

_BN = aten._native_batch_norm_legit_no_training.default


def _const(pg, node):
    """The constant tensor of a placeholder node, or None (also None for None)."""
    if isinstance(node, torch.fx.Node) and node.op == "placeholder":
        return pg.constants.get(node.name)
    return None


def _folded(pg, producer, bn):
    """(new weight, new bias) for ``bn`` after ``producer``, or None if not foldable."""
    inp, gamma, beta, mean, var, _momentum, eps = bn.args
    stats = [_const(pg, n) for n in (mean, var)]
    if any(s is None for s in stats):
        return None
    mean_t, var_t = stats
    gamma_t = _const(pg, gamma) if gamma is not None else torch.ones_like(mean_t)
    beta_t = _const(pg, beta) if beta is not None else torch.zeros_like(mean_t)
    if gamma_t is None or beta_t is None:
        return None
    if producer.target == aten.convolution.default:
        weight, bias, transposed = producer.args[1], producer.args[2], producer.args[6]
        if transposed:
            return None
    elif producer.target == aten.linear.default:
        weight = producer.args[1]
        bias = producer.args[2] if len(producer.args) > 2 else None
    else:
        return None
    w = _const(pg, weight)
    b = _const(pg, bias) if bias is not None else torch.zeros_like(mean_t)
    if w is None or b is None:
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
        folded = _folded(pg, producer, bn)
        if folded is None:
            continue
        new_w, new_b = folded
        w_node = pg.add_constant(f"{producer.name}_folded_weight", new_w)
        b_node = pg.add_constant(f"{producer.name}_folded_bias", new_b)
        args = list(producer.args)
        args[1] = w_node
        if producer.target == aten.linear.default and len(args) < 3:
            args.append(b_node)
        else:
            args[2] = b_node
        producer.args = tuple(args)
        for user in users:
            user.replace_all_uses_with(producer)
            graph.erase_node(user)
        graph.erase_node(bn)
        changed = True
    return changed
