"""Reductions over any set of dims, keepdim either way.

sum.dim_IntList (reduce_sum.glsl); mean.dim/mean.default, prod.dim_int/prod.default,
amax/amin, max.default/min.default, var.correction, argmax/argmin and any (reduce.glsl,
``REDUCTIONS``); max.dim/min.dim (values and indices). An empty or absent ``dim``
reduces every dim (ATen's rule). Values accumulate in fp32 (fp16 data) or int32; max/min/amax/amin
and argmax/argmin also take int64 (int32 on the device; their result is one of the
values, so exact). Sums, means, products and variances are
float-only: ATen sums and multiplies integers into int64, which the device would hold
in int32 and could overflow, so those stay on the CPU. A ``dtype`` argument must be
absent or equal the input dtype. argmax/argmin give int64 (int32 on the device, widened
at the staging boundary) and the first index of the extreme value or of the first
NaN; amax/amin propagate NaN; var divides by max(0, N - correction) like ATen (NaN or
inf when that is 0). Reducing an empty dim with max/min/argmax/argmin raises in ATen:
such nodes stay on the CPU.

Both shaders have two forms (kernels/rows.py's ``cooperative`` picks): one invocation per output, or one
workgroup of WG_REDUCE invocations per output with a tree in shared memory (GPUs from
a few hundred elements per output; on llvmpipe only past THREAD_MAX, since its
barriers are dear and its loop budget, ``loop_limit``, caps what one invocation can
walk). Both load 16 elements per loop iteration; a reduction longer than even the
cooperative form can walk on llvmpipe raises VkDelegateError at load.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.dims import (reduced_dims, reduced_mask, run_defines, run_forms,
                                     sum_shape, wrap_dim)
from vkdelegate.kernels.rows import dispatch_rows, row_bindings, row_forms
from vkdelegate.runtime.dtypes import (STORAGE_PROFILES, acc_type, device_dtype,
                                       storage_defines)
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "reduce_sum"
DTYPES = frozenset({"float32", "float16"})
SUM_PARAMS = ParamBlock("reduce_block", [("mask", "ivec4")])  # x: reduced-dims bitmask


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


shader_bindings(SHADER)(lambda _defines: row_bindings(SUM_PARAMS))


def _impl(b, node):
    x_id, dim_id, keepdim_id, _dtype_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    if x.dtype != out.dtype:
        raise b.error(f"sum from {x.dtype} to {out.dtype} is not supported")
    dims = reduced_dims(b.int_list(dim_id), x.ndim)
    mask = reduced_mask(dims, x.ndim)
    params = [out.meta, x.meta, b.params(SUM_PARAMS.pack(mask=[mask]))]
    defines = dict(_defines(out, x, out.dtype), **run_defines(mask))
    reduced = math.prod(x.max_shape[d] for d in dims)
    dispatch_rows(b, SHADER, defines, out, x, params, out.max_numel, reduced, 1,
                  f"a sum of {reduced} elements per output",
                  local_size=b.local_size_1d(out.max_numel), rows_now=lambda: out.numel)


register(OpSpec(name="aten.sum.dim_IntList", dtypes=DTYPES, impl=_impl, shape_fn=_shape,
                rules=(_dtype_arg,), notes="any set of dims, keepdim, fp32 accumulation"))
def _sum_variants(profile, dtype: str) -> list[dict]:
    ddt = (dtype, device_dtype(dtype, profile))
    return run_forms(row_forms(_defines(ddt, ddt, dtype)))


declare_grid(SHADER, _sum_variants, profile=STORAGE_PROFILES, dtype=DTYPES)


# ---- reduce.glsl: every other reduction ------------------------------------------------
GENERIC_SHADER = "reduce"
REDUCE_PARAMS = ParamBlock("reduce_block", [
    ("mask", "ivec4"),      # x: reduced-dims bitmask
    ("fparams", "vec4")])   # x: var/std correction
shader_bindings(GENERIC_SHADER)(lambda _defines: row_bindings(REDUCE_PARAMS))
FLOATS = frozenset({"float32", "float16"})
ORDERED = FLOATS | {"int32"}
#: max/min/amax/amin and argmax/argmin inputs: int64 too. The device holds int64 as
#: int32 (runtime/dtypes: values range-checked where they enter, int64 arithmetic
#: checked on the device), and a max or min of int32 values is one of them: exact.
#: (Sums, means and products of int64 would overflow int32: CPU.)
EXTREMA = ORDERED | {"int64"}
TRUTHY = ORDERED | {"bool"}
KINDS = {"mean": 1, "prod": 2, "max": 3, "min": 4, "var": 5, "argmax": 6, "argmin": 7,
         "any": 8}


@dataclass(frozen=True)
class Reduction:
    """kind: a KINDS key. args: how the scalar arguments (after self, before the
    output) read: "dims_keepdim" (dim list, keepdim), "all" (no dims: every dim),
    "dim_keepdim" (one int dim, keepdim), "optdim_keepdim" (int dim or None for every
    dim, keepdim), "var" (dim list, correction, keepdim). dtypes: input dtypes;
    out: the output dtype, "same" as the input, "int64" (indices) or "bool"."""

    kind: str
    args: str
    dtypes: frozenset
    out: str = "same"
    notes: str = ""

    def out_dtype(self, x_dtype: str) -> str:
        return x_dtype if self.out == "same" else self.out


_ANY = "bool output, any input dtype (NaN is true); all() exports as not(any(not x))"
REDUCTIONS = {
    "aten.mean.dim": Reduction("mean", "dims_keepdim", FLOATS),
    "aten.mean.default": Reduction("mean", "all", FLOATS),
    "aten.prod.dim_int": Reduction("prod", "dim_keepdim", FLOATS),
    "aten.prod.default": Reduction("prod", "all", FLOATS),
    "aten.amax.default": Reduction("max", "dims_keepdim", EXTREMA, notes="propagates NaN"),
    "aten.amin.default": Reduction("min", "dims_keepdim", EXTREMA, notes="propagates NaN"),
    "aten.max.default": Reduction("max", "all", EXTREMA, notes="propagates NaN"),
    "aten.min.default": Reduction("min", "all", EXTREMA, notes="propagates NaN"),
    "aten.var.correction": Reduction("var", "var", FLOATS,
                                     notes="corrected two-pass (mean; deviations and their squares), any correction; std = var + sqrt"),
    "aten.argmax.default": Reduction("argmax", "optdim_keepdim", EXTREMA, out="int64",
                                     notes="int64 output, first occurrence, NaN wins"),
    "aten.argmin.default": Reduction("argmin", "optdim_keepdim", EXTREMA, out="int64",
                                     notes="int64 output, first occurrence, NaN wins"),
    "aten.any.dim": Reduction("any", "dim_keepdim", TRUTHY, out="bool", notes=_ANY),
    "aten.any.dims": Reduction("any", "dims_keepdim", TRUTHY, out="bool", notes=_ANY),
    "aten.any.default": Reduction("any", "all", TRUTHY, out="bool", notes=_ANY),
}


def parse_args(how: str, values: list, ndim: int) -> tuple:
    """(sorted reduced dims, keepdim, correction) from an op's scalar arguments."""
    correction = 1.0
    if how == "all":
        dims, keepdim = [], False
    elif how == "dims_keepdim":
        dims, keepdim = values[0] or [], values[1]
    elif how == "dim_keepdim":
        dims, keepdim = [values[0]], values[1]
    elif how == "optdim_keepdim":
        dims, keepdim = ([] if values[0] is None else [values[0]]), values[1]
    else:  # var: dim, correction, keepdim
        dims, keepdim = values[0] or [], values[2]
        correction = 1.0 if values[1] is None else float(values[1])
    return reduced_dims(dims, ndim), bool(keepdim), correction


