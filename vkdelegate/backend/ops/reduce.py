"""Reductions: aten.sum.dim_IntList over any set of dims, keepdim either way.

Schema: sum.dim_IntList(self, dim: int[1]?, keepdim=False, *, dtype=None). An empty
or absent ``dim`` reduces every dim (ATen's rule). Float dtypes only: ATen sums
integers into int64, which the device would hold in int32 and could overflow, so
integer sums stay on the CPU. ``dtype`` must be absent or equal the input dtype.
"""
from __future__ import annotations

from vkdelegate.backend.registry import NodeSpec, OpSpec, register
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.dtypes import (STORAGE_PROFILES, acc_type, device_dtype,
                                       storage_defines)
from vkdelegate.runtime.params import ivec4, record
from vkdelegate.shaders.variants import declare

SHADER = "reduce_sum"
DTYPES = frozenset({"float32", "float16"})


def reduced_dims(dims, ndim: int) -> list[int]:
    """Normalized, sorted dims to reduce (all dims for None/empty)."""
    if not dims:
        return list(range(ndim))
    out = set()
    for d in dims:
        if not -max(ndim, 1) <= d < max(ndim, 1):
            raise VkDelegateError(f"sum: dim {d} out of range for rank {ndim}")
        out.add(d % max(ndim, 1))
    if ndim == 0:
        return []
    return sorted(out)


def sum_shape(shape, dims, keepdim: bool) -> tuple:
    red = set(reduced_dims(dims, len(shape)))
    if keepdim:
        return tuple(1 if d in red else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in red)


def _shape(args):
    return sum_shape(args[0].shape, args[1] or [], bool(args[2]))


def _dtype_arg(node: NodeSpec):
    dtype = node.args[3] if len(node.args) > 3 else None
    if dtype is not None and node.outputs and node.outputs[0].dtype != node.args[0].dtype:
        return "sum with a dtype argument that changes the dtype"
    return None


def _defines(out, x, dtype: str) -> dict:
    d = storage_defines(OUT=out, IN=x)
    d["ACC_T"] = acc_type(dtype)
    return d


def _impl(b, node):
    x_id, dim_id, keepdim_id, _dtype_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    if x.dtype != out.dtype:
        raise b.error(f"sum from {x.dtype} to {out.dtype} is not supported")
    dims = reduced_dims(b.int_list(dim_id), x.ndim)
    mask = 0
    for d in dims:
        mask |= 1 << (x.ndim - 1 - d)  # metadata dims count from the innermost
    b.dispatch(SHADER, _defines(out, x, out.dtype), outputs=[out], inputs=[x],
               params=[out.meta, x.meta, b.params(record(ivec4(mask)))],
               global_size=(out.max_numel,),
               local_size=b.local_size_1d(out.max_numel))


register(OpSpec(name="aten.sum.dim_IntList", dtypes=DTYPES, impl=_impl, shape_fn=_shape,
                rules=(_dtype_arg,), notes="any set of dims, keepdim, fp32 accumulation"))
for _profile in STORAGE_PROFILES:
    for _dt in DTYPES:
        _ddt = (_dt, device_dtype(_dt, _profile))
        declare(SHADER, _defines(_ddt, _ddt, _dt))
