"""Indexing by integer tensors: index_select, embedding, index.Tensor, gather.

index_select, embedding and index.Tensor with ONE index tensor all pick whole rows
along one dim: the input viewed as [outer, size, inner], the output as
[outer, count, inner] (index_rows.glsl). index.Tensor is what torch.export emits for
``x[:, idx]`` and for reflection/replication padding (with arange/abs/clamp building
the indices). index.Tensor with 2..4 index tensors on consecutive dims, broadcast
together (``x[rows[:, None], cols]``; HF's padding masks: ``mask[batch_idx, kv_idx]``),
runs index_broadcast.glsl. Index tensors on separated dims (ATen moves their result
dims to the front) and bool masks (data-dependent sizes) stay on the CPU. gather has its own shader. Negative indices count from the end
where ATen allows them (index.Tensor: -size..size-1); index_select, embedding and
gather take 0..size-1 only, as eager does. An index ATen rejects sets the node's error
flag (NodeBuilder.error_flag: the run raises VkDelegateError naming the node) and is
clamped on the device, so no read leaves the buffer.
"""
from __future__ import annotations

import math

from vkdelegate.kernels.affine_copy import MOVE_DTYPES
from vkdelegate.kernels.broadcast import broadcast_shape
from vkdelegate.kernels.dims import wrap_dim
from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, register
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

INDEX_DTYPES = frozenset({"int64", "int32"})


def _defines(out, x, idx, dtype: str) -> dict:
    """out, x, idx: Tensors or (graph dtype, device dtype) pairs."""
    d = storage_defines(OUT=out, IN=x, IDX=idx)
    d["IN_ACC"] = acc_type(dtype)
    return d


def _range_message(x, dim: int, allow_negative: bool):
    """() -> the error message for an index out of range along ``dim`` of ``x``
    (current sizes, read after the run that flagged it)."""
    def message():
        size = x.shape[dim] if x.ndim else 1
        valid = f"{-size}..{size - 1}" if allow_negative else f"0..{size - 1}"
        return (f"an index is out of range for dim {dim} of size {size} "
                f"(valid indices: {valid})")
    return message


ROWS_PARAMS = ParamBlock("rows_block", [
    ("info", "ivec4"),    # x: out numel, y: inner, z: count, w: size of the indexed dim
    ("check", "ivec4")])  # x: error-flag word of this node, y: 1 if negative indices wrap
GATHER_PARAMS = ParamBlock("gather_block", [
    ("info", "ivec4")])   # x: gathered dim, counted from the innermost (0); y: flag word


@shader_bindings("index_rows")
def _rows_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "error_flags"), inputs=("in_data", "index_data"),
                    params=(ROWS_PARAMS,))


@shader_bindings("gather")
def _gather_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "error_flags"), inputs=("in_data", "index_data"),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            GATHER_PARAMS))


def _rows(b, out, x, index, dim: int, allow_negative: bool):
    """Record one index_rows dispatch picking rows along ``dim`` of ``x``."""
    flag = b.error_flag(_range_message(x, dim, allow_negative))

    def info():
        inner = math.prod(x.shape[dim + 1:])
        size = x.shape[dim] if x.ndim else 1  # a 0-d input is one row
        return ROWS_PARAMS.pack(
            info=[out.numel, max(inner, 1), max(index.numel, 1), size],
            check=[flag.slot, int(allow_negative)])
    params = b.params(info())
    b.on_resize(lambda: params.write(info()))
    b.dispatch("index_rows", _defines(out, x, index, out.dtype), outputs=[out, flag],
               inputs=[x, index], params=[params], global_size=(out.max_numel,))


# ---- index_select ---------------------------------------------------------------
def _index_select_shape(args):
    x, dim, index = args
    shape = list(x.shape)
    if shape:
        shape[wrap_dim(dim, len(shape))] = math.prod(index.shape)
    return tuple(shape)


def _index_select_impl(b, node):
    x_id, dim_id, index_id, out_id = node.args
    x, index, out = b.tensor(x_id), b.tensor(index_id), b.tensor(out_id)
    dim = wrap_dim(b.scalar(dim_id), x.ndim)
    _rows(b, out, x, index, dim, allow_negative=False)