def _make_shape(r: Reduction):
    def shape(args):
        x = args[0]
        dims, keepdim, _ = parse_args(r.args, list(args[1:]), len(x.shape))
        return sum_shape(x.shape, dims, keepdim)
    return shape


def _make_rules(r: Reduction) -> tuple:
    def dtypes(node: NodeSpec):
        expected = r.out_dtype(node.args[0].dtype)
        if node.outputs and node.outputs[0].dtype != expected:
            return f"output dtype {node.outputs[0].dtype}, expected {expected} " \
                   f"(a dtype argument that changes the dtype)"
        return None

    def empty(node: NodeSpec):
        x = node.args[0]
        try:
            dims, _, _ = parse_args(r.args, list(node.args[1:]), x.rank)
        except VkDelegateError as exc:
            return str(exc)
        if any(x.shape[d] == 0 for d in dims) or (not dims and 0 in x.shape):
            return f"{r.kind} over an empty dim (ATen raises)"
        return None

    return (dtypes, empty) if r.kind in ("max", "min", "argmax", "argmin") else (dtypes,)


def _storage(t):
    """(graph dtype, device dtype) for storage_defines; int64 tensors are int32 on the
    device (converted at the staging boundary)."""
    dtype, dev = (t.dtype, t.device_dtype) if hasattr(t, "device_dtype") else t
    return ("int32", dev) if dtype == "int64" else (dtype, dev)


