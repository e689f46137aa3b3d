"""Linear algebra: aten.linear.default, aten.addmm.default, aten.bmm.default.

Recorded by kernels/gemm.py, which picks the shader per device (kernels/gemm_tiles.py):
a batched matrix multiply with broadcasting batch dims, an optional bias broadcast
against the output, and alpha/beta scaling; fp32 and fp16 (accumulated in fp32). On
GPUs the GEMM core (gemm.glsl) or, for one row, the GEMV path (gemv.glsl), both
reading an ``nn.Linear`` weight ([out, in]) in place. On CPU drivers linear.glsl,
4 x 4 output tiles per invocation, with a constant weight prepacked at load as fp32
[ceil(out/4), in, 4] (the 4 columns of a tile are one load) and a weight computed at
run time read in place as its transpose.

- linear(input [..., K], weight [N, K], bias [N]?) -> [..., N]: any input rank 1..6.
- addmm(self, mat1 [M, K], mat2 [K, N], beta=1, alpha=1) -> [M, N]: ``self`` is
  any tensor that broadcasts to [M, N]; ATen ignores it (NaN included) when beta is 0.
- bmm(self [B, M, K], mat2 [B, K, N]) -> [B, M, N].

aten.mm.default lives in ops/matmul.py. aten.matmul.default is not registered: export
decomposes it into mm/bmm with expand and view, which run here and in the
data-movement family.
"""
from __future__ import annotations

from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.kernels import gemm
from vkdelegate.kernels.rules import same_dtype
from vkdelegate.kernels import residual
from vkdelegate.kernels import swiglu

DTYPES = gemm.DTYPES


