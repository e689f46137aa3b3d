"""Writes into a copy of a tensor (what a KV-cache update exports as): index_copy,
index_put (accumulate=False), slice_scatter, select_scatter, copy (src broadcast into
self's sizes, what slice assignment exports) and
``vkdelegate.slice_scatter_at`` (a slice_scatter whose start is read from a tensor on
the device); the paired cache writes of a decoder layer, ``vkdelegate.index_put_pair``,
``rotary_index_put_pair`` (with the rotary embedding of q and k) and
``rms_norm_linear_rotary_cache`` (with the layer's norm and merged q/k/v GEMV too:
its section at the end).

All are functional (ATen schemas): the output is the destination's values with a
region overwritten. Each records a flat copy of the destination into the output, then
the region: slice_scatter/select_scatter as an affine copy into the output at the
slice's offset and strides (start, end and index may be SymInts, re-read after every
resize), the others with scatter_rows.glsl. A module buffer updated in place
(``cache.index_copy_(2, pos, k)``) exports as one of these plus a buffer mutation; the
program layer keeps that buffer on the device (``DelegateGraph.bind_state``), so the
cache never crosses to the host; where the op is the state's only reader, the copy of
the destination is dropped and the op writes its region into the state's memory in
place (``NodeBuilder.mark_whole_copy``), so a decode step moves only the new rows.

Out-of-range positions raise as eager does: an index_copy/index_put index outside
0..size-1 (index_put also -size..-1) sets the node's error flag (the run raises
VkDelegateError naming the node) and that element is not written; slice_scatter_at
with ``start < 0`` or ``start + src.size(dim) > size`` flags and writes nothing of the
region (eager's slice assignment raises on the size mismatch, ExecuTorch's
update_cache on the range). slice_scatter clamps its bounds as ATen's slicing does and
requires ``src`` to have the slice's sizes. Duplicate indices with accumulate=False
leave one of the written values (unspecified which, as on CUDA).
"""
from __future__ import annotations

import math

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.affine_copy import (MOVE_DTYPES, CopyDim, CopyPlan, affine_copy,
                                            contiguous_strides, copy_destination)
from vkdelegate.kernels import gemm
from vkdelegate.kernels.dims import slice_bounds, wrap_dim
from vkdelegate.kernels.gemm_core import GEMV_SHADER, record_core
from vkdelegate.kernels.norm_dispatch import rms_input_rule, rms_prologue
from vkdelegate.kernels.rotary_cache import (ROTARY_CACHE_PARAMS, ProductShape, RotaryCache,
                                             defines as rotary_cache_defines)
from vkdelegate.kernels.rotary_half import broadcast_strides, padded_sizes, pair_reason
from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.runtime.params import meta_record
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "scatter_rows"
INDEX_DTYPES = frozenset({"int64", "int32"})
SCATTER_PARAMS = ParamBlock("scatter_block", [
    ("info", "ivec4"),    # x: region numel, y: inner, z: count, w: size of the dim
    ("check", "ivec4")])  # x: error-flag word, y: 1 if negative indices wrap


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "error_flags"), inputs=("src_data", "index_data"),
                    params=(SCATTER_PARAMS,))


def _defines(out, src, idx, pos: bool, scalar: bool) -> dict:
    """out, src, idx: Tensors or (graph dtype, device dtype) pairs."""
    d = storage_defines(OUT=out, SRC=src, IDX=idx)
    dtype = out.dtype if hasattr(out, "dtype") else out[0]
    d["SRC_ACC"] = acc_type(dtype)
    d.update(flag_defines(POS_FROM_TENSOR=pos, SRC_SCALAR=scalar))
    return d


def _scatter(b, out, src, index, dim: int, count_fn, *, pos: bool, wrap: bool,
             message) -> None:
    """Record the scatter_rows dispatch writing ``src``'s rows into ``out`` along
    ``dim``; count_fn() gives the region's row count for the current sizes."""
    flag = b.error_flag(message)
    scalar = src.max_numel == 1  # one value broadcast over the region

    def pack():
        inner = math.prod(out.shape[dim + 1:])
        numel = math.prod(out.shape[:dim]) * count_fn() * inner
        return SCATTER_PARAMS.pack(info=[numel, max(inner, 1), max(count_fn(), 1),
                                         out.shape[dim]],
                                   check=[flag.slot, int(wrap)])
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    grid = math.prod(out.max_shape[:dim]) * count_fn() * math.prod(out.max_shape[dim + 1:])
    b.dispatch(SHADER, _defines(out, src, index, pos, scalar), outputs=[out, flag],
               inputs=[src, index], params=[params], global_size=(max(grid, 1),),
               local_size=b.local_size_1d(grid))


