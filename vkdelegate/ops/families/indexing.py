"""Indexing by integer tensors: index_select, embedding, index.Tensor, gather.

index_select, embedding and index.Tensor with ONE index tensor all pick whole rows
along one dim: the input viewed as [outer, size, inner], the output as
[outer, count, inner] (index_rows.glsl). index.Tensor is what torch.export emits for
``x[:, idx]`` and for reflection/replication padding (with arange/abs/clamp building
the indices). Several index tensors (broadcast together) and bool masks (data-dependent
sizes) stay on the CPU. gather has its own shader. Negative indices count from the end
where ATen allows them (index.Tensor: -size..size-1); index_select, embedding and
gather take 0..size-1 only, as eager does. An index ATen rejects sets the node's error
flag (NodeBuilder.error_flag: the run raises VkDelegateError naming the node) and is
clamped on the device, so no read leaves the buffer.
"""
from __future__ import annotations

import math

from vkdelegate.kernels.affine_copy import MOVE_DTYPES
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
def _single_index(indices) -> tuple[int, object]:
    """(dim, index) of the one non-None entry of an index.Tensor indices list."""
    found = [(d, t) for d, t in enumerate(indices) if t is not None]
    if len(found) != 1:
        raise VkDelegateError(f"index.Tensor with {len(found)} index tensors")
    return found[0]


def _index_shape(args):
    x, indices = args
    d, index = _single_index(indices)
    return tuple(x.shape[:d]) + tuple(index.shape) + tuple(x.shape[d + 1:])


def _index_impl(b, node):
    x_id, indices_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    try:
        d, index = _single_index(b.value(indices_id))
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    _rows(b, out, x, index, d, allow_negative=True)


def _index_rule(node: NodeSpec):
    tensors = [t for t in node.args[1] if isinstance(t, TensorSpec)]
    if len(tensors) != 1 or len([t for t in node.args[1] if t is not None]) != 1:
        return (f"index.Tensor with {len(tensors)} index tensors (only one index tensor "
                f"is supported)")
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
          notes="one index tensor (x[:, idx]); reflection/replication pad; out-of-range "
                "indices raise after the run")
_register("aten.gather.default", _gather_impl, _gather_shape, 2,
          index_dtypes=frozenset({"int64"}), rules=(_gather_rule,),
          notes="any dim; out-of-range indices raise after the run")

def _variant(profile, dtype: str, index: str) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return _defines(ddt, ddt, (index, device_dtype(index, profile)), dtype)


declare_grid(("index_rows", "gather"), _variant, profile=STORAGE_PROFILES,
             dtype=MOVE_DTYPES, index=INDEX_DTYPES)
