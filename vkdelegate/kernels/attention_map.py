"""The block map of a boolean attention mask (sdpa_tile_map.glsl), as
kernels/attention.py dispatches it before an attention kernel with TILE_MAP.

Why: with a boolean mask the block-sparse early exit used to vote per key tile inside
the attention kernel (every invocation read its mask bytes of the tile, an atomic OR
and a barrier) for every tile, dead or live, and again for every head the mask is
broadcast over: at 8192 tokens with a sliding window of 1024 keys, 224 of 256 tiles
per query block are dead, and the vote cost four times the live tiles' math on the
H200 (12.2 ms against 3.05 for the same window as the op's parameter; docs/PERF.md).
Now one small dispatch per run reads the mask once (per mask plane, not per head) and
writes per (mask plane, query block, key tile) a "live" and a "full" bit (FlexAttention's
block masks, for one fixed block shape); the kernel narrows its tile range to the first
and last live tiles of its query block, skips dead tiles between with one uniform
branch and no barrier, and reads no mask bytes of a full tile. Exact: the bits are
computed over the rows, keys and heads the consuming workgroup covers, so a tile the
map calls dead is one the vote called dead.

The map is a node-owned scratch tensor (``NodeBuilder.temporary``, as the sampler's
partial keys between its two dispatches), sized at load for the upper-bound shapes;
its strides (``attention.MAP_PARAMS``: the query blocks and words per map row at those
shapes) never change, and after a resize the map dispatch, which reads the current
sizes from the same metadata and sdpa_block buffers as the kernel, fills the part the
kernel reads. Torch-free; registers no op.
"""
from __future__ import annotations

from vkdelegate.kernels import attention as at
from vkdelegate.runtime.dtypes import storage_defines
from vkdelegate.runtime.param_block import tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings

SHADER = "sdpa_tile_map"
#: Invocations per workgroup (the shader's WG); one workgroup per map word of 32 tiles.
WG = 256
#: Key tiles per map word.
WORD_TILES = 32
#: The map's words must index as int32 in the shaders.
MAX_WORDS = (1 << 31) - 1


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("map_data",), inputs=("mask_data",),
                    params=tuple(map(tensor_meta_block, ("mask_meta", "q_meta", "k_meta")))
                    + (at.SDPA_PARAMS, at.MAP_PARAMS))


def defines(mask, seq_first: bool) -> dict:
    """The sdpa_tile_map.glsl defines: the boolean mask's storage (a runtime Tensor or a
    (graph, device) dtype pair) and the query / key layout."""
    d = storage_defines(MASK=mask)
    if seq_first:
        d["SEQ_FIRST"] = "1"
    return d


def extent(mask_shape, l_max: int, s_max: int, *, rows: int, keys: int,
           heads: int) -> tuple[int, int, int]:
    """(mask planes, query blocks, words per map row) of the map for a mask of
    (upper-bound) sizes ``mask_shape`` (rank <= 4, broadcast to [B, H, L, S]), ``l_max``
    queries and ``s_max`` keys, blocks of ``rows`` x ``keys`` and ``heads`` query heads
    per workgroup: the mask's batch times its head groups, one plane where a dim
    broadcasts."""
    dims = (1,) * (4 - len(mask_shape)) + tuple(mask_shape)
    planes = dims[0] * -(-dims[1] // heads)
    tiles = -(-s_max // keys)
    return planes, -(-l_max // rows), -(-tiles // WORD_TILES)


def dispatch(b, a, params, *, rows: int, keys: int, heads: int) -> tuple:
    """Record sdpa_tile_map.glsl for attention ``a`` (an attention.Attention with a
    boolean mask) with the node's sdpa_block parameters ``params`` (the key count,
    kept current on resize): blocks of ``rows`` query rows x ``keys`` keys (a multiple
    of 4, at most 32) x ``heads`` query heads, the consuming kernel's workgroup.
    Returns (the map tensor, its MAP_PARAMS buffer) for the kernel's dispatch.
    Raises through ``b.error`` (a device limit) when the map would need more words than
    an int32 indexes."""
    if keys % 4 or not 4 <= keys <= 32:
        raise b.error(f"block map of {keys} keys per tile: a multiple of 4 up to 32")
    seq = -3 if a.seq_first else -2
    l_max, s_max = a.q.max_shape[seq], a.k.max_shape[seq]
    planes, blocks, words = extent(a.mask.max_shape, l_max, s_max, rows=rows, keys=keys,
                                   heads=heads)
    total = 2 * planes * blocks * words
    if total > MAX_WORDS:
        raise b.error(f"the boolean mask's block map needs {total} words (at most "
                      f"{MAX_WORDS})", limit=True)
    tile_map = b.temporary((max(total, 1),), "int32")
    map_params = b.params(at.MAP_PARAMS.pack(map_block=[rows, keys, heads, 0],
                                             map_extent=[blocks, words, 0, 0]))
    b.dispatch(SHADER, defines(a.mask, a.seq_first), outputs=[tile_map], inputs=[a.mask],
               params=[a.mask.meta, a.q.meta, a.k.meta, params, map_params],
               global_size=(words * WG, blocks, planes), local_size=(WG, 1, 1))
    return tile_map, map_params