def _range(x, dim: int, negative: bool):
    def message():
        size = x.shape[dim]
        valid = f"{-size}..{size - 1}" if negative else f"0..{size - 1}"
        return f"an index is out of range for dim {dim} of size {size} (valid: {valid})"
    return message


def _fits(src_shape, region) -> bool:
    """``src`` can fill ``region`` element for element (equal sizes, leading 1s aside)
    or is one element (broadcast)."""
    shape, region = list(src_shape), list(region)
    while shape and shape[0] == 1 and len(shape) > len(region):
        shape.pop(0)
    while region and region[0] == 1 and len(region) > len(shape):
        region.pop(0)
    return math.prod(src_shape) == 1 or shape == region


def _region_reason(src: TensorSpec, region, what: str):
    if _fits(src.shape, region):
        return None
    return (f"{what} of sizes {list(src.shape)} for a region of sizes {list(region)} "
            f"(only equal sizes or one element are supported)")


# ---- index_copy(self, dim, index, source) ------------------------------------------
def _index_copy_impl(b, node):
    x_id, dim_id, index_id, src_id, out_id = node.args
    x, index, src, out = (b.tensor(i) for i in (x_id, index_id, src_id, out_id))
    dim = wrap_dim(b.scalar(dim_id), max(x.ndim, 1))
    copy_destination(b, out, x)
    _scatter(b, out, src, index, dim, lambda: max(index.numel, 0), pos=False, wrap=False,
             message=_range(x, dim, False))


def _index_copy_rule(node: NodeSpec):
    x, dim, index, src = node.args[:4]
    if x.rank == 0 or index.rank > 1:
        return "index_copy of a 0-d tensor or with an index of rank > 1"
    d = wrap_dim(dim, x.rank)
    region = tuple(x.shape[:d]) + (math.prod(index.shape),) + tuple(x.shape[d + 1:])
    return _region_reason(src, region, "source")


# ---- index_put(self, indices, values, accumulate) ----------------------------------
def _one_index(indices):
    """(dim, index tensor) of an index_put indices list holding exactly one tensor."""
    dims = [d for d, t in enumerate(indices) if t is not None]
    if len(dims) != 1:
        raise VkDelegateError(f"index_put with {len(dims)} index tensors (1 is supported)")
    return dims[0], indices[dims[0]]


def _index_put_impl(b, node):
    x_id, indices_id, values_id, acc_id, out_id = node.args
    if b.scalar(acc_id):
        raise b.error("index_put with accumulate=True is not supported")
    x, values, out = b.tensor(x_id), b.tensor(values_id), b.tensor(out_id)
    try:
        dim, index = _one_index(b.value(indices_id))
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    copy_destination(b, out, x)
    _scatter(b, out, values, index, dim, lambda: max(index.numel, 0), pos=False, wrap=True,
             message=_range(x, dim, True))


def _index_put_rule(node: NodeSpec):
    x, indices, values, accumulate = node.args[:4]
    if accumulate:
        return "accumulate=True"
    if any(t is not None and not isinstance(t, TensorSpec) for t in indices):
        return "an index that is not a tensor"
    try:
        dim, index = _one_index(indices)
    except VkDelegateError as exc:
        return str(exc)
    if index.dtype not in INDEX_DTYPES:
        return f"index of dtype {index.dtype} (bool masks stay on the CPU)"
    if dim >= x.rank:
        return f"index on dim {dim} of a rank-{x.rank} tensor"
    # ATen's region: x.shape[:dim] + index.shape + x.shape[dim+1:]; we write it flat.
    region = tuple(x.shape[:dim]) + tuple(index.shape) + tuple(x.shape[dim + 1:])
    flat = tuple(x.shape[:dim]) + (math.prod(index.shape),) + tuple(x.shape[dim + 1:])
    if not (_fits(values.shape, region) or _fits(values.shape, flat)):
        return _region_reason(values, region, "values")
    return None


# ---- vkdelegate.index_put_pair(self, self2, indices, values, values2) ---------------
PAIR_SHADER = "scatter_rows_pair"


