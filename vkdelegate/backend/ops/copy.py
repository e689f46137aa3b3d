"""The affine copy every data-movement op is built on, plus clone and _to_copy.

Our tensors are contiguous buffers, so ATen's views (view, permute, expand, slice, ...)
become copies. One shader (affine_copy.glsl) serves all of them: it walks a *domain*
(a list of sizes) and, per domain coordinate ``c_d``, writes
``out[out_offset + sum(c_d * out_stride_d)]`` from
``in[in_offset + sum(s_d * in_stride_d)]`` where the source coordinate ``s_d`` is
``start_d + c_d * step_d`` (AFFINE), ``c_d % bound_d`` (MODULO, for repeat) or the
affine value with a fill outside ``[0, bound_d)`` (PAD, for constant_pad_nd).

An op builds a ``CopyPlan`` from the *current* sizes of its tensors; ``affine_copy``
records the dispatch and re-plans on every resize (the plan lives in an op-owned
uniform buffer rewritten by a resize hook, so nothing is re-recorded). The grid covers
the plan at load time, when every tensor has its upper-bound sizes.

Values convert from the input dtype to the output dtype as torch converts them: float to
integer truncates toward zero, int8/uint8 wrap, anything to bool is ``x != 0``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from vkdelegate.backend.registry import NodeSpec, OpSpec, register
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare

SHADER = "affine_copy"
AFFINE, MODULO, PAD = 0, 1, 2
MAX_DOMAIN = 8
#: Dtypes every movement op accepts (int64/float64 are held as int32/float32 on the
#: device, see runtime/dtypes.py).
MOVE_DTYPES = frozenset({"float32", "float16", "int32", "int64", "int8", "uint8", "bool"})
#: _to_copy converts between any two of these.
CONVERT_DTYPES = MOVE_DTYPES | {"float64"}


@dataclass
class CopyDim:
    """One domain dim: size, output stride and how it maps to the input."""

    size: int
    out_stride: int
    in_stride: int
    start: int = 0
    step: int = 1
    mode: int = AFFINE
    bound: int = 1


@dataclass
class CopyPlan:
    """A whole copy (dims outermost first, as torch orders them)."""

    dims: list = field(default_factory=list)
    out_offset: int = 0
    in_offset: int = 0

    @property
    def numel(self) -> int:
        return math.prod(d.size for d in self.dims)


def contiguous_strides(shape) -> list[int]:
    """Row-major element strides of ``shape``."""
    strides, acc = [], 1
    for s in reversed(tuple(shape)):
        strides.append(acc)
        acc *= s
    return strides[::-1]


def flat_plan(numel: int) -> CopyPlan:
    """Element i of the output is element i of the input (view, clone, _to_copy)."""
    return CopyPlan([CopyDim(numel, 1, 1)])


def runs(flags) -> list[list[int]]:
    """Groups of consecutive dims for ``merged``: each run of True flags is one group,
    each False dim a group of its own. ``runs([1, 1, 0, 1])`` -> [[0, 1], [2], [3]]."""
    groups: list[list[int]] = []
    for d, flag in enumerate(flags):
        if flag and groups and flags[groups[-1][-1]]:
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def around(ndim: int, dim: int) -> list[list[int]]:
    """Groups [dims before ``dim``], [dim], [dims after] (empty ones dropped): the
    mergeable structure of a copy that treats one dim specially (cat, split, slice)."""
    return [g for g in (list(range(dim)), [dim], list(range(dim + 1, ndim))) if g]


def merged(plan: CopyPlan, groups) -> CopyPlan:
    """``plan`` with each group of consecutive dims merged into one: fewer dims, fewer
    integer divisions per element. Ops choose groups from their structure (dims that
    no slice, pad or permutation separates), so the rank stays the same after a resize;
    a group that is not contiguous in both output and input is a bug and raises."""
    dims = []
    for g in groups:
        members = [plan.dims[d] for d in g]
        for outer, inner in zip(members, members[1:]):
            if (outer.mode, inner.mode, outer.start, inner.start, outer.step, inner.step) \
                    != (AFFINE, AFFINE, 0, 0, 1, 1) or \
                    outer.out_stride != inner.out_stride * inner.size or \
                    outer.in_stride != inner.in_stride * inner.size:
                raise VkDelegateError(f"copy dims {g} cannot be merged: {members}")
        last = members[-1]
        dims.append(dataclasses.replace(last, size=math.prod(m.size for m in members)))
    return CopyPlan(dims, plan.out_offset, plan.in_offset)


_PLAN_ROWS = (("size", 1), ("out_stride", 0), ("step", 0), ("start", 0),
              ("in_stride", 0), ("bound", 1), ("mode", AFFINE))
#: Per domain dim (innermost first) its CopyDim fields (``domain`` holds the sizes);
#: info x: domain numel, y: out offset, z: in offset, w: int fill; ffill x: float fill.
PLAN_PARAMS = ParamBlock("plan_block", [
    ("domain" if attr == "size" else attr, f"ivec4[{MAX_DOMAIN // 4}]")
    for attr, _ in _PLAN_ROWS] + [("info", "ivec4"), ("ffill", "vec4")])


def plan_record(plan: CopyPlan, fill=0) -> bytes:
    """The std140 bytes of ``plan_block`` in affine_copy.glsl."""
    dims = list(reversed(plan.dims))  # the shader counts from the innermost dim
    if len(dims) > MAX_DOMAIN:
        raise VkDelegateError(f"copy of rank {len(dims)} > {MAX_DOMAIN}")
    pad = MAX_DOMAIN - len(dims)
    rows = {("domain" if attr == "size" else attr):
            [getattr(d, attr) for d in dims] + [default] * pad
            for attr, default in _PLAN_ROWS}
    int_fill = int(fill) if not isinstance(fill, float) or math.isfinite(fill) else 0
    return PLAN_PARAMS.pack(**rows, info=[plan.numel, plan.out_offset, plan.in_offset,
                                          int_fill], ffill=[float(fill)])


def out_kind(dtype: str) -> str:
    """The shader's OUT_* define for an output of graph dtype ``dtype``."""
    if acc_type(dtype) == "float":
        return "OUT_FLOAT"
    return "OUT_BOOL" if dtype == "bool" else "OUT_INT"


