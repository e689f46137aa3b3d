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
from vkdelegate.kernels import rotary_cache
from vkdelegate.kernels.cache_pair import (INDEX_DTYPES, ROTARY_DTYPES, PairRegion,
                                           index_put_pair_rule, index_put_rule, one_index,
                                           range_message, region_reason, rotary_scatter)
from vkdelegate.kernels.norm_dispatch import rms_input_rule, rms_prologue
from vkdelegate.kernels.rotary_half import pair_reason
from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "scatter_rows"
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


# ---- index_copy(self, dim, index, source) ------------------------------------------
def _index_copy_impl(b, node):
    x_id, dim_id, index_id, src_id, out_id = node.args
    x, index, src, out = (b.tensor(i) for i in (x_id, index_id, src_id, out_id))
    dim = wrap_dim(b.scalar(dim_id), max(x.ndim, 1))
    copy_destination(b, out, x)
    _scatter(b, out, src, index, dim, lambda: max(index.numel, 0), pos=False, wrap=False,
             message=range_message(x, dim, False))


def _index_copy_rule(node: NodeSpec):
    x, dim, index, src = node.args[:4]
    if x.rank == 0 or index.rank > 1:
        return "index_copy of a 0-d tensor or with an index of rank > 1"
    d = wrap_dim(dim, x.rank)
    region = tuple(x.shape[:d]) + (math.prod(index.shape),) + tuple(x.shape[d + 1:])
    return region_reason(src, region, "source")


# ---- index_put(self, indices, values, accumulate) ----------------------------------
def _index_put_impl(b, node):
    x_id, indices_id, values_id, acc_id, out_id = node.args
    if b.scalar(acc_id):
        raise b.error("index_put with accumulate=True is not supported")
    x, values, out = b.tensor(x_id), b.tensor(values_id), b.tensor(out_id)
    try:
        dim, index = one_index(b.value(indices_id))
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    copy_destination(b, out, x)
    _scatter(b, out, values, index, dim, lambda: max(index.numel, 0), pos=False, wrap=True,
             message=range_message(x, dim, True))


# ---- vkdelegate.index_put_pair(self, self2, indices, values, values2) ---------------
PAIR_SHADER = "scatter_rows_pair"


@shader_bindings(PAIR_SHADER)
def _pair_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "out2_data", "error_flags"),
                    inputs=("src_data", "src2_data", "index_data"), params=(SCATTER_PARAMS,))


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


# ---- vkdelegate.rotary_index_put_pair(q, k, cos, sin, self, self2, indices, values2) --
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
_op("aten.index_put.default", _index_put_impl, (index_put_rule,),
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
#   y (kernels/cache_pair.py's ``rotary_scatter``).
# Both give every element the bits of the unfused pair (tests/ops/test_rotary_cache.py).
# The caches' whole copies are recorded as index_put_pair's are (dropped where a cache is
# the program's state updated in place); an index ATen rejects sets the node's error
# flag and writes nothing of its element. kernels/rotary_cache.py holds what this op
# shares with its int4 / int8 weight-only forms (ops/families/quantized_linear.py): the
# load rule of its rotary and cache arguments, the epilogue's setup, the unfused
# form's scatter.
ROTARY_CACHE = "vkdelegate.rms_norm_linear_rotary_cache.default"


def _product_rule(node: NodeSpec):
    """rms_norm_linear's arguments: x, norm_weight [K] (ops/families/norm.py's rule),
    weight [N, K], bias [N]?; kernels/rotary_cache.py's ``rule`` checks the rest."""
    x, nw, eps, w, bias = node.args[:5]
    if not all(isinstance(t, TensorSpec) for t in (x, nw, w)):
        return "x, norm_weight and weight must be tensors"
    why = rms_input_rule(node)
    if why:
        return why
    if w.rank != 2 or w.shape[1] != x.shape[-1]:
        return f"weight of sizes {list(w.shape)} for an input of sizes {list(x.shape)}"
    if bias is not None and (not isinstance(bias, TensorSpec)
                             or tuple(bias.shape) != (w.shape[0],)):
        return f"bias must be [{w.shape[0]}]"
    return None


def _rotary_cache_impl(b, node):
    x_id, nw_id, eps_id, w_id, bias_id = node.args[:5]
    x, w = b.tensor(x_id), b.tensor(w_id)
    bias = None if b.value(bias_id) is None else b.tensor(bias_id)
    write = rotary_cache.CacheWrite(b, node, 5, x, w.max_shape[0])
    if w.max_shape[1:] != x.max_shape[-1:]:
        raise b.error(f"weight {list(w.max_shape)} for an input {list(x.max_shape)}")
    norm = rms_prologue(b, node, x, nw_id, eps_id)
    n, k = write.n, x.max_shape[-1]
    form = gemm.checked_select(b, 1, n, k, plain=False, dtype=write.out_q.dtype, nk=True)
    if form.shader == GEMV_SHADER:
        product, rotary = write.fused(b)
        a, fold = gemm.norm_input(b, norm, x, True)
        record_core(b, form, product, a, w, bias, "nk",
                    norm=None if fold is None else (fold.weight, fold.eps), rotary=rotary)
        return
    # The unfused pair's dispatches: rms_norm_linear into y, then rotary_index_put_pair.
    y = write.product_row(b)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.matmul(b, y, x, w, bias, layout, norm=norm)
    write.unfused(b, y)


register(OpSpec(name=ROTARY_CACHE, dtypes=ROTARY_DTYPES, impl=_rotary_cache_impl,
                shape_fn=rotary_cache.shape(5),
                rules=(_product_rule, rotary_cache.rule(5, 3, (1, 3, 4))),
                arg_dtypes={9: INDEX_DTYPES}, max_rank=4,
                notes="rotary_index_put_pair of the q/k/v parts of a one-row "
                      "rms_norm_linear (a decode layer's norm, q/k/v GEMV, rotary and "
                      "K/V cache writes): one dispatch on the GEMV path (the rotary "
                      "pairs and cache writes in its epilogue), else the unfused "
                      "pair's; bitwise the pair's"))