@shader_bindings(PAIR_SHADER)
def _pair_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "out2_data", "error_flags"),
                    inputs=("src_data", "src2_data", "index_data"), params=(SCATTER_PARAMS,))


class PairRegion:
    """The two destinations of a paired cache write (index_put_pair,
    rotary_index_put_pair, rms_norm_linear_rotary_cache): their whole copies recorded
    (dropped where the cache is state updated in place), the error flag, and the
    written region's sizes for the current shapes (scatter_pair.h's (numel, inner,
    count, size of the dim))."""

    def __init__(self, b, x, x2, out, out2, indices):
        try:
            self.dim, self.index = _one_index(indices)
        except VkDelegateError as exc:
            raise b.error(str(exc)) from None
        copy_destination(b, out, x)
        copy_destination(b, out2, x2)
        self.flag = b.error_flag(_range(x, self.dim, True))
        self.out, self.out2 = out, out2

    def numel(self) -> int:
        out, dim = self.out, self.dim
        return math.prod(out.shape[:dim]) * max(self.index.numel, 0) \
            * math.prod(out.shape[dim + 1:])

    def max_numel(self) -> int:
        out, dim = self.out, self.dim
        return math.prod(out.max_shape[:dim]) * max(self.index.max_numel, 0) \
            * math.prod(out.max_shape[dim + 1:])

    def sizes(self) -> list:
        out, dim = self.out, self.dim
        return [self.numel(), max(math.prod(out.shape[dim + 1:]), 1),
                max(self.index.numel, 1), out.shape[dim]]


def _index_put_pair_impl(b, node):
    x_id, x2_id, indices_id, values_id, values2_id, out_id = node.args
    x, x2, values, values2 = (b.tensor(i) for i in (x_id, x2_id, values_id, values2_id))
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 2:
        raise b.error("index_put_pair has two outputs")
    out, out2 = outs
    region = PairRegion(b, x, x2, out, out2, b.value(indices_id))
    index = region.index

    def pack():
        if math.prod(values.shape) != region.numel() or \
                math.prod(values2.shape) != region.numel():
            raise VkDelegateError(f"index_put_pair: values of sizes {list(values.shape)} "
                                  f"and {list(values2.shape)} for a region of "
                                  f"{region.numel()} elements")
        return SCATTER_PARAMS.pack(info=region.sizes(), check=[region.flag.slot, 1])
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    grid = 2 * region.max_numel()
    defines = storage_defines(OUT=out, SRC=values, IDX=index)
    defines["SRC_ACC"] = acc_type(out.dtype)
    b.dispatch(PAIR_SHADER, defines, outputs=[out, out2, region.flag],
               inputs=[values, values2, index],
               params=[params], global_size=(max(grid, 1),), local_size=b.local_size_1d(grid))


def index_put_pair_rule(node: NodeSpec):
    x, x2, indices, values, values2 = node.args[:5]
    if (x.dtype, tuple(x.shape)) != (x2.dtype, tuple(x2.shape)):
        return (f"destinations {x.dtype}{list(x.shape)} and {x2.dtype}{list(x2.shape)} "
                f"differ")
    if (values.dtype, tuple(values.shape)) != (values2.dtype, tuple(values2.shape)):
        return "values of different dtypes or sizes"
    if values.dtype != x.dtype:
        return f"values of dtype {values.dtype} for a destination of {x.dtype}"
    why = _index_put_rule(NodeSpec(op="aten.index_put.default",
                                   args=(x, indices, values, False), outputs=node.outputs[:1]))
    if why:
        return why
    dim, index = _one_index(indices)
    region = math.prod(x.shape[:dim]) * math.prod(index.shape) * math.prod(x.shape[dim + 1:])
    if math.prod(values.shape) != region:
        return f"values of sizes {list(values.shape)} (one per element of the region needed)"
    return None


# ---- vkdelegate.rotary_index_put_pair(q, k, cos, sin, self, self2, indices, values2) --
ROTARY_SHADER = "rotary_scatter_pair"
ROTARY_PARAMS = ParamBlock("rotary_scatter_block", [
    ("info", "ivec4"), ("sizes", "ivec4"), ("fstrides", "ivec4"), ("sizes2", "ivec4"),
    ("fstrides2", "ivec4"), ("scatter", "ivec4"), ("check", "ivec4"), ("offsets", "ivec4")])
ROTARY_DTYPES = frozenset({"float32", "float16"})


