"""The dispatch of binary_op.glsl, the shader of the elementwise binary ops
(ops/families/binary.py): its name, scalar parameter block, defines and bindings, and
``record_add``, aten.add.Tensor's dispatch for fused ops whose kernel cannot add in its
epilogue (the linear_add fallbacks, kernels/residual.py)."""
from __future__ import annotations

from vkdelegate.kernels.broadcast import PLAN_PARAMS, plan_dispatch
from vkdelegate.kernels.elementwise import load_define
from vkdelegate.kernels.elementwise_exprs import BINARY_OPS
from vkdelegate.runtime.dtypes import acc_type, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings

SHADER = "binary_op"
# x: alpha, as a float (float variants) and as an int (integer variants).
SCALAR_PARAMS = ParamBlock("scalars_block", [("fscalars", "vec4"), ("iscalars", "ivec4")])


def binary_defines(expr: str, out, a, b, compute: str) -> dict:
    """binary_op.glsl's defines: out, a, b Tensors or (graph dtype, device dtype)
    pairs, ``expr`` the GLSL expression in a, b, ``compute`` the computation dtype."""
    d = storage_defines(OUT=out, A=a, B=b)
    d.update(ACC_T=acc_type(compute), OP_EXPR=expr, **{
        "A_LOAD(v)": load_define(d["A_T"], compute),
        "B_LOAD(v)": load_define(d["B_T"], compute)})
    if acc_type(compute) == "float":
        d["ACC_FLOAT"] = "1"
    return d


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("a_data", "b_data"),
                    params=(PLAN_PARAMS, SCALAR_PARAMS))


def record_add(bld, out, a, b) -> None:
    """Record aten.add.Tensor's dispatch out = a + b (alpha 1) for float tensors a, b
    of out's shape and dtype; ``a`` may be ``out`` itself (each invocation reads its
    element before writing it)."""
    op = BINARY_OPS["aten.add.Tensor"]
    params = bld.params(SCALAR_PARAMS.pack(fscalars=[1.0], iscalars=[0]))
    plan_dispatch(bld, SHADER, binary_defines(op.expr, out, a, b, out.dtype), out, [a, b],
                  extra_params=(params,))