def _broadcasts(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


# ---- linear -------------------------------------------------------------------------
def _linear_shape(args):
    return tuple(args[0].shape[:-1]) + (args[1].shape[0],)


def _linear_rule(node: NodeSpec):
    x, w, bias = node.args[0], node.args[1], node.args[2]
    if x.rank < 1 or w.rank != 2 or x.shape[-1] != w.shape[1]:
        return f"input {list(x.shape)} and weight {list(w.shape)} do not match"
    if x.dynamic and x.dynamic[-1]:
        return "dynamic input features"
    if bias is not None and not _broadcasts(bias.shape, (w.shape[0],)):
        return f"bias of sizes {list(bias.shape)} for {w.shape[0]} outputs"
    return None


def _linear_impl(b, node):
    x_id, w_id, bias_id, out_id = node.args
    bias, w = b.value(bias_id), b.tensor(w_id)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.matmul(b, b.tensor(out_id), b.tensor(x_id), w, bias, layout)


# ---- addmm --------------------------------------------------------------------------
def _addmm_shape(args):
    return (args[1].shape[0], args[2].shape[1])


def _addmm_rule(node: NodeSpec):
    bias, m1, m2 = node.args[0], node.args[1], node.args[2]
    if m1.rank != 2 or m2.rank != 2 or m1.shape[1] != m2.shape[0]:
        return f"cannot multiply {list(m1.shape)} by {list(m2.shape)}"
    if not _broadcasts(bias.shape, (m1.shape[0], m2.shape[1])):
        return f"self of sizes {list(bias.shape)} does not broadcast to the product"
    for name, v in (("beta", node.args[3]), ("alpha", node.args[4])):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return f"{name} {v!r} is not a real number"
    return None


def _addmm_impl(b, node):
    bias_id, m1_id, m2_id, beta_id, alpha_id, out_id = node.args
    beta, alpha = b.scalar(beta_id), b.scalar(alpha_id)
    gemm.matmul(b, b.tensor(out_id), b.tensor(m1_id), b.tensor(m2_id), b.tensor(bias_id),
                "kn", alpha=1.0 if alpha is None else float(alpha),
                beta=1.0 if beta is None else float(beta))


# ---- bmm ----------------------------------------------------------------------------
def _bmm_shape(args):
    a, m = args[0].shape, args[1].shape
    return (a[0], a[1], m[2])


def _bmm_rule(node: NodeSpec):
    a, m = node.args[0], node.args[1]
    if a.rank != 3 or m.rank != 3 or a.shape[0] != m.shape[0] or a.shape[2] != m.shape[1]:
        return f"bmm of {list(a.shape)} and {list(m.shape)}"
    return None


def _bmm_impl(b, node):
    a_id, m_id, out_id = node.args
    gemm.matmul(b, b.tensor(out_id), b.tensor(a_id), b.tensor(m_id), None, "kn")


register(OpSpec(name="aten.linear.default", dtypes=DTYPES, impl=_linear_impl,
                shape_fn=_linear_shape, rules=(_linear_rule, same_dtype),
                notes="input of any rank, weight read in place, optional bias"))
register(OpSpec(name="aten.addmm.default", dtypes=DTYPES, impl=_addmm_impl,
                shape_fn=_addmm_shape, rules=(_addmm_rule, same_dtype), max_rank=2,
                notes="broadcast self, beta and alpha"))
register(OpSpec(name="aten.bmm.default", dtypes=DTYPES, impl=_bmm_impl,
                shape_fn=_bmm_shape, rules=(_bmm_rule, same_dtype), max_rank=3,
                notes="fp32 accumulation"))


# ---- vkdelegate.linear_add.default: residual + linear (kernels/residual.py) ----------
LINEAR_ADD = "vkdelegate.linear_add.default"


def _linear_add_impl(b, node):
    x_id, w_id, bias_id, r_id, out_id = node.args
    out, r = residual.residual_tensor(b, out_id, r_id)
    bias, w = b.value(bias_id), b.tensor(w_id)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    if not gemm.matmul(b, out, b.tensor(x_id), w, bias, layout, residual=r):
        residual.add_after(b, out, r)


register(OpSpec(name=LINEAR_ADD, dtypes=DTYPES, impl=_linear_add_impl,
                shape_fn=_linear_shape,
                rules=(_linear_rule, same_dtype, residual.residual_rule(3)),
                notes="residual + linear(input, weight, bias?): the add in the GEMV "
                      "and linear.glsl epilogues, a second dispatch on the GEMM core; "
                      "fused from aten.add.Tensor"))


# ---- vkdelegate.linear_swiglu.default: merged gate/up linear + SwiGLU (kernels/swiglu.py)
LINEAR_SWIGLU = "vkdelegate.linear_swiglu.default"


def _swiglu_rule(node: NodeSpec):
    """input [..., K] with K static, weight [2F, K] (then swiglu.halves_rule: the
    bias, the output, the steps)."""
    x, w = node.args[:2]
    if not all(hasattr(t, "shape") for t in (x, w)):
        return "input and weight must be tensors"
    if x.rank < 1 or w.rank != 2 or x.shape[-1] != w.shape[1]:
        return f"input {list(x.shape)} and weight {list(w.shape)} do not match"
    if x.dynamic and x.dynamic[-1]:
        return "dynamic input features"
    return None


def _linear_swiglu_impl(b, node):
    x_id, w_id, bias_id, steps_id, out_id = node.args
    out, w = b.tensor(out_id), b.tensor(w_id)
    chain = swiglu.node_defines(b, steps_id, out.dtype)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.swiglu(b, out, b.tensor(x_id), w, b.value(bias_id), layout, chain,
                steps=b.value(steps_id))


register(OpSpec(name=LINEAR_SWIGLU, dtypes=DTYPES, impl=_linear_swiglu_impl,
                shape_fn=swiglu.halves_shape(1),
                rules=(_swiglu_rule, swiglu.halves_rule(1, 3, 2), same_dtype),
                notes="SwiGLU chain over the halves of a merged gate/up linear(input, "
                      "weight [2F, K], bias?) -> [..., F]: the chain in the GEMV and "
                      "linear.glsl epilogues (one dispatch); fused from the linear's "
                      "narrow_last parts and vkdelegate.fused_elementwise"))