# ---- embedding ------------------------------------------------------------------
def _embedding_shape(args):
    weight, indices = args[0], args[1]
    return tuple(indices.shape) + tuple(weight.shape[1:])


def _embedding_impl(b, node):
    weight, indices, out = (b.tensor(node.args[0]), b.tensor(node.args[1]),
                            b.tensor(node.args[-1]))
    _rows(b, out, weight, indices, 0, allow_negative=False)


def _embedding_rule(node: NodeSpec):
    if node.args[0].rank != 2:
        return f"embedding weight of rank {node.args[0].rank} (must be 2)"
    return None


# ---- index.Tensor -----------------------------------------------------------------
#: index.Tensor's index tensors at most, and the rank of their broadcast shape at most.
MAX_INDEX_TENSORS = 4
BROADCAST_PARAMS = ParamBlock("index_broadcast_block", [
    ("info", "ivec4"),      # x: out numel, y: inner, z: K, w: error-flag word
    ("bshape", "ivec4"),    # broadcast index shape B, outermost first, leading 1s
    ("sizes", "ivec4"),     # sizes of the indexed dims of x
    ("strides0", "ivec4"), ("strides1", "ivec4"), ("strides2", "ivec4"),
    ("strides3", "ivec4")])


@shader_bindings("index_broadcast")
def _broadcast_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "error_flags"),
                    inputs=("in_data", "index0", "index1", "index2", "index3"),
                    params=(BROADCAST_PARAMS,))


def _index_tensors(indices) -> tuple[int, list]:
    """(d, tensors): the first indexed dim and the index tensors of an index.Tensor
    indices list (None entries are whole dims). VkDelegateError unless the tensors sit
    on consecutive dims (ATen moves the result dims of separated index tensors to the
    front, which this op does not do) and there are 1..MAX_INDEX_TENSORS of them."""
    dims = [d for d, t in enumerate(indices) if t is not None]
    if not dims or len(dims) > MAX_INDEX_TENSORS:
        raise VkDelegateError(f"index.Tensor with {len(dims)} index tensors (1 to "
                              f"{MAX_INDEX_TENSORS} are supported)")
    if dims != list(range(dims[0], dims[0] + len(dims))):
        raise VkDelegateError(f"index.Tensor with index tensors on dims {dims}, which are "
                              "not consecutive")
    return dims[0], [indices[d] for d in dims]


def _index_broadcast_shape(tensors) -> tuple:
    """The broadcast shape of the index tensors' shapes (VkDelegateError if none)."""
    shape = ()
    for t in tensors:
        shape = broadcast_shape(shape, tuple(t.shape))
    return shape


def _index_shape(args):
    x, indices = args
    d, tensors = _index_tensors(indices)
    return tuple(x.shape[:d]) + _index_broadcast_shape(tensors) + tuple(x.shape[d + len(tensors):])


def _index_broadcast_pack(out, x, tensors, d: int, flag) -> bytes:
    """The index_broadcast parameter block for the current sizes."""
    k = len(tensors)
    bshape = _index_broadcast_shape(tensors)
    pad = (1,) * (4 - len(bshape)) + bshape
    strides = []
    for t in tensors:
        shape = (1,) * (4 - t.ndim) + tuple(t.shape)
        step, row = 1, [0] * 4
        for dim in range(3, -1, -1):
            row[dim] = step if shape[dim] != 1 else 0
            step *= shape[dim]
        strides.append(row)
    strides += [[0] * 4] * (MAX_INDEX_TENSORS - k)
    sizes = list(x.shape[d:d + k]) + [1] * (MAX_INDEX_TENSORS - k)
    inner = math.prod(x.shape[d + k:])
    return BROADCAST_PARAMS.pack(info=[out.numel, max(inner, 1), k, flag.slot],
                                 bshape=list(pad), sizes=sizes, strides0=strides[0],
                                 strides1=strides[1], strides2=strides[2],
                                 strides3=strides[3])


