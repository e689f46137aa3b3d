"""Vector norms: aten.linalg_vector_norm.default (vector_norm.glsl).

Schema: linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None). Over
any set of dims (None or [] is every dim), keepdim either way, fp32 accumulation:
ord 2 (sqrt of the sum of squares, no rescaling, as ATen's CPU kernel), 1, inf, -inf,
0 (the count of nonzeros) and any other p > 0 ((sum |x|^p)^(1/p), GLSL pow). F.normalize
exports as this, clamp_min, expand_as and div. Refused (stays on the CPU): negative
finite ord (0^p is undefined in GLSL), a dtype argument that changes the dtype, and
ord +-inf over an empty dim (ATen raises). Both row forms of kernels/rows.py.
"""
from __future__ import annotations

import math

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.dims import reduced_dims, reduced_mask, run_defines, run_forms, sum_shape
from vkdelegate.kernels.rows import dispatch_rows, row_bindings, row_forms
from vkdelegate.shaders.variants import declare_grid
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import shader_bindings

SHADER = "vector_norm"
NAME = "aten.linalg_vector_norm.default"
DTYPES = frozenset({"float32", "float16"})
NORM_PARAMS = ParamBlock("reduce_block", [("mask", "ivec4"),     # x: reduced-dims bitmask
                                          ("fparams", "vec4")])  # x: p
shader_bindings(SHADER)(lambda _defines: row_bindings(NORM_PARAMS))
KINDS = {2.0: 1, 1.0: 2, math.inf: 3, -math.inf: 4, 0.0: 5}
POWER = 6  # any other p > 0


def norm_kind(ord_) -> int:
    """The shader's NORM_KIND for ``ord_``; VkDelegateError for a negative finite or
    NaN ord."""
    p = float(ord_)
    if p in KINDS:
        return KINDS[p]
    if not p > 0 or math.isinf(p):
        raise VkDelegateError(f"vector norm of ord {ord_} is not supported (p > 0, 0 "
                              f"or +-inf)")
    return POWER


def _args(values) -> tuple:
    ord_, dims, keepdim = (list(values) + [2, None, False])[:3]
    return 2 if ord_ is None else ord_, dims or [], bool(keepdim)


def _shape(args):
    _, dims, keepdim = _args(args[1:4])
    return sum_shape(args[0].shape, dims, keepdim)


def _rule(node: NodeSpec):
    x = node.args[0]
    ord_, dims, _ = _args(node.args[1:4])
    try:
        kind = norm_kind(ord_)
        red = reduced_dims(dims, x.rank)
    except (VkDelegateError, TypeError, ValueError) as exc:
        return str(exc)
    if node.outputs and node.outputs[0].dtype != x.dtype:
        return "a dtype argument that changes the dtype"
    if kind in (3, 4) and (any(x.shape[d] == 0 for d in red) or
                           (not red and 0 in x.shape)):
        return f"ord {ord_} over an empty dim (ATen raises)"
    return None


def _defines(out, x, kind: int) -> dict:
    d = storage_defines(OUT=out, IN=x)
    d["NORM_KIND"] = str(kind)
    return d


def _impl(b, node):
    x_id, *scalar_ids, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    if out.dtype != x.dtype:
        raise b.error(f"vector norm from {x.dtype} to {out.dtype} is not supported")
    ord_, dims, _ = _args([b.value(i) for i in scalar_ids[:3]])
    try:
        kind = norm_kind(ord_)
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    dims = reduced_dims(dims, x.ndim)
    mask = reduced_mask(dims, x.ndim)
    reduced = math.prod(x.max_shape[d] for d in dims)
    params = [out.meta, x.meta, b.params(NORM_PARAMS.pack(
        mask=[mask], fparams=[float(ord_) if kind == POWER else 0.0]))]
    dispatch_rows(b, SHADER, dict(_defines(out, x, kind), **run_defines(mask)), out, x,
                  params, out.max_numel,
                  reduced, 1, f"a vector norm of {reduced} elements per output",
                  local_size=b.local_size_1d(out.max_numel), rows_now=lambda: out.numel)


register(OpSpec(name=NAME, dtypes=DTYPES, impl=_impl, shape_fn=_shape, rules=(_rule,),
                notes="ord 2, 1, +-inf, 0, p > 0; any set of dims, keepdim; fp32 "
                      "accumulation"))
def _variants(profile, dtype: str, kind: int) -> list[dict]:
    pair = (dtype, device_dtype(dtype, profile))
    return run_forms(row_forms(_defines(pair, pair, kind)))


declare_grid(SHADER, _variants, profile=STORAGE_PROFILES, dtype=DTYPES,
             kind=range(1, POWER + 1))
