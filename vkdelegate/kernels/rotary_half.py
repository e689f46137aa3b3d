"""What the HF-style rotary kernels share (rotary_half.glsl, rotary_half_pair.glsl and
rotary_scatter_pair.glsl, through shaders/glsl/rotary_half.h): the cos/sin broadcast
strides and the rule on (q, k, cos, sin). Used by ops/families/rotary.py and
cache_update.py (vkdelegate.rotary_index_put_pair). Torch-free; registers no op.
"""
from __future__ import annotations

from typing import Optional


def broadcast_strides(shape, to) -> list:
    """Element strides of a contiguous tensor of ``shape`` along the 4 dims of ``to``
    (both padded with leading 1s to rank 4), 0 along a broadcast dim."""
    shape = (1,) * (4 - len(shape)) + tuple(shape)
    to = (1,) * (4 - len(to)) + tuple(to)
    strides, step = [0] * 4, 1
    for d in range(3, -1, -1):
        strides[d] = step if shape[d] != 1 or to[d] == 1 else 0
        step *= shape[d]
    return strides


def padded_sizes(shape) -> list:
    """``shape`` padded with leading 1s to rank 4 (the kernels' sizes vectors)."""
    return list((1,) * (4 - len(shape)) + tuple(shape))


def pair_reason(q, k, cos, sin) -> Optional[str]:
    """Why rotary_half of q and k (TensorSpecs) by one cos/sin cannot run on the pair
    kernels, or None: q and k of rank 1-4 with one dtype and an even last dim, cos and
    sin of one dtype and sizes that broadcast to both."""
    for x in (q, k):
        if not 1 <= x.rank <= 4 or x.shape[-1] % 2:
            return f"q/k of sizes {list(x.shape)} (rank 1-4, even last dim)"
    if q.dtype != k.dtype or q.shape[-1] != k.shape[-1]:
        return f"q {list(q.shape)} and k {list(k.shape)} need one dtype and last dim"
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.rank > min(q.rank, k.rank):
        return "cos and sin must have one dtype and sizes of at most q's and k's rank"
    for x in (q, k):
        padded = (1,) * (x.rank - cos.rank) + tuple(cos.shape)
        if any(c not in (1, s) for c, s in zip(padded, x.shape)) or padded[-1] != x.shape[-1]:
            return f"cos/sin of sizes {list(cos.shape)} do not broadcast to {list(x.shape)}"
    return None
