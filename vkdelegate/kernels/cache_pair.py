"""The paired K/V cache writes of a decoder layer (vkdelegate.index_put_pair,
rotary_index_put_pair and the rotary_cache ops: ops/families/cache_update.py,
quantized_linear.py): where an index_put writes (``one_index``, the range message of
its error flag), the load rules of index_put and of the pair, ``PairRegion`` (the two
destinations' copies, the error flag and the written region's sizes), and
rotary_scatter_pair.glsl's dispatch (``rotary_scatter``: q rotated, k rotated and v
written into the caches; also the unfused form of the rotary_cache ops). Shared here
because op families do not import each other. Torch-free; registers no op.
"""
from __future__ import annotations

import math

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.affine_copy import copy_destination
from vkdelegate.kernels.rotary_half import broadcast_strides, padded_sizes
from vkdelegate.ops.registry import NodeSpec, TensorSpec
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

INDEX_DTYPES = frozenset({"int64", "int32"})


def one_index(indices):
    """(dim, index tensor) of an index_put indices list holding exactly one tensor."""
    dims = [d for d, t in enumerate(indices) if t is not None]
    if len(dims) != 1:
        raise VkDelegateError(f"index_put with {len(dims)} index tensors (1 is supported)")
    return dims[0], indices[dims[0]]


def range_message(x, dim: int, negative: bool):
    """The error-flag message of an index out of range for ``dim`` of x (``negative``:
    -size..-1 accepted too), for the sizes when it is raised."""
    def message():
        size = x.shape[dim]
        valid = f"{-size}..{size - 1}" if negative else f"0..{size - 1}"
        return f"an index is out of range for dim {dim} of size {size} (valid: {valid})"
    return message


def fits(src_shape, region) -> bool:
    """``src`` can fill ``region`` element for element (equal sizes, leading 1s aside)
    or is one element (broadcast)."""
    shape, region = list(src_shape), list(region)
    while shape and shape[0] == 1 and len(shape) > len(region):
        shape.pop(0)
    while region and region[0] == 1 and len(region) > len(shape):
        region.pop(0)
    return math.prod(src_shape) == 1 or shape == region


def region_reason(src: TensorSpec, region, what: str):
    """None where ``src`` fits ``region``, else why not."""
    if fits(src.shape, region):
        return None
    return (f"{what} of sizes {list(src.shape)} for a region of sizes {list(region)} "
            f"(only equal sizes or one element are supported)")


def index_put_rule(node: NodeSpec):
    """aten.index_put's load rule (accumulate=False, one index tensor of an int dtype,
    values filling the region or one element)."""
    x, indices, values, accumulate = node.args[:4]
    if accumulate:
        return "accumulate=True"
    if any(t is not None and not isinstance(t, TensorSpec) for t in indices):
        return "an index that is not a tensor"
    try:
        dim, index = one_index(indices)
    except VkDelegateError as exc:
        return str(exc)
    if index.dtype not in INDEX_DTYPES:
        return f"index of dtype {index.dtype} (bool masks stay on the CPU)"
    if dim >= x.rank:
        return f"index on dim {dim} of a rank-{x.rank} tensor"
    # ATen's region: x.shape[:dim] + index.shape + x.shape[dim+1:]; we write it flat.
    region = tuple(x.shape[:dim]) + tuple(index.shape) + tuple(x.shape[dim + 1:])
    flat = tuple(x.shape[:dim]) + (math.prod(index.shape),) + tuple(x.shape[dim + 1:])
    if not (fits(values.shape, region) or fits(values.shape, flat)):
        return region_reason(values, region, "values")
    return None


class PairRegion:
    """The two destinations of a paired cache write (index_put_pair,
    rotary_index_put_pair, the rotary_cache ops): their whole copies recorded
    (dropped where the cache is state updated in place), the error flag, and the
    written region's sizes for the current shapes (scatter_pair.h's (numel, inner,
    count, size of the dim))."""

    def __init__(self, b, x, x2, out, out2, indices):
        try:
            self.dim, self.index = one_index(indices)
        except VkDelegateError as exc:
            raise b.error(str(exc)) from None
        copy_destination(b, out, x)
        copy_destination(b, out2, x2)
        self.flag = b.error_flag(range_message(x, self.dim, True))
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


def index_put_pair_rule(node: NodeSpec):
    """vkdelegate.index_put_pair's load rule (self, self2, indices, values, values2):
    two destinations of one dtype and sizes, values of theirs filling the region
    (one element each), each write an index_put's."""
    x, x2, indices, values, values2 = node.args[:5]
    if (x.dtype, tuple(x.shape)) != (x2.dtype, tuple(x2.shape)):
        return (f"destinations {x.dtype}{list(x.shape)} and {x2.dtype}{list(x2.shape)} "
                f"differ")
    if (values.dtype, tuple(values.shape)) != (values2.dtype, tuple(values2.shape)):
        return "values of different dtypes or sizes"
    if values.dtype != x.dtype:
        return f"values of dtype {values.dtype} for a destination of {x.dtype}"
    why = index_put_rule(NodeSpec(op="aten.index_put.default",
                                  args=(x, indices, values, False), outputs=node.outputs[:1]))
    if why:
        return why
    dim, index = one_index(indices)
    region = math.prod(x.shape[:dim]) * math.prod(index.shape) * math.prod(x.shape[dim + 1:])
    if math.prod(values.shape) != region:
        return f"values of sizes {list(values.shape)} (one per element of the region needed)"
    return None


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


def rotary_defines(out, x, freqs, idx) -> dict:
    """rotary_scatter_pair.glsl's defines (Tensors or (graph, device) dtype pairs)."""
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
    b.dispatch(ROTARY_SHADER, rotary_defines(region.out, k, cos, region.index),
               outputs=[out_q, region.out, region.out2, region.flag],
               inputs=[q, k, cos, sin, values2, region.index], params=[params],
               global_size=(max(total, 1),), local_size=b.local_size_1d(total),
               grid=lambda: (math.prod(shapes()[0]) + 2 * region.numel(),))


def _rotary_variant(profile, dtype: str, freqs: str, index: str) -> dict:
    x = (dtype, device_dtype(dtype, profile))
    return rotary_defines(x, x, (freqs, device_dtype(freqs, profile)),
                          (index, device_dtype(index, profile)))


declare_grid(ROTARY_SHADER, _rotary_variant, profile=STORAGE_PROFILES, dtype=ROTARY_DTYPES,
             freqs=ROTARY_DTYPES, index=INDEX_DTYPES)
