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
# x: alpha, as a float (float variants) and as an int (integer variants); iscalars.y:
# CHECK_INT32's error-flag word.
SCALAR_PARAMS = ParamBlock("scalars_block", [("fscalars", "vec4"), ("iscalars", "ivec4")])


#: The integer expressions whose int64 result is checked against the int32 range the
#: device holds it in (int_checked.h): add / sub (with alpha), mul and the integer
#: divisions (-2^31 / -1).
CHECKED_EXPRS = {"-x": "neg_checked(x)", "abs(x)": "abs_checked(x)",
                 "a + ALPHA * b": "add_checked(a, mul_checked(ALPHA, b))",
                 "a * b": "mul_checked(a, b)",
                 "div_trunc(a, b)": "div_trunc(a, div_guard(a, b))",
                 "div_floor(a, b)": "div_floor(a, div_guard(a, b))"}

#: The integer expressions of any integer result that flag a zero divisor
#: (int_checked.h's zero_guard; an int64 division's div_guard does too): ATen raises
#: ZeroDivisionError where the shader's value would be 0 (or the dividend, for fmod).
ZERO_CHECKED_EXPRS = {"div_trunc(a, b)": "div_trunc(a, zero_guard(b))",
                      "div_floor(a, b)": "div_floor(a, zero_guard(b))",
                      "remainder_edges(a, b)": "remainder_edges(a, zero_guard(b))",
                      "fmod_edges(a, b)": "fmod_edges(a, zero_guard(b))"}


def checked_int64(expr: str, out, compute: str) -> bool:
    """Whether binary_op.glsl computes ``expr`` with CHECK_INT32: an int64 result
    (``out`` a Tensor or (graph dtype, device dtype) pair) of integer arithmetic that
    may leave the int32 range (ATen's int64 would not wrap there). Binary and unary
    ops share it (unary.py: neg, abs)."""
    out_dtype = out[0] if isinstance(out, tuple) else out.dtype
    return out_dtype == "int64" and acc_type(compute) == "int" and expr in CHECKED_EXPRS


def checked_expr(expr: str, out, compute: str) -> "str | None":
    """The CHECK_INT32 form of binary_op.glsl's ``expr`` (int_checked.h), or None when
    it needs none: an int64 result's range checks (``checked_int64``), else an integer
    division's, remainder's or fmod's zero-divisor check (``ZERO_CHECKED_EXPRS``)."""
    if checked_int64(expr, out, compute):
        return CHECKED_EXPRS[expr]
    if acc_type(compute) == "int":
        return ZERO_CHECKED_EXPRS.get(expr)
    return None


def binary_defines(expr: str, out, a, b, compute: str) -> dict:
    """binary_op.glsl's defines: out, a, b Tensors or (graph dtype, device dtype)
    pairs, ``expr`` the GLSL expression in a, b, ``compute`` the computation dtype.
    An int64 add / sub / mul / division and any integer division, remainder or fmod
    (``checked_expr``) gets CHECK_INT32 and the checked expression: the op binds
    error_flags and passes its word as iscalars.y."""
    checked_form = checked_expr(expr, out, compute)
    checked = checked_form is not None
    if checked:
        expr = checked_form
    d = storage_defines(OUT=out, A=a, B=b)
    if checked:
        d["CHECK_INT32"] = "1"
    d.update(ACC_T=acc_type(compute), OP_EXPR=expr, **{
        "A_LOAD(v)": load_define(d["A_T"], compute),
        "B_LOAD(v)": load_define(d["B_T"], compute)})
    if acc_type(compute) == "float":
        d["ACC_FLOAT"] = "1"
    return d


@shader_bindings(SHADER)
def _bindings(defines) -> Bindings:
    flags = ("error_flags",) if "CHECK_INT32" in defines else ()
    return Bindings(outputs=("out_data",) + flags, inputs=("a_data", "b_data"),
                    params=(PLAN_PARAMS, SCALAR_PARAMS))


def record_add(bld, out, a, b) -> None:
    """Record aten.add.Tensor's dispatch out = a + b (alpha 1) for float tensors a, b
    of out's shape and dtype; ``a`` may be ``out`` itself (each invocation reads its
    element before writing it)."""
    op = BINARY_OPS["aten.add.Tensor"]
    params = bld.params(SCALAR_PARAMS.pack(fscalars=[1.0], iscalars=[0]))
    plan_dispatch(bld, SHADER, binary_defines(op.expr, out, a, b, out.dtype), out, [a, b],
                  extra_params=(params,))
