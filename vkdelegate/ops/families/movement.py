"""View-like ops as affine copies: view, squeeze, unsqueeze, permute, expand, repeat,
slice, select, flip (what torch.export + run_decompositions emits for reshape,
flatten, transpose, t, narrow, unbind, x[...] indexing with ints and slices).

Each op turns its arguments and the current input sizes into a ``CopyPlan``
(see copy.py); sizes follow ATen exactly: negative dims wrap, slice bounds clamp to
``[0, size]`` (an empty result when end <= start), view infers one ``-1``. A size
argument may be symbolic (a SymInt value, ops/families/symint.py) where an op declares
it in ``symbolic_args`` (view/_unsafe_view/expand sizes, slice bounds, select index):
shape functions and copy plans read its current number at every resize. The
symbolic_view_sizes pass turns a view's single symbolic size into ``-1`` first.
"""
from __future__ import annotations

import dataclasses
import math

from vkdelegate.kernels.affine_copy import (MODULO, MOVE_DTYPES, CopyDim, CopyPlan,
                                            affine_copy, around, contiguous_strides,
                                            copy_last_part, flat_impl, merged, runs)
from vkdelegate.kernels.dims import slice_bounds, wrap_dim
from vkdelegate.kernels.rules import same_dtype, same_shape, shape_from_list
from vkdelegate.ops.registry import REGISTRY, NodeSpec, OpSpec, register
from vkdelegate.errors import VkDelegateError


def _flat_impl(b, node):
    # A function of this module, so that docs/OPS.md lists the op in this family.
    flat_impl(b, node)


def view_shape(in_shape, sizes) -> tuple:
    """Sizes of ``view(x, sizes)``: one -1 is inferred from the element count."""
    numel = math.prod(in_shape)
    sizes = [int(s) for s in sizes]
    if sizes.count(-1) > 1:
        raise VkDelegateError(f"view sizes {sizes}: only one -1 allowed")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if known == 0 or numel % known:
            raise VkDelegateError(f"view of {list(in_shape)} as {sizes} is invalid")
        sizes[sizes.index(-1)] = numel // known
    if math.prod(sizes) != numel:
        raise VkDelegateError(f"view of {list(in_shape)} ({numel} elements) as {sizes}")
    return tuple(sizes)


# ---- view, squeeze, unsqueeze: contiguous data does not move --------------------------
def squeeze_shape(shape, dims) -> tuple:
    keep = set(range(len(shape))) - {wrap_dim(d, len(shape)) for d in dims}
    return tuple(s for i, s in enumerate(shape) if i in keep or s != 1)


def _unsqueeze_shape(args):
    shape = list(args[0].shape)
    shape.insert(wrap_dim(args[1], len(shape) + 1), 1)
    return tuple(shape)


def _squeeze_rule(node: NodeSpec):
    x = node.args[0]
    for d in node.args[1]:
        if -max(x.rank, 1) <= d < max(x.rank, 1) and x.rank and \
                x.dynamic and x.dynamic[d % x.rank]:
            return f"squeeze of dynamic dim {d} (its result rank depends on the size)"
    return None


# ---- permute ------------------------------------------------------------------------
def _permute_shape(args):
    shape = args[0].shape
    return tuple(shape[wrap_dim(p, len(shape))] for p in args[1])


def _permute_impl(b, node):
    x_id, dims_id, out_id = node.args
    x = b.tensor(x_id)
    _permute_copy(b, b.tensor(out_id), x, [wrap_dim(p, x.ndim) for p in b.int_list(dims_id)])


def _t_impl(b, node):
    """t_copy (ExecuTorch): transpose of a tensor of rank <= 2."""
    x = b.tensor(node.args[0])
    _permute_copy(b, b.tensor(node.args[-1]), x, list(reversed(range(x.ndim))))


def _t_rule(node: NodeSpec):
    if node.args[0].rank > 2:
        return f"t of a rank-{node.args[0].rank} tensor (t takes rank <= 2)"
    return None


def _permute_copy(b, out, x, perm):
    # Output dims that stay neighbours in the input (perm[i + 1] == perm[i] + 1) merge.
    groups: list[list[int]] = []
    for i, p in enumerate(perm):
        if groups and perm[groups[-1][-1]] + 1 == p:
            groups[-1].append(i)
        else:
            groups.append([i])

    def plan():
        in_strides = contiguous_strides(x.shape)
        out_strides = contiguous_strides(out.shape)
        return merged(CopyPlan([CopyDim(out.shape[i], out_strides[i], in_strides[p])
                                for i, p in enumerate(perm)]), groups)
    affine_copy(b, out, x, plan)