def _generic_defines(kind: str, out, x, x_dtype: str) -> dict:
    d = storage_defines(OUT=_storage(out), IN=_storage(x))
    d.update(ACC_T=acc_type(x_dtype), REDUCE_KIND=str(KINDS[kind]))
    if acc_type(x_dtype) == "float":
        d["ACC_FLOAT"] = "1"
    return d


def dispatch_generic(b, kind: str, out, x, reduced: int, params, mask: int) -> None:
    """One reduce.glsl dispatch of `kind` from x to out, `reduced` elements per output
    (upper bound) over the dims of ``mask`` (kernels/dims.reduced_mask, also in
    ``params``): the per-invocation or the cooperative form by the same rule as sum
    (``cooperative``). Raises VkDelegateError (b.error) on llvmpipe for reductions
    longer than its shader loop limit allows even in the cooperative form."""
    defines = dict(_generic_defines(kind, out, x, x.dtype), **run_defines(mask))
    # var: the mean, the deviations from it, their squares (a corrected two-pass)
    passes = 3 if kind == "var" else 1
    dispatch_rows(b, GENERIC_SHADER, defines, out, x, params, out.max_numel, reduced,
                  passes, f"{kind} of {reduced} elements per output",
                  rows_now=lambda: out.numel)


def _make_impl(r: Reduction):
    def impl(b, node):
        x_id, *scalar_ids, out_id = node.args
        x, out = b.tensor(x_id), b.tensor(out_id)
        expected = r.out_dtype(x.dtype)
        # int32 indices: an ExecuTorch blob's int64 (see load_checks._widen).
        if out.dtype != expected and (expected, out.dtype) != ("int64", "int32"):
            raise b.error(f"output dtype {out.dtype}, expected {expected}")
        dims, _, correction = parse_args(r.args, [b.value(i) for i in scalar_ids], x.ndim)
        mask = reduced_mask(dims, x.ndim)
        dispatch_generic(b, r.kind, out, x, math.prod(x.max_shape[d] for d in dims),
                         [out.meta, x.meta, b.params(REDUCE_PARAMS.pack(
                             mask=[mask], fparams=[correction]))], mask)
    return impl


