"""Cumulative sum along any dim: aten.cumsum.default.

Schema: cumsum(self, dim: int, *, dtype: ScalarType? = None). ATen's result dtype is
the input's for float inputs and int64 for integer and bool inputs (position ids:
``cumsum(mask, 1)``), or ``dtype`` when given. One invocation per line along ``dim``
(cumsum.glsl) walks it in order, 16 elements per loop iteration; sums accumulate in
fp32 for float results (fp16 data included, as ATen's CPU kernel does: each stored
partial sum is the fp32 sum rounded once) and in int32 for integer results (int64
results are held in int32 on the device, runtime/dtypes.py: exact while partial sums
stay in the int32 range; an int64 partial sum past it raises after the run, naming the
node: CHECK_INT32, int_checked.h). A float input with an integer ``dtype`` stays on the
CPU.
"""
from __future__ import annotations

import dataclasses
import math

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import loop_limit
from vkdelegate.kernels.dims import wrap_dim
from vkdelegate.kernels.elementwise import load_define
from vkdelegate.kernels.rows import row_bindings
from vkdelegate.kernels.rules import same_shape
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import INT64_OVERFLOW, STORAGE_PROFILES, acc_type, \
    device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "cumsum"
IN_DTYPES = frozenset({"float32", "float16", "int32", "int64", "int8", "uint8", "bool"})
OUT_DTYPES = frozenset({"float32", "float16", "int32", "int64"})
# x: dim, innermost 0; y: CHECK_INT32's error-flag word
CUMSUM_PARAMS = ParamBlock("cumsum_block", [("dim", "ivec4")])


@shader_bindings(SHADER)
def _bindings(defines):
    rows = row_bindings(CUMSUM_PARAMS)
    if "CHECK_INT32" not in defines:
        return rows
    return dataclasses.replace(rows, outputs=rows.outputs + ("error_flags",))


def _out_reason(in_dtype: str, out_dtype: str) -> "str | None":
    if out_dtype not in OUT_DTYPES:
        return f"output dtype {out_dtype} (supported: {', '.join(sorted(OUT_DTYPES))})"
    if acc_type(in_dtype) == "float" and acc_type(out_dtype) != "float":
        return f"an integer result ({out_dtype}) of a float input ({in_dtype})"
    return None


def _rule(node: NodeSpec):
    x, dim = node.args[:2]
    try:
        wrap_dim(dim, x.rank, "cumsum dim")
    except VkDelegateError as exc:
        return str(exc)
    return _out_reason(x.dtype, node.outputs[0].dtype)


def _defines(out, x) -> dict:
    """out, x: (graph dtype, device dtype) pairs or Tensors."""
    d = storage_defines(OUT=out, IN=x)
    out_dtype = out[0] if isinstance(out, tuple) else out.dtype
    d.update(ACC_T=acc_type(out_dtype), **{"IN_LOAD(v)": load_define(d["IN_T"], out_dtype)})
    if out_dtype == "int64":
        d["CHECK_INT32"] = "1"  # int64 sums past the int32 range are flagged
    return d


def _impl(b, node):
    x_id, dim_id, _dtype_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    reason = _out_reason(x.dtype, out.dtype)
    if reason:
        raise b.error(reason)
    dim = wrap_dim(b.scalar(dim_id), x.ndim, "cumsum dim")
    meta_dim = x.ndim - 1 - dim if x.ndim else 0  # metadata counts from the innermost
    n = x.max_shape[dim] if x.ndim else 1
    rows = math.prod(s for d, s in enumerate(x.max_shape) if d != dim)
    loop_limit.check(b, -(-n // loop_limit.UNROLL), f"a cumsum of {n} elements")
    flags = [b.error_flag(INT64_OVERFLOW)] if out.dtype == "int64" else []
    params = [out.meta, x.meta, b.params(CUMSUM_PARAMS.pack(
        dim=[meta_dim, flags[0].slot if flags else 0]))]
    b.dispatch(SHADER, _defines(out, x), outputs=[out, *flags], inputs=[x], params=params,
               global_size=(rows,), local_size=(64, 1, 1))


register(OpSpec(name="aten.cumsum.default", dtypes=IN_DTYPES | OUT_DTYPES, impl=_impl,
                shape_fn=same_shape, rules=(_rule,), arg_dtypes={0: IN_DTYPES},
                notes="any dim; fp32 sums for float, int64 result of integer/bool input"))
def _variant(profile, x: str, out: str) -> "dict | None":
    if _out_reason(x, out) is not None:
        return None
    return _defines((out, device_dtype(out, profile)), (x, device_dtype(x, profile)))


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, x=IN_DTYPES, out=OUT_DTYPES)
