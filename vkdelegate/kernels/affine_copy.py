"""The affine copy every data-movement op is built on (view, permute, expand, slice,
cat, pad, repeat, clone, _to_copy, ...).

Our tensors are contiguous buffers, so ATen's views become copies. One shader
(affine_copy.glsl) serves all of them: it walks a *domain* (a list of sizes) and, per domain coordinate ``c_d``, writes
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

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.dtypes import INT64_OVERFLOW, STORAGE_PROFILES, acc_type, device_dtype, \
    storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "affine_copy"
AFFINE, MODULO, PAD = 0, 1, 2
MAX_DOMAIN = 8
#: Dtypes every movement op accepts (int64/float64 are held as int32/float32 on the
#: device, see runtime/dtypes.py).
MOVE_DTYPES = frozenset({"float32", "float16", "int32", "int64", "int8", "uint8", "bool"})


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
#: info x: invocations (``invocations``), y: out offset, z: in offset, w: int fill;
#: ffill x: float fill; chunks x: chunks per row of the innermost dim (CHUNK > 1).
PLAN_PARAMS = ParamBlock("plan_block", [
    ("domain" if attr == "size" else attr, f"ivec4[{MAX_DOMAIN // 4}]")
    for attr, _ in _PLAN_ROWS] + [("info", "ivec4"), ("ffill", "vec4"), ("chunks", "ivec4")])


#: affine_copy.glsl's largest CHUNK on CPU drivers: innermost-dim elements per
#: invocation (llvmpipe, MiniLM's head permute + clone of 1.5 M floats, process CPU:
#: 38.5 ms at 1, 17-24 at 4, 16-19 at 8).
CPU_CHUNK = 8


def chunk_for(plan: CopyPlan, cpu: bool) -> int:
    """affine_copy.glsl's CHUNK for ``plan`` (a specialization constant, fixed per
    node): CPU_CHUNK on CPU drivers, where the index walk costs more than the element
    it finds (llvmpipe: parameter loads, a division per dim, all lane by lane in
    SIMD8) and one walk then serves CPU_CHUNK consecutive elements; 1 on GPUs (which
    keep one element per invocation, coalesced) and for a MODULO innermost dim.
    A shorter innermost dim (at the load-time sizes) takes the power of two that
    covers it: the shader runs every element slot of a chunk, used or not."""
    if not cpu or not plan.dims or plan.dims[-1].mode == MODULO:
        return 1
    inner = plan.dims[-1].size
    return min(CPU_CHUNK, 1 << max(inner - 1, 0).bit_length())


def invocations(plan: CopyPlan, chunk: int) -> tuple[int, int]:
    """(invocations, chunks per row) of ``plan`` at ``chunk`` elements per invocation:
    each row of the innermost dim takes ceil(size / chunk) invocations."""
    if chunk == 1 or not plan.dims:
        return plan.numel, 0
    inner = plan.dims[-1].size
    per_row = -(-inner // chunk)
    return (plan.numel // inner) * per_row if inner else 0, per_row


def plan_record(plan: CopyPlan, fill=0, chunk: int = 1, flag_slot: int = 0) -> bytes:
    """The std140 bytes of ``plan_block`` in affine_copy.glsl for a shader of CHUNK
    ``chunk``; ``flag_slot``: CHECK_INT32's error-flag word."""
    dims = list(reversed(plan.dims))  # the shader counts from the innermost dim
    if len(dims) > MAX_DOMAIN:
        raise VkDelegateError(f"copy of rank {len(dims)} > {MAX_DOMAIN}")
    pad = MAX_DOMAIN - len(dims)
    rows = {("domain" if attr == "size" else attr):
            [getattr(d, attr) for d in dims] + [default] * pad
            for attr, default in _PLAN_ROWS}
    int_fill = int(fill) if not isinstance(fill, float) or math.isfinite(fill) else 0
    count, per_row = invocations(plan, chunk)
    return PLAN_PARAMS.pack(**rows, info=[count, plan.out_offset, plan.in_offset,
                                          int_fill], ffill=[float(fill)],
                            chunks=[per_row, flag_slot])


def plan_shape(plan: CopyPlan) -> tuple[int, int, int]:
    """The plan's specialization constants: (rank, MODULO dims, PAD dims), a dim's bit
    counting from the innermost (affine_copy.glsl NDIM, MODULO_DIMS, PAD_DIMS)."""
    dims = list(reversed(plan.dims))
    return (len(dims), sum(1 << d for d, c in enumerate(dims) if c.mode == MODULO),
            sum(1 << d for d, c in enumerate(dims) if c.mode == PAD))


def out_kind(dtype: str) -> str:
    """The shader's OUT_* define for an output of graph dtype ``dtype``."""
    if acc_type(dtype) == "float":
        return "OUT_FLOAT"
    return "OUT_BOOL" if dtype == "bool" else "OUT_INT"