def copy_defines(out_ddt: str, in_ddt: str, out_dtype: str, in_dtype: str) -> dict:
    """Variant defines for (device dtype, graph dtype) of output and input."""
    d = storage_defines(OUT=(out_dtype, out_ddt), IN=(in_dtype, in_ddt))
    d.update(IN_ACC=acc_type(in_dtype))
    d[out_kind(out_dtype)] = "1"
    return d


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("in_data",), params=(PLAN_PARAMS,))


def affine_copy(b, out, x, plan_fn: Callable[[], CopyPlan], fill=0) -> None:
    """Record one affine-copy dispatch from ``x`` into ``out``.

    plan_fn() -> CopyPlan from the tensors' current sizes; called now and after every
    resize. fill: value written where a PAD dim falls outside the input.
    """
    plan = plan_fn()
    params = b.params(plan_record(plan, fill))
    b.on_resize(lambda: params.write(plan_record(plan_fn(), fill)))
    defines = copy_defines(out.device_dtype, x.device_dtype, out.dtype, x.dtype)
    # The plan's rank is the specialization constant NDIM (id 3): resizes keep it.
    b.dispatch(SHADER, defines, outputs=[out], inputs=[x], params=[params],
               global_size=(plan.numel,), local_size=(64, 1, 1),
               spec_constants=(len(plan.dims),))


def declare_copy(dtype_pairs) -> None:
    """Declare the affine_copy variants for (out dtype, in dtype) graph-dtype pairs."""
    for profile in STORAGE_PROFILES:
        for out_dt, in_dt in dtype_pairs:
            declare(SHADER, copy_defines(device_dtype(out_dt, profile),
                                         device_dtype(in_dt, profile), out_dt, in_dt))


def same_dtype(node: NodeSpec):
    """Rule: input and output dtypes agree (movement ops never convert)."""
    dtypes = {t.dtype for t in node.tensors()}
    if len(dtypes) > 1:
        return f"mixed dtypes {sorted(dtypes)}"
    return None


def scalar_reason(value, dtype: str):
    """Why the Python scalar ``value`` cannot become an element of a ``dtype`` tensor on
    the device (None if it can): integer tensors take no inf/NaN, and int64 tensors
    are held in int32, so their values must fit it."""
    if not isinstance(value, (int, float)) or dtype in ("bool", "float32", "float16",
                                                        "float64"):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"value {value} for an {dtype} tensor"
    if dtype == "int64" and not -2**31 <= int(value) < 2**31:
        return f"value {value} does not fit int32, the device representation of int64"
    return None


def same_shape(args):
    return tuple(args[0].shape)


def flat_impl(b, node):
    """Impl of ops whose output is the input's elements in order (view, clone...)."""
    x, out = b.tensor(node.args[0]), b.tensor(node.args[-1])
    affine_copy(b, out, x, lambda: flat_plan(out.numel))


def _memory_format_rule(index: int):
    def rule(node: NodeSpec):
        fmt = node.args[index] if len(node.args) > index else None
        if fmt not in (None, "torch.contiguous_format", "torch.preserve_format"):
            return f"memory_format {fmt} (only contiguous layouts are stored)"
        return None
    return rule


def _to_copy_rule(node: NodeSpec):
    # _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
    layout = node.args[2] if len(node.args) > 2 else None
    if layout not in (None, "torch.strided"):
        return f"layout {layout}"
    return None


register(OpSpec(name="aten.clone.default", dtypes=MOVE_DTYPES, impl=flat_impl,
                shape_fn=same_shape, rules=(same_dtype, _memory_format_rule(1)),
                notes="copy"))
register(OpSpec(name="aten._to_copy.default", dtypes=CONVERT_DTYPES, impl=flat_impl,
                shape_fn=same_shape, rules=(_to_copy_rule, _memory_format_rule(6)),
                notes="dtype conversion as torch converts (float->int truncates)"))
# ExecuTorch's dim-order-aware _to_copy: our tensors are always contiguous, so a
# dim_order only changes strides, never values; the dtype conversion is _to_copy's.
register(OpSpec(name="dim_order_ops._to_dim_order_copy.default", dtypes=CONVERT_DTYPES,
                impl=flat_impl, shape_fn=same_shape,
                notes="ExecuTorch name of _to_copy (dim_order: values unchanged)"))
# ET-VK copies each constant into the tensor its consumer reads with et_vk.prepack
# (args: constant, out); on our buffers that is a plain copy.
register(OpSpec(name="et_vk.prepack.default", dtypes=MOVE_DTYPES, impl=flat_impl,
                shape_fn=same_shape, rules=(same_dtype,),
                notes="ExecuTorch's constant prepacking (a copy here)"))
declare_copy([(dt, dt) for dt in MOVE_DTYPES])
declare_copy([(o, i) for o in CONVERT_DTYPES for i in CONVERT_DTYPES])
