"""cat and split_with_sizes (torch.split, chunk and stack export to these, with views).

cat is one affine copy per input into its slab of the output; split_with_sizes is one
affine copy per output, and its output is a ValueList. ATen's legacy rule that cat
skips 1-D empty tensors of any other shape is kept.
"""
from __future__ import annotations

from vkdelegate.kernels.affine_copy import (MOVE_DTYPES, CopyDim, CopyPlan, affine_copy,
                                            around, contiguous_strides, merged)
from vkdelegate.kernels.dims import wrap_dim
from vkdelegate.kernels.rules import same_dtype
from vkdelegate.ops.registry import OpSpec, register
from vkdelegate.errors import VkDelegateError


def _skipped(shape, out_ndim: int) -> bool:
    """ATen's cat ignores 1-D tensors of size 0 whatever the other ranks are."""
    return len(shape) == 1 and shape[0] == 0 and out_ndim != 1


def cat_shape(shapes, dim: int) -> tuple:
    """Sizes of cat(tensors of ``shapes``, dim)."""
    used = [tuple(s) for s in shapes if not (len(s) == 1 and s[0] == 0)] or \
        [tuple(shapes[0])]
    ref = used[0]
    d = wrap_dim(dim, len(ref))
    total = 0
    for s in used:
        if len(s) != len(ref) or any(a != b for i, (a, b) in enumerate(zip(s, ref))
                                     if i != d):
            raise VkDelegateError(f"cat: sizes {[list(x) for x in shapes]} do not match "
                                  f"outside dim {dim}")
        total += s[d]
    out = list(ref)
    out[d] = total
    return tuple(out)


def _cat_shape(args):
    return cat_shape([t.shape for t in args[0]], args[1])


def _cat_impl(b, node):
    list_id, dim_id, out_id = node.args
    inputs, out = b.value(list_id), b.tensor(out_id)
    if not isinstance(inputs, list) or not all(hasattr(t, "buffer") for t in inputs):
        raise b.error("cat expects a list of tensors")
    dim = wrap_dim(b.scalar(dim_id), out.ndim)
    for k, x in enumerate(inputs):
        if _skipped(x.max_shape, out.ndim):
            continue

        def plan(k=k, x=x):
            out_strides = contiguous_strides(out.shape)
            in_strides = contiguous_strides(x.shape)
            offset = sum(t.shape[dim] for t in inputs[:k] if not _skipped(t.shape,
                                                                          out.ndim))
            p = CopyPlan([CopyDim(s, out_strides[i], in_strides[i])
                          for i, s in enumerate(x.shape)])
            p.out_offset = offset * out_strides[dim]
            return merged(p, around(out.ndim, dim))
        affine_copy(b, out, x, plan)


def _split_shape(args):
    x, sizes, dim = args
    d = wrap_dim(dim, len(x.shape))
    if sum(sizes) != x.shape[d]:
        raise VkDelegateError(f"split_with_sizes: sizes {list(sizes)} do not add up to "
                              f"{x.shape[d]}")
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[d] = s
        out.append(tuple(shape))
    return out


def _split_tensor_shape(args):
    """split.Tensor(self, split_size, dim): pieces of split_size, the last smaller."""
    x, split_size, dim = args
    size = x.shape[wrap_dim(dim, len(x.shape))]
    if split_size <= 0:
        raise VkDelegateError(f"split: split_size {split_size} must be positive")
    sizes = [min(split_size, size - k) for k in range(0, size, split_size)] or [0]
    return _split_shape([x, sizes, dim])


def _split_impl(b, node):
    x_id, sizes_id, dim_id, out_id = node.args
    x, outs = b.tensor(x_id), b.value(out_id)
    dim = wrap_dim(b.scalar(dim_id), x.ndim)
    for k, out in enumerate(outs):
        def plan(k=k, out=out):
            out_strides = contiguous_strides(out.shape)
            in_strides = contiguous_strides(x.shape)
            offset = sum(t.shape[dim] for t in outs[:k])
            p = CopyPlan([CopyDim(s, out_strides[i], in_strides[i])
                          for i, s in enumerate(out.shape)])
            p.in_offset = offset * in_strides[dim]
            return merged(p, around(x.ndim, dim))
        affine_copy(b, out, x, plan)


register(OpSpec(name="aten.cat.default", dtypes=MOVE_DTYPES, impl=_cat_impl,
                shape_fn=_cat_shape, rules=(same_dtype,), notes="any dim; stack"))
for _name, _notes in (("aten.split_with_sizes.default", "ValueList output; split, chunk"),
                      # ExecuTorch's edge-dialect name, found in ET-VK blobs.
                      ("aten.split_with_sizes_copy.default", "ExecuTorch name")):
    register(OpSpec(name=_name, dtypes=MOVE_DTYPES, impl=_split_impl,
                    shape_fn=_split_shape, rules=(same_dtype,), notes=_notes))
# ExecuTorch keeps split.Tensor (torch.export decomposes it to split_with_sizes).
register(OpSpec(name="aten.split.Tensor", dtypes=MOVE_DTYPES, impl=_split_impl,
                shape_fn=_split_tensor_shape, rules=(same_dtype,),
                notes="ExecuTorch name: equal pieces, the last smaller"))
