"""A linear with its residual add: vkdelegate.linear_add.default and
vkdelegate.linear_q4gsw_add.default (backend/custom_ops.py; made by
backend/passes/fuse_linear_add.py from a linear -> aten.add.Tensor).

- linear_add(input [..., K], weight [N, K], bias [N]?, residual [..., N]) -> [..., N]
  = residual + linear(input, weight, bias): aten.linear's semantics
  (ops/families/linear.py), residual of exactly the output's shape and dtype.
- linear_q4gsw_add(self, weights, weight_scales, group_size, bias?, residual) =
  residual + et_vk.linear_q4gsw(...) (ops/families/quantized_linear.py).

The forms that decode takes add the residual in their epilogue, in one dispatch: the
GEMV path (gemv.glsl, one row on GPUs), linear.glsl (every product on CPU drivers) and
the int4 vectorized GEMV (linear_qw_gemv.glsl), each with HAS_RESIDUAL. The others
(the GEMM core and its cooperative-matrix form for prefill on GPUs, linear_qw.glsl)
run the linear's dispatch into the output and then aten.add.Tensor's (binary_op.glsl)
on it in place: two dispatches, as unfused.

Rounding: fused, the residual is added in fp32 to the fp32 result of the product and
bias, and the sum rounded once at the store; eager rounds the linear's output to the
dtype and then rounds the add. In fp32 that is at most one fp32 rounding (2^-24
relative of the linear's output) apart; in fp16 at most one fp16 rounding of the
linear's output (2^-11 of |linear|), well inside the fp16 linear tolerance of 1e-2.
"""
from __future__ import annotations

from vkdelegate.kernels import gemm
from vkdelegate.kernels.rules import same_dtype
from vkdelegate.ops.families import linear as linear_family
from vkdelegate.ops.families import quantized_linear as q
from vkdelegate.ops.families.binary import record_add
from vkdelegate.ops.registry import NodeSpec, OpSpec, register

LINEAR_ADD = "vkdelegate.linear_add.default"
Q4GSW_ADD = "vkdelegate.linear_q4gsw_add.default"


def _residual(b, out_id: int, residual_id: int):
    """The residual Tensor, refused (VkDelegateError) unless of out's sizes and dtype."""
    out, residual = b.tensor(out_id), b.tensor(residual_id)
    if tuple(residual.max_shape) != tuple(out.max_shape) or residual.dtype != out.dtype:
        raise b.error(f"residual {list(residual.max_shape)} {residual.dtype} for an "
                      f"output {list(out.max_shape)} {out.dtype}")
    return out, residual


def _linear_add_impl(b, node):
    x_id, w_id, bias_id, r_id, out_id = node.args
    out, residual = _residual(b, out_id, r_id)
    bias, w = b.value(bias_id), b.tensor(w_id)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    if not gemm.matmul(b, out, b.tensor(x_id), w, bias, layout, residual=residual):
        record_add(b, out, out, residual)


def _q4gsw_add_impl(b, node):
    x_id, w_id, s_id, gs_id, bias_id, r_id, out_id = node.args
    out, residual = _residual(b, out_id, r_id)
    if not q._record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id),
                     b.value(bias_id), out, 4, int(b.scalar(gs_id)), residual=residual):
        record_add(b, out, out, residual)


def _residual_rule(at: int):
    """The residual (argument ``at``) has the output's sizes and dtype (no
    broadcasting, no promotion)."""
    def rule(node: NodeSpec):
        r = node.args[at]
        out = node.outputs[0] if node.outputs else None
        if out is None or not hasattr(r, "shape"):
            return "the residual must be a tensor"
        if tuple(r.shape) != tuple(out.shape) or r.dtype != out.dtype:
            return (f"residual {list(r.shape)} {r.dtype} for an output {list(out.shape)} "
                    f"{out.dtype}: the residual must have the output's sizes and dtype")
        return None
    return rule


def _q4_shape(args):
    return tuple(args[0].shape[:-1]) + (args[1].shape[0],)


register(OpSpec(name=LINEAR_ADD, dtypes=linear_family.DTYPES, impl=_linear_add_impl,
                shape_fn=linear_family._linear_shape,
                rules=(linear_family._linear_rule, same_dtype, _residual_rule(3)),
                notes="residual + linear(input, weight, bias?): the add in the GEMV "
                      "and linear.glsl epilogues, a second dispatch on the GEMM core; "
                      "fused from aten.add.Tensor"))
register(OpSpec(name=Q4GSW_ADD, dtypes=q.DTYPES, impl=_q4gsw_add_impl, shape_fn=_q4_shape,
                rules=(lambda n: q._q4_rule(n, 1, 2, 3), _residual_rule(5)),
                arg_dtypes={1: frozenset({"uint8"})},
                notes="residual + linear_q4gsw(...): the add in the int4 vectorized "
                      "GEMV's epilogue, a second dispatch on the other forms; fused "
                      "from aten.add.Tensor"))