@shader_bindings(ROTARY_SHADER)
def _rotary_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "cache_data", "cache2_data", "error_flags"),
                    inputs=("in_data", "in2_data", "cos_data", "sin_data", "src2_data",
                            "index_data"), params=(ROTARY_PARAMS,))


def _rotary_defines(out, x, freqs, idx) -> dict:
    d = storage_defines(OUT=out, IN=x, F=freqs, IDX=idx)
    d["SRC_ACC"] = acc_type(out.dtype if hasattr(out, "dtype") else out[0])
    return d


def rotary_scatter(b, out_q, region: PairRegion, sources, cos, sin, shapes,
                   offsets=(0, 0, 0)) -> None:
    """Record rotary_scatter_pair.glsl: q' = rotary_half(q) into ``out_q``, k rotated
    and v written into ``region``'s two destinations. ``sources``: the Tensors holding
    q, k and v (one Tensor three times for a merged product's row), q, k, v starting at
    elements ``offsets`` of them; ``shapes()``: (q's sizes, k's sizes, v's numel) for
    the current sizes."""
    q, k, values2 = sources

    def pack():
        q_shape, k_shape, v_numel = shapes()
        k_numel = math.prod(k_shape)
        if k_numel != region.numel() or v_numel != region.numel():
            raise VkDelegateError(f"rotary_index_put_pair: keys of sizes {list(k_shape)} "
                                  f"and {v_numel} values for a region of "
                                  f"{region.numel()} elements")
        return ROTARY_PARAMS.pack(
            info=[math.prod(q_shape), q_shape[-1] // 2, region.numel(), 0],
            sizes=padded_sizes(q_shape), fstrides=broadcast_strides(cos.shape, q_shape),
            sizes2=padded_sizes(k_shape), fstrides2=broadcast_strides(cos.shape, k_shape),
            scatter=region.sizes(), check=[region.flag.slot, 1],
            offsets=list(offsets) + [0])
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    total = out_q.max_numel + 2 * region.max_numel()
    b.dispatch(ROTARY_SHADER, _rotary_defines(region.out, k, cos, region.index),
               outputs=[out_q, region.out, region.out2, region.flag],
               inputs=[q, k, cos, sin, values2, region.index], params=[params],
               global_size=(max(total, 1),), local_size=b.local_size_1d(total))


def _rotary_index_put_pair_impl(b, node):
    q_id, k_id, cos_id, sin_id, x_id, x2_id, indices_id, values2_id, out_id = node.args
    q, k, cos, sin, x, x2, values2 = (b.tensor(i) for i in (
        q_id, k_id, cos_id, sin_id, x_id, x2_id, values2_id))
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 3:
        raise b.error("rotary_index_put_pair has three outputs")
    out_q, out, out2 = (b.tensor(o) if isinstance(o, int) else o for o in outs)
    region = PairRegion(b, x, x2, out, out2, b.value(indices_id))
    rotary_scatter(b, out_q, region, (q, k, values2), cos, sin,
                   lambda: (q.shape, k.shape, values2.numel))


def _rotary_index_put_pair_rule(node: NodeSpec):
    q, k, cos, sin, x, x2, indices, values2 = node.args[:8]
    why = pair_reason(q, k, cos, sin)
    if why:
        return why
    if q.dtype not in ROTARY_DTYPES:
        return f"q/k of dtype {q.dtype} (float32 or float16)"
    return index_put_pair_rule(NodeSpec(op="vkdelegate.index_put_pair.default",
                                         args=(x, x2, indices, k, values2),
                                         outputs=node.outputs[1:]))


# ---- slice_scatter(self, src, dim, start, end, step), select_scatter(self, src, dim, index)
def _region_plan(out, src, dim: int, start: int, step: int, drop_dim: bool) -> CopyPlan:
    """The affine copy of ``src`` into ``out``'s region starting at ``start`` along
    ``dim`` (every ``step``-th row; ``drop_dim``: src has no ``dim``, select_scatter)."""
    strides = contiguous_strides(out.shape)
    want = list(out.shape)
    if drop_dim:
        del want[dim]
    else:
        want[dim] = src.shape[dim] if dim < src.ndim else 0
    if list(src.shape) != want:
        raise VkDelegateError(f"src has sizes {list(src.shape)}, the region {want}")
    src_strides = contiguous_strides(src.shape)
    dims = []
    for d, size in enumerate(out.shape):
        if d == dim:
            if not drop_dim:
                dims.append(CopyDim(src.shape[dim], strides[d] * step, src_strides[dim]))
            continue
        s = d - 1 if drop_dim and d > dim else d
        dims.append(CopyDim(size, strides[d], src_strides[s]))
    plan = CopyPlan(dims or [CopyDim(1, 1, 1)])
    plan.out_offset = start * strides[dim]
    return plan


def _slice_scatter_impl(b, node):
    x_id, src_id, dim_id, start_id, end_id, step_id, out_id = node.args
    x, src, out = b.tensor(x_id), b.tensor(src_id), b.tensor(out_id)
    dim = wrap_dim(b.scalar(dim_id), x.ndim)
    step = b.scalar(step_id)
    copy_destination(b, out, x)

    def plan():
        start, length = slice_bounds(out.shape[dim], b.scalar(start_id), b.scalar(end_id),
                                     step)
        if src.ndim != out.ndim or src.shape[dim] != length:
            raise VkDelegateError(f"slice_scatter: src has sizes {list(src.shape)}, the "
                                  f"slice {length} rows along dim {dim}")
        return _region_plan(out, src, dim, start, step, drop_dim=False)
    affine_copy(b, out, src, plan)


def _select_scatter_impl(b, node):
    x_id, src_id, dim_id, index_id, out_id = node.args
    x, src, out = b.tensor(x_id), b.tensor(src_id), b.tensor(out_id)
    dim = wrap_dim(b.scalar(dim_id), x.ndim)
    copy_destination(b, out, x)

    def plan():
        index, size = b.scalar(index_id), out.shape[dim]
        if not -size <= index < size:
            raise VkDelegateError(f"select_scatter: index {index} out of range for dim "
                                  f"{dim} of size {size}")
        return _region_plan(out, src, dim, index % size, 1, drop_dim=True)
    affine_copy(b, out, src, plan)


def _slice_scatter_rule(node: NodeSpec):
    x, src, dim, start, end, step = node.args[:6]
    if x.rank == 0 or src.rank != x.rank:
        return f"src of rank {src.rank} for a destination of rank {x.rank}"
    if not isinstance(step, int) or step <= 0:
        return f"step {step} (must be a positive int)"
    if any(b is not None and not isinstance(b, int) for b in (start, end)):
        return "slice bounds that are not ints"
    return None


def _select_scatter_rule(node: NodeSpec):
    x, src = node.args[:2]
    if x.rank == 0 or src.rank != x.rank - 1:
        return f"src of rank {src.rank} for a destination of rank {x.rank}"
    return None


# ---- vkdelegate.slice_scatter_at(self, src, dim, start) -----------------------------
def _slice_scatter_at_impl(b, node):
    x_id, src_id, dim_id, pos_id, out_id = node.args
    x, src, pos, out = (b.tensor(i) for i in (x_id, src_id, pos_id, out_id))
    dim = wrap_dim(b.scalar(dim_id), x.ndim)

    def message():
        return (f"position out of range: start + {src.shape[dim]} rows must be within "
                f"0..{x.shape[dim]} along dim {dim}")
    copy_destination(b, out, x)
    _scatter(b, out, src, pos, dim, lambda: src.shape[dim], pos=True, wrap=False,
             message=message)


def _slice_scatter_at_rule(node: NodeSpec):
    x, src, dim, pos = node.args[:4]
    if x.rank == 0 or src.rank != x.rank:
        return f"src of rank {src.rank} for a destination of rank {x.rank}"
    d = wrap_dim(dim, x.rank)
    if math.prod(pos.shape) != 1:
        return f"start of sizes {list(pos.shape)} (one element expected)"
    if any(s != t for i, (s, t) in enumerate(zip(src.shape, x.shape)) if i != d):
        return f"src of sizes {list(src.shape)} for a destination {list(x.shape)}"
    return None


# ---- copy(self, src, non_blocking): src broadcast to self's sizes, in self's dtype ---
def _copy_impl(b, node):
    x_id, src_id, _nb_id, out_id = node.args
    src, out = b.tensor(src_id), b.tensor(out_id)

    def plan():
        shape = (1,) * (out.ndim - src.ndim) + tuple(src.shape)
        strides = contiguous_strides(shape)
        out_strides = contiguous_strides(out.shape)
        dims = [CopyDim(size, out_strides[d], 0 if shape[d] == 1 else strides[d])
                for d, size in enumerate(out.shape)]
        return CopyPlan(dims or [CopyDim(1, 1, 1)])
    affine_copy(b, out, src, plan)


def _copy_rule(node: NodeSpec):
    x, src = node.args[:2]
    shape = (1,) * (x.rank - src.rank) + tuple(src.shape)
    if src.rank > x.rank or any(s not in (1, t) for s, t in zip(shape, x.shape)):
        return f"src of sizes {list(src.shape)} does not broadcast to {list(x.shape)}"
    if x.dtype != src.dtype:
        return f"a copy from {src.dtype} into {x.dtype}"
    return None


def _same_shape(args):
    return tuple(args[0].shape)


def _op(name, impl, rules, notes, arg_dtypes=None, symbolic=()):
    register(OpSpec(name=name, dtypes=MOVE_DTYPES, impl=impl, shape_fn=_same_shape,
                    rules=rules, arg_dtypes=arg_dtypes or {}, notes=notes,
                    symbolic_args=frozenset(symbolic)))


_op("aten.index_copy.default", _index_copy_impl, (_index_copy_rule,),
    "dim + 1-D int index; out-of-range indices raise after the run", {2: INDEX_DTYPES})
_op("aten.index_put.default", _index_put_impl, (_index_put_rule,),
    "accumulate=False, one index tensor (x[:, :, pos] = v); values of the region's sizes "
    "or one element", {1: INDEX_DTYPES})
_op("aten.slice_scatter.default", _slice_scatter_impl, (_slice_scatter_rule,),
    "bounds clamped as ATen (SymInts too)", symbolic=(3, 4))
_op("aten.select_scatter.default", _select_scatter_impl, (_select_scatter_rule,),
    "index may be a SymInt", symbolic=(3,))
_op("aten.copy.default", _copy_impl, (_copy_rule,),
    "src broadcast to self's sizes (slice assignment exports it), same dtype")
_op("vkdelegate.slice_scatter_at.default", _slice_scatter_at_impl, (_slice_scatter_at_rule,),
    "KV-cache write at start = a tensor's value, read on the device (no host round trip)",
    {3: INDEX_DTYPES})


register(OpSpec(name="vkdelegate.index_put_pair.default", dtypes=MOVE_DTYPES,
                impl=_index_put_pair_impl,
                shape_fn=lambda args: [tuple(args[0].shape), tuple(args[1].shape)],
                rules=(index_put_pair_rule,), arg_dtypes={2: INDEX_DTYPES},
                notes="two index_puts sharing indices and sizes (a layer's K and V cache "
                      "writes; paired by passes/pair_cache_updates) in one dispatch"))


register(OpSpec(name="vkdelegate.rotary_index_put_pair.default", dtypes=ROTARY_DTYPES,
                impl=_rotary_index_put_pair_impl,
                shape_fn=lambda args: [tuple(args[0].shape), tuple(args[4].shape),
                                       tuple(args[5].shape)],
                rules=(_rotary_index_put_pair_rule,), arg_dtypes={6: INDEX_DTYPES},
                max_rank=4,
                notes="rotary_half_pair whose k' only index_put_pair writes (a layer's "
                      "rotary embedding and K/V cache writes; passes/pair_cache_updates) "
                      "in one dispatch; bitwise the two ops'"))


def _variant(profile, dtype: str, index: str, pos: bool, scalar: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return _defines(ddt, ddt, (index, device_dtype(index, profile)), pos, scalar)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=MOVE_DTYPES,
             index=INDEX_DTYPES, pos=(False, True), scalar=(False, True))


def _pair_variant(profile, dtype: str, index: str) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    d = storage_defines(OUT=ddt, SRC=ddt, IDX=(index, device_dtype(index, profile)))
    d["SRC_ACC"] = acc_type(dtype)
    return d


declare_grid(PAIR_SHADER, _pair_variant, profile=STORAGE_PROFILES, dtype=MOVE_DTYPES,
             index=INDEX_DTYPES)


def _rotary_variant(profile, dtype: str, freqs: str, index: str) -> dict:
    x = (dtype, device_dtype(dtype, profile))
    return _rotary_defines(x, x, (freqs, device_dtype(freqs, profile)),
                           (index, device_dtype(index, profile)))


declare_grid(ROTARY_SHADER, _rotary_variant, profile=STORAGE_PROFILES, dtype=ROTARY_DTYPES,
             freqs=ROTARY_DTYPES, index=INDEX_DTYPES)


# ---- vkdelegate.rms_norm_linear_rotary_cache -------------------------------------
# vkdelegate.rms_norm_linear_rotary_cache: a decode layer's input RMS norm, its merged
# q/k/v GEMV, the rotary embedding of q and k and the K/V cache writes, in one dispatch.
#
# ``rms_norm_linear_rotary_cache(x, norm_weight, eps, weight, bias?, cos, sin, cache,
# cache2, indices, q_sizes, kv_sizes) -> (q', cache', cache2')`` (backend/custom_ops.py):
# y = rms_norm_linear(x, ...) of one row, q = y[:Nq] viewed to q_sizes, k and v the next
# Nk elements each viewed to kv_sizes; then rotary_index_put_pair(q, k, cos, sin, cache,
# cache2, indices, v). Made by backend/passes/fuse_linear_rotary_cache.py in a decode
# step (where the layer had rms_norm_linear -> three narrow_last parts ->
# rotary_index_put_pair).
#
# Forms (kernels/gemm.py's ``select`` for a one-row product of [N, K]):
# - the GEMV path (GPUs): gemv.glsl's ROTARY epilogue (kernels/rotary_cache.py), with the
#   norm folded in (RMS_NORM) unless compile option ``rms_norm_prologue`` is off (then
#   norm.glsl's dispatch first): one dispatch, y never stored;
# - otherwise (CPU drivers: linear.glsl): the dispatches of the two ops it replaces, in
#   their order: the norm and the product into a scratch row y (as rms_norm_linear
#   records them), then rotary_scatter_pair.glsl reading q, k and v at their offsets in
#   y (ops/families/cache_update.py's ``rotary_scatter``).
# Both give every element the bits of the unfused pair (tests/ops/test_rotary_cache.py).
# The caches' whole copies are recorded as index_put_pair's are (dropped where a cache is
# the program's state updated in place); an index ATen rejects sets the node's error
# flag and writes nothing of its element.
ROTARY_CACHE = "vkdelegate.rms_norm_linear_rotary_cache.default"


def _rc_sizes(v) -> "tuple | None":
    """``v`` as sizes of rank 1-4, each >= 1, else None."""
    if not isinstance(v, (list, tuple)) or not 1 <= len(v) <= 4 or any(
            not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in v):
        return None
    return tuple(v)


def _rotary_cache_rule(node: NodeSpec):
    """What the kernels index: x one static row [1, .., 1, K]; rms_norm_linear's
    arguments (norm_weight [K], weight [N, K], bias [N]?); q_sizes and kv_sizes of rank
    1-4 with one even last dim D and N = prod(q_sizes) + 2 prod(kv_sizes); cos and sin
    broadcasting to both (rotary_half_pair's rule); every float tensor of x's dtype
    (float32 or float16); the caches and the
    indices as index_put_pair's with k and v of kv_sizes (one index tensor, the region
    prod(kv_sizes) elements); no dynamic sizes."""
    x, nw, eps, w, bias, cos, sin, cache, cache2, indices, q_sizes, kv_sizes = \
        node.args[:12]
    if not all(isinstance(t, TensorSpec) for t in (x, nw, w, cos, sin, cache, cache2)):
        return "x, norm_weight, weight, cos, sin and the caches must be tensors"
    if any(t.is_dynamic for t in node.tensors()):
        return "dynamic sizes"
    why = rms_input_rule(node)
    if why:
        return why
    if x.rank < 1 or any(s != 1 for s in x.shape[:-1]):
        return f"input of sizes {list(x.shape)}: one row [1, .., 1, K] expected"
    if w.rank != 2 or w.shape[1] != x.shape[-1]:
        return f"weight of sizes {list(w.shape)} for an input of sizes {list(x.shape)}"
    if bias is not None and (not isinstance(bias, TensorSpec)
                             or tuple(bias.shape) != (w.shape[0],)):
        return f"bias must be [{w.shape[0]}]"
    qs, kvs = _rc_sizes(q_sizes), _rc_sizes(kv_sizes)
    if qs is None or kvs is None:
        return f"q_sizes {q_sizes!r} and kv_sizes {kv_sizes!r} must be sizes of rank 1-4"
    if math.prod(qs) + 2 * math.prod(kvs) != w.shape[0]:
        return (f"q_sizes {list(qs)} and 2 x kv_sizes {list(kvs)} do not split the "
                f"{w.shape[0]} rows of the weight")
    floats = [t for t in (x, nw, w, bias, cos, sin, cache, cache2) if t is not None]
    if x.dtype not in ROTARY_DTYPES or any(t.dtype != x.dtype for t in floats):
        return (f"dtypes {[t.dtype for t in floats]}: x, the weights, cos, sin and the "
                f"caches need one dtype, float32 or float16")
    q, k = TensorSpec(x.dtype, qs), TensorSpec(x.dtype, kvs)
    return pair_reason(q, k, cos, sin) or index_put_pair_rule(NodeSpec(
        op="vkdelegate.index_put_pair.default", args=(cache, cache2, indices, k, k),
        outputs=node.outputs[1:]))


def _rotary_cache_shape(args):
    return [tuple(args[10]), tuple(args[7].shape), tuple(args[8].shape)]


def _rotary_cache_impl(b, node):
    (x_id, nw_id, eps_id, w_id, bias_id, cos_id, sin_id, c_id, c2_id, indices_id,
     qs_id, kvs_id, out_id) = node.args
    x, w, cos, sin, cache, cache2 = (b.tensor(i) for i in (x_id, w_id, cos_id, sin_id,
                                                           c_id, c2_id))
    bias = None if b.value(bias_id) is None else b.tensor(bias_id)
    q_sizes, kv_sizes = tuple(b.int_list(qs_id)), tuple(b.int_list(kvs_id))
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 3:
        raise b.error("rms_norm_linear_rotary_cache has three outputs")
    out_q, out, out2 = (b.tensor(o) if isinstance(o, int) else o for o in outs)
    nq, nk = math.prod(q_sizes), math.prod(kv_sizes)
    n, k = nq + 2 * nk, x.max_shape[-1]
    if w.max_shape != (n, k) or math.prod(x.max_shape) != k \
            or out_q.max_shape != q_sizes:
        raise b.error(f"weight {list(w.max_shape)}, input {list(x.max_shape)} and q' "
                      f"{list(out_q.max_shape)} for q {list(q_sizes)} and k/v "
                      f"{list(kv_sizes)}")
    norm = rms_prologue(b, node, x, nw_id, eps_id)
    form = gemm.checked_select(b, 1, n, k, plain=False, dtype=out_q.dtype, nk=True)
    if form.shader == GEMV_SHADER:
        region = PairRegion(b, cache, cache2, out, out2, b.value(indices_id))
        a, fold = gemm.norm_input(b, norm, x, True)
        shape = tuple(x.max_shape[:-1]) + (n,)
        product = ProductShape(shape, b.params(meta_record(shape).tobytes()), out_q.dtype,
                               out_q.device_dtype)
        params = b.params(ROTARY_CACHE_PARAMS.pack(
            rot=[nq, nk, q_sizes[-1] // 2, region.flag.slot], sizes=padded_sizes(q_sizes),
            fstrides=broadcast_strides(cos.shape, q_sizes), sizes2=padded_sizes(kv_sizes),
            fstrides2=broadcast_strides(cos.shape, kv_sizes), scatter=region.sizes()))
        rotary = RotaryCache([out_q, out, out2, region.flag], [cos, sin, region.index],
                             params, rotary_cache_defines(cos, region.index, out_q.dtype))
        record_core(b, form, product, a, w, bias, "nk",
                    norm=None if fold is None else (fold.weight, fold.eps), rotary=rotary)
        return
    # The unfused pair's dispatches: rms_norm_linear into y, then rotary_index_put_pair.
    y = b.temporary(tuple(x.max_shape[:-1]) + (n,), out_q.dtype)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.matmul(b, y, x, w, bias, layout, norm=norm)
    region = PairRegion(b, cache, cache2, out, out2, b.value(indices_id))
    rotary_scatter(b, out_q, region, (y, y, y), cos, sin, lambda: (q_sizes, kv_sizes, nk),
                   offsets=(0, nq, nq + nk))


register(OpSpec(name=ROTARY_CACHE, dtypes=ROTARY_DTYPES, impl=_rotary_cache_impl,
                shape_fn=_rotary_cache_shape, rules=(_rotary_cache_rule,),
                arg_dtypes={9: INDEX_DTYPES}, max_rank=4,
                notes="rotary_index_put_pair of the q/k/v parts of a one-row "
                      "rms_norm_linear (a decode layer's norm, q/k/v GEMV, rotary and "
                      "K/V cache writes): one dispatch on the GEMV path (the rotary "
                      "pairs and cache writes in its epilogue), else the unfused "
                      "pair's; bitwise the pair's"))