def _generic_variants(profile, dtype: str, kind: str, out_dtype: str) -> list[dict]:
    """The variants ``dispatch_generic`` may ask for: reduction ``kind`` of a ``dtype``
    input into an ``out_dtype`` output, on storage ``profile``."""
    return run_forms(row_forms(_generic_defines(
        kind, (out_dtype, device_dtype(out_dtype, profile)),
        (dtype, device_dtype(dtype, profile)), dtype)))


def _reduction_variants(r: Reduction, profile, dtype: str) -> list[dict]:
    return _generic_variants(profile, dtype, r.kind, r.out_dtype(dtype))


for _name, _r in REDUCTIONS.items():
    if _r.out != "same":
        _spec = OpSpec(name=_name, dtypes=frozenset({_r.out}), impl=_make_impl(_r),
                       shape_fn=_make_shape(_r), rules=_make_rules(_r),
                       arg_dtypes={0: _r.dtypes}, notes=_r.notes)
    else:
        _spec = OpSpec(name=_name, dtypes=_r.dtypes, impl=_make_impl(_r),
                       shape_fn=_make_shape(_r), rules=_make_rules(_r),
                       notes=_r.notes or "any set of dims, keepdim, fp32 accumulation")
    register(_spec)
    declare_grid(GENERIC_SHADER, functools.partial(_reduction_variants, _r),
                 profile=STORAGE_PROFILES, dtype=_r.dtypes)


# ---- max.dim / min.dim: (values, indices) as a ValueList output ------------------------
def _dim_pair_shape(args):
    x, dim, keepdim = args[0], args[1], args[2]
    shape = sum_shape(x.shape, reduced_dims([dim], len(x.shape)), bool(keepdim))
    return [shape, shape]


def _dim_pair_rule(node: NodeSpec):
    x, outs = node.args[0], node.outputs
    if len(outs) != 2 or outs[0].dtype != x.dtype or outs[1].dtype != "int64":
        return f"outputs {[o.dtype for o in outs]}, expected [{x.dtype}, int64]"
    try:
        dims = reduced_dims([node.args[1]], x.rank)
    except VkDelegateError as exc:
        return str(exc)
    if any(x.shape[d] == 0 for d in dims):
        return "max/min over an empty dim (ATen raises)"
    return None


def _make_dim_pair_impl(kind: str):
    def impl(b, node):
        x_id, dim_id, _keepdim_id, out_id = node.args
        x, outs = b.tensor(x_id), b.value(out_id)
        if not isinstance(outs, list) or len(outs) != 2:
            raise b.error("expected a (values, indices) output list")
        dims = reduced_dims([b.scalar(dim_id)], x.ndim)
        mask = reduced_mask(dims, x.ndim)
        params = b.params(REDUCE_PARAMS.pack(mask=[mask], fparams=[0.0]))
        # Two passes over the same input (the values, then the indices) keep one shader
        # per output; both pick the first NaN, so values and indices agree.
        reduced = math.prod(x.max_shape[d] for d in dims)
        for out, k in zip(outs, (kind, "arg" + kind)):
            dispatch_generic(b, k, out, x, reduced, [out.meta, x.meta, params], mask)
    return impl


for _name, _kind in (("aten.max.dim", "max"), ("aten.min.dim", "min")):
    register(OpSpec(name=_name, dtypes=ORDERED | {"int64"}, impl=_make_dim_pair_impl(_kind),
                    shape_fn=_dim_pair_shape, rules=(_dim_pair_rule,),
                    arg_dtypes={0: ORDERED},
                    notes="(values, int64 indices); first occurrence, NaN wins"))


def _dim_pair_variants(profile, dtype: str, kind: str) -> list[dict]:
    """The values pass (``kind``) and the indices pass (``arg`` + kind)."""
    return (_generic_variants(profile, dtype, kind, dtype)
            + _generic_variants(profile, dtype, "arg" + kind, "int64"))


declare_grid(GENERIC_SHADER, _dim_pair_variants, profile=STORAGE_PROFILES, dtype=ORDERED,
             kind=("max", "min"))
