"""Fold the SwiGLU chain after a merged gate/up linear into the linear:
``vkdelegate.fused_elementwise([narrow_last(y, 0, F), narrow_last(y, F, F)], steps)``
of y = ``aten.linear(x, weight [2F, K], bias?)`` becomes ``vkdelegate.linear_swiglu(x,
weight, bias, steps')`` (kernels/swiglu.py): one dispatch instead of two per decode
layer, the chain computed in the GEMV's epilogue (gemv.glsl's SWIGLU; linear.glsl's on
CPU drivers) from the gate and up sums rounded as the linear's store rounds them, so
the output's bits are the unfused pair's.

In an HF Llama/Qwen2/Mistral decode step, passes/merge_linears merges gate_proj and
up_proj (one-row input) into one linear whose two ``narrow_last`` parts the SiLU gate
chain reads (passes/fuse_elementwise: ``silu(gate) * up``, in float16 with ATen's casts
around the SiLU). Fused only when exactly that is there:

- the fused chain reads exactly two tensors, both ``vkdelegate.narrow_last`` parts of
  one producer: the first half [0, F) and the second [F, 2F) of its last dim (2F
  static), the chain is each part's only reader and the two parts are the producer's
  only readers;
- the producer is ``aten.linear.default(x, weight, bias?)`` with a weight [2F, K] and a
  bias [2F] (or none), or ``vkdelegate.rms_norm_linear`` (passes/fuse_rms_norm_linear:
  the post-attention norm folded into the merged linear), which makes the fused node
  ``vkdelegate.rms_norm_linear_swiglu(x, norm_weight, eps, weight, bias, steps')``
  (the norm, the GEMV and the chain in one dispatch; with compile option
  ``rms_norm_prologue`` off the op records the norm's dispatch first);
- the producer's output, the parts and the chain's output are float32 or float16 of
  one dtype, and the chain computes exactly one of kernels/swiglu.py's ``CHAINS``
  (``swiglu.match``: SiLU of the first half times the second, with the same rounding
  steps; no scalars), whose canonical text the fused op then carries.

A chain over the halves in the other roles (SiLU of the second half), a GeGLU (gemma's
gelu), a part read elsewhere or a graph output, a merged q/k/v linear: left alone.
Runs right after fuse_elementwise (which makes the chain); off with compile option
``fuse_linear_swiglu`` = False, and where the registry lacks the op.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import (FUSED_ELEMENTWISE, LINEAR_SWIGLU,
                                           RMS_NORM_LINEAR, RMS_NORM_LINEAR_SWIGLU)
from vkdelegate.backend.custom_ops_llm import NARROW_LAST
from vkdelegate.kernels import swiglu
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = {torch.float32: "float32", torch.float16: "float16"}


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _part(node):
    """(producer, start, length) of a ``narrow_last`` node with int arguments, else
    None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" \
            or node.target != NARROW_LAST.overload() or node.kwargs or len(node.args) != 3:
        return None
    src, start, length = node.args
    if not isinstance(src, torch.fx.Node) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (start, length)):
        return None
    return src, start, length


def _linear_args(producer):
    """(x, weight, bias, norm args or None) of a fusable producer, else None."""
    if producer.op != "call_function" or producer.kwargs:
        return None
    if producer.target == aten.linear.default and len(producer.args) in (2, 3):
        x, w = producer.args[:2]
        return x, w, producer.args[2] if len(producer.args) == 3 else None, None
    if producer.target == RMS_NORM_LINEAR.overload() and len(producer.args) in (4, 5):
        x, nw, eps, w = producer.args[:4]
        return x, w, producer.args[4] if len(producer.args) == 5 else None, (nw, eps)
    return None


def _match(node):
    """(producer, x, weight, bias, norm, canonical steps) for a fusable chain ``node``
    (module docstring), else None."""
    if node.op != "call_function" or node.target != FUSED_ELEMENTWISE.overload() \
            or node.kwargs or len(node.args) != 3:
        return None
    inputs, steps, scalars = node.args
    if not isinstance(inputs, (list, tuple)) or len(inputs) != 2 or inputs[0] is inputs[1] \
            or not isinstance(steps, str):
        return None
    parts = [_part(p) for p in inputs]
    if None in parts or parts[0][0] is not parts[1][0]:
        return None
    producer = parts[0][0]
    if set(producer.users) != set(inputs) or any(set(p.users) != {node} for p in inputs):
        return None
    out, y = _val(node), _val(producer)
    if not isinstance(out, torch.Tensor) or not isinstance(y, torch.Tensor) \
            or out.dtype not in _DTYPES or y.dtype != out.dtype or y.dim() < 1 \
            or not isinstance(y.shape[-1], int) or y.shape[-1] < 2 or y.shape[-1] % 2:
        return None
    f = y.shape[-1] // 2
    spans = [(start, length) for _, start, length in parts]
    if sorted(spans) != [(0, f), (f, f)] or \
            any(_val(p) is None or _val(p).dtype != out.dtype for p in inputs):
        return None
    args = _linear_args(producer)
    if args is None:
        return None
    x, w, bias, norm = args
    wv, bv = _val(w), _val(bias)
    if not isinstance(wv, torch.Tensor) or wv.dim() != 2 or wv.dtype != out.dtype \
            or tuple(wv.shape)[:1] != (2 * f,):
        return None
    if bias is not None and (not isinstance(bv, torch.Tensor) or bv.dtype != out.dtype
                             or tuple(bv.shape) != (2 * f,)):
        return None
    canon = swiglu.match(steps, list(scalars), _DTYPES[out.dtype], spans[0] == (0, f))
    if canon is None:
        return None
    return producer, x, w, bias, norm, canon


def fuse_linear_swiglu(pg) -> bool:
    """Replace each merged gate/up linear and its SwiGLU chain (module docstring) by
    ``vkdelegate.linear_swiglu``; True if any."""
    options = getattr(pg, "options", None)
    if options is not None and not options.fuse_linear_swiglu:
        return False
    ops = registry.load_all()
    if LINEAR_SWIGLU.name not in ops or RMS_NORM_LINEAR_SWIGLU.name not in ops:
        return False
    graph = pg.gm.graph
    changed = False
    for node in list(graph.nodes):
        found = _match(node)
        if found is None:
            continue
        producer, x, w, bias, norm, canon = found
        with graph.inserting_before(node):
            if norm is None:
                fused = graph.call_function(LINEAR_SWIGLU.overload(), (x, w, bias, canon))
            else:
                fused = graph.call_function(RMS_NORM_LINEAR_SWIGLU.overload(),
                                            (x,) + tuple(norm) + (w, bias, canon))
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        parts = list(node.args[0])
        graph.erase_node(node)
        for part in parts:
            graph.erase_node(part)
        graph.erase_node(producer)
        changed = True
    return changed