# ---- expand and repeat ----------------------------------------------------------------
def expand_shape(in_shape, sizes) -> tuple:
    lead = len(sizes) - len(in_shape)
    if lead < 0:
        raise VkDelegateError(f"expand of {list(in_shape)} to fewer dims {list(sizes)}")
    out = []
    for i, s in enumerate(sizes):
        src = in_shape[i - lead] if i >= lead else None
        if s == -1:
            if src is None:
                raise VkDelegateError("expand: -1 is not allowed in a new leading dim")
            s = src
        elif src is not None and src != 1 and src != s:
            raise VkDelegateError(f"expand of {list(in_shape)} to {list(sizes)}")
        out.append(int(s))
    return tuple(out)


def _expand_impl(b, node):
    x_id, _sizes_id, _implicit_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)

    def plan():
        lead = out.ndim - x.ndim
        in_strides = contiguous_strides(x.shape)
        out_strides = contiguous_strides(out.shape)
        dims = []
        for i, s in enumerate(out.shape):
            j = i - lead
            stride = in_strides[j] if j >= 0 and x.shape[j] != 1 else 0
            dims.append(CopyDim(s, out_strides[i], stride))
        return CopyPlan(dims)
    affine_copy(b, out, x, plan)


def repeat_shape(in_shape, repeats) -> tuple:
    lead = len(repeats) - len(in_shape)
    if lead < 0:
        raise VkDelegateError(f"repeat: {len(repeats)} repeats for rank {len(in_shape)}")
    padded = (1,) * lead + tuple(in_shape)
    return tuple(p * r for p, r in zip(padded, repeats))


def _repeat_impl(b, node):
    x_id, _repeats_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)

    def plan():
        lead = out.ndim - x.ndim
        padded = (1,) * lead + tuple(x.shape)
        in_strides = contiguous_strides(padded)
        out_strides = contiguous_strides(out.shape)
        return CopyPlan([CopyDim(s, out_strides[i], in_strides[i], mode=MODULO,
                                 bound=padded[i]) for i, s in enumerate(out.shape)])
    affine_copy(b, out, x, plan)


# ---- slice, select, flip ------------------------------------------------------------
def _slice_shape(args):
    x, dim, start, end, step = args
    shape = list(x.shape)
    d = wrap_dim(dim, len(shape))
    shape[d] = slice_bounds(shape[d], start, end, step)[1]
    return tuple(shape)


def _slice_impl(b, node):
    x_id, dim_id, start_id, end_id, step_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    dim = wrap_dim(b.scalar(dim_id), x.ndim)
    step = b.scalar(step_id)

    def plan():
        # start and end may be SymInts: read their current numbers at every resize.
        start, _ = slice_bounds(x.shape[dim], b.scalar(start_id), b.scalar(end_id), step)
        in_strides = contiguous_strides(x.shape)
        out_strides = contiguous_strides(out.shape)
        dims = [CopyDim(s, out_strides[i], in_strides[i]) for i, s in enumerate(out.shape)]
        dims[dim].start, dims[dim].step = start, step
        return merged(CopyPlan(dims), around(x.ndim, dim))
    affine_copy(b, out, x, plan)


def _slice_rule(node: NodeSpec):
    step = node.args[4]
    if not isinstance(step, int) or step <= 0:
        return f"slice step {step} (must be a positive int)"
    for bound in node.args[2:4]:
        if bound is not None and not isinstance(bound, int):
            return "slice bounds that are not ints"
    return None


def _select_shape(args):
    x, dim, _index = args
    shape = list(x.shape)
    del shape[wrap_dim(dim, len(shape))]
    return tuple(shape)


def _select_impl(b, node):
    x_id, dim_id, index_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    dim = wrap_dim(b.scalar(dim_id), x.ndim)

    def plan():
        index = b.scalar(index_id)  # may be a SymInt: its current number
        size = x.shape[dim]
        if not -size <= index < size:
            raise VkDelegateError(f"select: index {index} out of range for dim {dim} "
                                  f"of size {size}")
        in_strides = contiguous_strides(x.shape)
        del in_strides[dim]
        out_strides = contiguous_strides(out.shape)
        plan = CopyPlan([CopyDim(s, out_strides[i], in_strides[i])
                         for i, s in enumerate(out.shape)])
        plan.in_offset = (index % size) * contiguous_strides(x.shape)[dim]
        # out dims before the selected one, and after it, are each contiguous in x
        groups = [g for g in (list(range(dim)), list(range(dim, out.ndim))) if g]
        return merged(plan, groups)
    affine_copy(b, out, x, plan)