def checked_cast(out_dtype: str, in_dtype: str) -> bool:
    """Whether a copy from ``in_dtype`` to ``out_dtype`` checks its values (CHECK_INT32):
    float to int64, whose result the device holds in int32 (ATen's holds 64 bits)."""
    return out_dtype == "int64" and acc_type(in_dtype) == "float"


def copy_defines(out_ddt: str, in_ddt: str, out_dtype: str, in_dtype: str) -> dict:
    """Variant defines for (device dtype, graph dtype) of output and input."""
    d = storage_defines(OUT=(out_dtype, out_ddt), IN=(in_dtype, in_ddt))
    d.update(IN_ACC=acc_type(in_dtype))
    d[out_kind(out_dtype)] = "1"
    if checked_cast(out_dtype, in_dtype):
        d["CHECK_INT32"] = "1"
    return d


@shader_bindings(SHADER)
def _bindings(defines) -> Bindings:
    flags = ("error_flags",) if "CHECK_INT32" in defines else ()
    return Bindings(outputs=("out_data",) + flags, inputs=("in_data",),
                    params=(PLAN_PARAMS,))


def affine_copy(b, out, x, plan_fn: Callable[[], CopyPlan], fill=0) -> None:
    """Record one affine-copy dispatch from ``x`` into ``out``.

    plan_fn() -> CopyPlan from the tensors' current sizes; called now and after every
    resize. fill: value written where a PAD dim falls outside the input.
    """
    plan = plan_fn()
    chunk = chunk_for(plan, b.device.info.type == "cpu")
    flags = [b.error_flag(INT64_OVERFLOW)] if checked_cast(out.dtype, x.dtype) else []
    slot = flags[0].slot if flags else 0
    params = b.params(plan_record(plan, fill, chunk, slot))
    shape = plan_shape(plan)

    def replan() -> None:
        again = plan_fn()
        if plan_shape(again) != shape:
            raise VkDelegateError(f"a resize changed the copy's rank or modes: "
                                  f"{shape} -> {plan_shape(again)}")
        params.write(plan_record(again, fill, chunk, slot))
    b.on_resize(replan)
    defines = copy_defines(out.device_dtype, x.device_dtype, out.dtype, x.dtype)
    # The plan's rank and modes are the specialization constants NDIM, MODULO_DIMS
    # and PAD_DIMS (ids 3..5), resizes keep them; CHUNK is id 6. A resize only
    # shrinks sizes, so the load-time grid covers every later plan's invocations.
    b.dispatch(SHADER, defines, outputs=[out, *flags], inputs=[x], params=[params],
               global_size=(invocations(plan, chunk)[0],), local_size=(64, 1, 1),
               spec_constants=shape + (chunk,),
               grid=lambda: (invocations(plan_fn(), chunk)[0],))


def copy_last_part(b, out, x, start: int) -> None:
    """Record out = x[..., start:start + out.shape[-1]] (a merged linear's part of
    several rows: narrow_last's copy, and the halves of gemm.swiglu's GEMM-core form),
    one affine copy whose plan follows the current sizes."""
    dim = len(x.max_shape) - 1

    def plan() -> CopyPlan:
        in_strides = contiguous_strides(x.shape)
        out_strides = contiguous_strides(out.shape)
        dims = [CopyDim(s, out_strides[i], in_strides[i]) for i, s in enumerate(out.shape)]
        dims[dim].start = start
        return merged(CopyPlan(dims), around(dim + 1, dim))
    affine_copy(b, out, x, plan)


def copy_destination(b, out, x) -> None:
    """out <- x, element for element (the values a functional update's region does
    not overwrite), marked as a whole copy: where x is device state whose new value is
    out (a KV cache, the decode loop's history), the graph drops it and updates the
    state in place (``NodeBuilder.mark_whole_copy``, runtime/device_state.py)."""
    affine_copy(b, out, x, lambda: flat_plan(out.numel))
    if x.dtype == out.dtype and tuple(x.max_shape) == tuple(out.max_shape):
        b.mark_whole_copy(x, out)


def flat_impl(b, node):
    """OpSpec impl of ops whose output is the input's elements in order (view, clone,
    _to_copy...): node.args[0] is the input value id, node.args[-1] the output's.

    Records nothing when both tensors are in one memory region in one dtype (a
    view whose memory planning gave it its input's memory object, OpSpec ``may_alias``):
    the copy would write every element onto itself. Aliased buffers start at the same
    offset (runtime/memory.py ``Allocator.aliased``), so this holds for any blob.
    """
    x, out = b.tensor(node.args[0]), b.tensor(node.args[-1])
    if x.buffer.region == out.buffer.region and x.dtype == out.dtype \
            and x.device_dtype == out.device_dtype:
        return
    affine_copy(b, out, x, lambda: flat_plan(out.numel))


def declare_copy(dtype_pairs) -> None:
    """Declare the affine_copy variants for (out dtype, in dtype) graph-dtype pairs."""
    declare_grid(SHADER, lambda profile, pair: copy_defines(
        device_dtype(pair[0], profile), device_dtype(pair[1], profile), *pair),
        profile=STORAGE_PROFILES, pair=tuple(dtype_pairs))