def _index_impl(b, node):
    x_id, indices_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    try:
        d, tensors = _index_tensors(b.value(indices_id))
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    if len(tensors) == 1:
        _rows(b, out, x, tensors[0], d, allow_negative=True)
        return
    if len({t.dtype for t in tensors}) != 1:
        raise b.error("index.Tensor with index tensors of different dtypes")
    flag = b.error_flag(lambda: (f"an index is out of range for dims {d}..{d + len(tensors) - 1}"
                                 f" of sizes {list(x.shape[d:d + len(tensors)])}"))
    params = b.params(_index_broadcast_pack(out, x, tensors, d, flag))
    b.on_resize(lambda: params.write(_index_broadcast_pack(out, x, tensors, d, flag)))
    bound = tensors + [tensors[0]] * (MAX_INDEX_TENSORS - len(tensors))
    b.dispatch("index_broadcast", _defines(out, x, tensors[0], out.dtype),
               outputs=[out, flag], inputs=[x, *bound], params=[params],
               global_size=(out.max_numel,))


def _index_rule(node: NodeSpec):
    indices = node.args[1]
    if any(t is not None and not isinstance(t, TensorSpec) for t in indices):
        return "index.Tensor with an index that is not a tensor"
    try:
        _, tensors = _index_tensors(indices)
        if len(_index_broadcast_shape(tensors)) > 4:
            return "index.Tensor whose index tensors broadcast to more than 4 dims"
    except VkDelegateError as exc:
        return str(exc)
    if len({t.dtype for t in tensors}) != 1:
        return "index.Tensor with index tensors of different dtypes"
    return None


# ---- gather ----------------------------------------------------------------------
def _gather_shape(args):
    return tuple(args[2].shape)


def _gather_impl(b, node):
    x_id, dim_id, index_id, _sparse_id, out_id = node.args
    x, index, out = b.tensor(x_id), b.tensor(index_id), b.tensor(out_id)
    if index.ndim != x.ndim:
        raise b.error(f"gather index of rank {index.ndim} for an input of rank {x.ndim}")
    dim = wrap_dim(b.scalar(dim_id), x.ndim)
    flag = b.error_flag(_range_message(x, dim, allow_negative=False))
    params = b.params(GATHER_PARAMS.pack(info=[max(x.ndim, 1) - 1 - dim, flag.slot]))
    b.dispatch("gather", _defines(out, x, index, out.dtype), outputs=[out, flag],
               inputs=[x, index], params=[out.meta, x.meta, params],
               global_size=(out.max_numel,), spec_constants=(out.ndim,))


def _gather_rule(node: NodeSpec):
    x, _dim, index = node.args[:3]
    if index.rank != x.rank:
        return f"gather index of rank {index.rank} for an input of rank {x.rank}"
    return None


def _register(name, impl, shape_fn, index_arg, index_dtypes=INDEX_DTYPES, rules=(),
              notes=""):
    register(OpSpec(name=name, dtypes=MOVE_DTYPES, impl=impl, shape_fn=shape_fn,
                    rules=rules, arg_dtypes={index_arg: index_dtypes}, notes=notes))


_register("aten.index_select.default", _index_select_impl, _index_select_shape, 2,
          notes="int32/int64 indices; out-of-range ones raise after the run")
_register("aten.embedding.default", _embedding_impl, _embedding_shape, 1,
          rules=(_embedding_rule,),
          notes="forward only (padding_idx has no effect); out-of-range indices raise "
                "after the run")
_register("aten.index.Tensor", _index_impl, _index_shape, 1, rules=(_index_rule,),
          notes="1-4 index tensors on consecutive dims, broadcast together (x[:, idx], "
                "x[i[:, None], j]); out-of-range indices raise after the run")
_register("aten.gather.default", _gather_impl, _gather_shape, 2,
          index_dtypes=frozenset({"int64"}), rules=(_gather_rule,),
          notes="any dim; out-of-range indices raise after the run")

def _variant(profile, dtype: str, index: str) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return _defines(ddt, ddt, (index, device_dtype(index, profile)), dtype)


declare_grid(("index_rows", "gather", "index_broadcast"), _variant, profile=STORAGE_PROFILES,
             dtype=MOVE_DTYPES, index=INDEX_DTYPES)