def _flip_impl(b, node):
    x_id, dims_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    # A 0-d tensor accepts dim 0 (or -1) and flips to itself.
    flipped = {wrap_dim(d, x.ndim) for d in b.int_list(dims_id)} if x.ndim else set()

    def plan():
        strides = contiguous_strides(x.shape)
        dims = [CopyDim(s, strides[i], strides[i]) for i, s in enumerate(x.shape)]
        for d in flipped:
            dims[d].start, dims[d].step = x.shape[d] - 1, -1
        return merged(CopyPlan(dims), runs([d not in flipped for d in range(x.ndim)]))
    affine_copy(b, out, x, plan)


def _op(name, impl, shape_fn, *rules, notes="", symbolic=()):
    register(OpSpec(name=name, dtypes=MOVE_DTYPES, impl=impl, shape_fn=shape_fn,
                    rules=(same_dtype,) + rules, notes=notes,
                    symbolic_args=frozenset(symbolic), may_alias=impl is _flat_impl))


_op("aten.view.default", _flat_impl, shape_from_list(view_shape), symbolic=(1,),
    notes="alias (no copy) or copy; reshape, flatten, unflatten; symbolic sizes")
_op("aten._unsafe_view.default", _flat_impl, shape_from_list(view_shape), symbolic=(1,),
    notes="alias or copy (reshape of a copy); symbolic sizes")
_op("aten.squeeze.dims", _flat_impl, shape_from_list(squeeze_shape), _squeeze_rule,
    notes="alias or copy")
_op("aten.unsqueeze.default", _flat_impl, _unsqueeze_shape, notes="alias or copy")
_op("aten.permute.default", _permute_impl, _permute_shape,
    notes="copy; transpose, t, movedim")
_op("aten.expand.default", _expand_impl, shape_from_list(expand_shape), symbolic=(1,),
    notes="broadcast copy; symbolic sizes")
_op("aten.repeat.default", _repeat_impl, shape_from_list(repeat_shape),
    notes="tiled copy")
_op("aten.slice.Tensor", _slice_impl, _slice_shape, _slice_rule, symbolic=(2, 3),
    notes="any step > 0, bounds clamped as ATen (symbolic too); narrow")
# ---- vkdelegate.narrow_last -----------------------------------------------------------
NARROW_LAST = "vkdelegate.narrow_last.default"


def _narrow_last_shape(args):
    return tuple(args[0].shape[:-1]) + (args[2],)


def _narrow_last_rule(node: NodeSpec):
    x, start, length = node.args[:3]
    if x.rank < 1:
        return "narrow_last of a 0-d tensor"
    for name, v in (("start", start), ("length", length)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return f"narrow_last {name} {v!r} (must be an int >= 0)"
    if x.dynamic and x.dynamic[-1]:
        return "narrow_last of a dynamic last dim"
    if start + length > x.shape[-1]:
        return f"narrow_last [{start}, {start + length}) of a last dim of {x.shape[-1]}"
    return None


def _narrow_last_impl(b, node):
    """No dispatch when the runtime bound the output inside the input's memory at the
    part's byte offset (``GraphValues`` does that for a contiguous part whose memory
    planning aliased it, the only way both share a region); else one affine copy."""
    x_id, start_id, _length_id, out_id = node.args
    x, out = b.tensor(x_id), b.tensor(out_id)
    if x.buffer.region == out.buffer.region:
        return
    copy_last_part(b, out, x, b.scalar(start_id))


register(OpSpec(name=NARROW_LAST, dtypes=frozenset({"float32", "float16"}),
                impl=_narrow_last_impl, shape_fn=_narrow_last_shape,
                rules=(same_dtype, _narrow_last_rule), may_alias=True,
                notes="a merged linear's part: alias at an offset (no copy) where "
                      "contiguous, else copy"))


_op("aten.select.int", _select_impl, _select_shape, symbolic=(2,),
    notes="negative index (also on a resized dim), symbolic index")
_op("aten.flip.default", _flip_impl, same_shape, notes="any set of dims")

# ExecuTorch's edge dialect names the view ops' copying variants (view_copy, ...); ET-VK
# blobs carry those names, with the same schemas. They share the declarations above.
ET_COPY_NAMES = {
    "aten.view_copy.default": "aten.view.default",
    "aten.squeeze_copy.dims": "aten.squeeze.dims",
    "aten.unsqueeze_copy.default": "aten.unsqueeze.default",
    "aten.permute_copy.default": "aten.permute.default",
    "aten.expand_copy.default": "aten.expand.default",
    "aten.slice_copy.Tensor": "aten.slice.Tensor",
    "aten.select_copy.int": "aten.select.int",
}
_op("aten.t_copy.default", _t_impl, lambda args: tuple(reversed(args[0].shape)), _t_rule,
    notes="ExecuTorch name: transpose of rank <= 2")
for _et_name, _name in ET_COPY_NAMES.items():
    register(dataclasses.replace(REGISTRY[_name], name=_et_name,
                                 notes=f"ExecuTorch name of {_name}"))
