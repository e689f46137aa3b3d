"""The residual operand of the linear + add fusions: vkdelegate.linear_add.default
(registered in ops/families/linear.py) and vkdelegate.linear_q4gsw_add.default
(ops/families/quantized_linear.py), made by backend/passes/fuse_linear_add.py from a
linear -> aten.add.Tensor (backend/custom_ops.py defines them).

- linear_add(input [..., K], weight [N, K], bias [N]?, residual [..., N]) -> [..., N]
  = residual + linear(input, weight, bias): aten.linear's semantics, residual of
  exactly the output's shape and dtype.
- linear_q4gsw_add(self, weights, weight_scales, group_size, bias?, residual) =
  residual + et_vk.linear_q4gsw(...); likewise weight_int8pack_mm_add and
  linear_dq8ca_q4gsw_add (ops/families/quantized_linear.py).

The forms that decode takes add the residual in their epilogue, in one dispatch: the
GEMV path (gemv.glsl, one row on GPUs), linear.glsl (every product on CPU drivers) and
the quantized products' kernels (linear_qw_gemv.glsl, linear_qw_texel.glsl and
linear_qw.glsl), each with HAS_RESIDUAL. The others (the GEMM core and its
cooperative-matrix form for prefill on GPUs) run the linear's dispatch into the output
and then ``add_after`` (aten.add.Tensor's binary_op.glsl) on it in place: two
dispatches, as unfused.

Rounding: fused, the residual is added in fp32 to the fp32 result of the product and
bias, and the sum rounded once at the store; eager rounds the linear's output to the
dtype and then rounds the add. In fp32 that is at most one fp32 rounding (2^-24
relative of the linear's output) apart; in fp16 at most one fp16 rounding of the
linear's output (2^-11 of |linear|), well inside the fp16 linear tolerance of 1e-2.
"""
from __future__ import annotations

from vkdelegate.kernels.binary_dispatch import record_add


def residual_tensor(b, out_id: int, residual_id: int):
    """(out, residual) Tensors of a fused node, VkDelegateError (``b.error``) unless
    the residual has out's sizes and dtype."""
    out, residual = b.tensor(out_id), b.tensor(residual_id)
    if tuple(residual.max_shape) != tuple(out.max_shape) or residual.dtype != out.dtype:
        raise b.error(f"residual {list(residual.max_shape)} {residual.dtype} for an "
                      f"output {list(out.max_shape)} {out.dtype}")
    return out, residual


def add_after(b, out, residual) -> None:
    """The fallback: out += residual as a second dispatch, after the linear's."""
    record_add(b, out, out, residual)


def residual_rule(at: int):
    """Load rule: the residual (argument ``at``) has the output's sizes and dtype (no
    broadcasting, no promotion)."""
    def rule(node):
        r = node.args[at]
        out = node.outputs[0] if node.outputs else None
        if out is None or not hasattr(r, "shape"):
            return "the residual must be a tensor"
        if tuple(r.shape) != tuple(out.shape) or r.dtype != out.dtype:
            return (f"residual {list(r.shape)} {r.dtype} for an output {list(out.shape)} "
                    f"{out.dtype}: the residual must have the output's sizes and dtype")
        return None
    return rule
