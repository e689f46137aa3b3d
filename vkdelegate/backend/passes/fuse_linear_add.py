"""Fuse a linear and the residual add after it into ``vkdelegate.linear_add`` (or
``vkdelegate.linear_q4gsw_add`` for ExecuTorch's int4 weight-only linear).

Every decoder layer of an HF Llama/Qwen2/Mistral ends its attention and its MLP in
``h + o_proj(attn)`` and ``h + down_proj(mlp)``: the fused op adds the residual as the
linear writes its output, so in a decode step (one row: the GEMV kernels) the linear's
result is never written to device memory and read back, and one dispatch goes per
add. Safe only where the add is exactly that sum, which the pass checks:

- ``aten.add.Tensor`` with alpha 1 (float addition is commutative: either operand
  order fuses);
- of an ``aten.linear.default`` (input, weight, bias?) or ``et_vk.linear_q4gsw.default``
  (made by passes/quantized_linear from torchao's int4 weight-only linears) that
  nothing else reads;
- and a residual tensor of the add's output shape and dtype, float32 or float16 (no
  broadcasting, no type promotion), which is also the linear's output type.

Runs after the linear passes (quantized_linear, addmm_to_linear, the batch-norm fold,
merge_linears: they need the plain linears) and before fuse_elementwise, which would
otherwise swallow the add into an elementwise chain; only when the registry has the
fused ops.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import LINEAR_ADD, LINEAR_Q4GSW, LINEAR_Q4GSW_ADD
from vkdelegate.backend.passes.residual_add import fuse_adds
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float16)


def _fused_call(node) -> "tuple | None":
    """(fused target, its arguments without the residual) of a fusable linear node,
    else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.kwargs:
        return None
    if node.target == aten.linear.default and len(node.args) in (2, 3):
        args = tuple(node.args)
        return LINEAR_ADD.overload(), args + (None,) * (3 - len(args))
    if node.target == LINEAR_Q4GSW.overload() and len(node.args) in (4, 5):
        args = tuple(node.args)
        return LINEAR_Q4GSW_ADD.overload(), args + (None,) * (5 - len(args))
    return None


def fuse_linear_add(pg) -> bool:
    """Replace each linear -> add pair (see the module docstring) by the fused op;
    True if any."""
    ops = registry.load_all()
    if LINEAR_ADD.name not in ops or LINEAR_Q4GSW_ADD.name not in ops:
        return False
    return fuse_adds(pg.gm.graph, _fused_call, _DTYPES)
