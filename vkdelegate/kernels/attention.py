"""The fused attention kernels as op families dispatch them.

Shared by ``ops/families/sdpa.py`` (aten.scaled_dot_product_attention, et_vk.sdpa) and
``ops/families/sdpa_kv.py`` (ExecuTorch's llama.custom_sdpa, llama.sdpa_with_kv_cache,
vkdelegate.sliding_window_sdpa). An op builds an ``Attention`` (its tensors and mask
kind) and calls ``dispatch``; this module picks the kernel, the head-dim bucket, the
tile sizes and the block-sparse early exit (compile option ``sdpa_skip_masked_tiles``,
default on; exact). Kernels: for prefill (``use_tiled``: >= TILED_MIN_L queries, head
dims <= TILED_MAX_D) sdpa_tiled.glsl, or for float16 on devices with cooperative
matrices sdpa_coopmat.glsl (``coop_fits``; compile option ``sdpa_cooperative_matrix``),
or where VK_NV_cooperative_matrix2 allows it and there is no mask tensor or window
sdpa_coopmat_wg.glsl (``coop2_fits``);
else sdpa.glsl (one query row per invocation: decode, with the split-K / flash decoding
form and its combine pass sdpa_combine.glsl for few queries over many keys, grouped-query
heads packed per workgroup, head dim 256). With a boolean mask and the early exit, a
dispatch of sdpa_tile_map.glsl first makes the mask's block map for the kernel's
workgroup shape (kernels/attention_map.py; not for sdpa_decode.glsl). The variant grids
are in kernels/attention_variants.py. Torch-free; registers no op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from vkdelegate.kernels import gemm_core, loop_limit
from vkdelegate.runtime.dtypes import device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings

SHADER = "sdpa"
COMBINE = "sdpa_combine"
#: The tiled prefill kernel (sdpa_tiled.glsl): BM query rows per workgroup of WG
#: invocations, for at least TILED_MIN_L queries and head dims up to TILED_MAX_D (its
#: query block and K/V tile in shared memory, within TILED_SHARED_BYTES).
TILED = "sdpa_tiled"
TILED_WG = 64
TILED_BM = 32
TILED_MIN_L = 16
TILED_MAX_D = 128
#: 32 KiB: what llvmpipe, NVIDIA (48), AMD and Intel (64) offer as
#: maxComputeSharedMemorySize; the 16 KiB minimum of the spec would need sdpa.glsl.
TILED_SHARED_BYTES = 32768
#: The float16 prefill kernel on cooperative matrices (sdpa_coopmat.glsl): 64 query
#: rows per workgroup of four 32-invocation subgroups, 16 x 16 x 16 fp16 products
#: with fp32 accumulators; the compile option COOP_OPTION (default on) switches it off.
COOP = "sdpa_coopmat"
COOP_WG = 128
COOP_BM = 64
COOP_BN = 32  # keys per tile (the shader's BN)
#: Shared K / V buffers of sdpa_coopmat.glsl: 1 loads a tile then computes (two
#: barriers a tile), 2 loads the next tile into registers while the current one's
#: products run (one barrier). On an H100 (2026-12-05, docs/PERF.md) 1 was the faster,
#: 0.595 against 0.630 ms at 2048 causal tokens (32 x 128 heads): 2's prefetch
#: registers take it from 228 to 242 registers an invocation, two workgroups an SM
#: either way. Both pass the coopmat tests there.
COOP_STAGES = 1
#: Causal sdpa_coopmat.glsl forms take their query blocks last-first across the heads
#: (the longest rows first), so that the dispatch ends on short ones.
COOP_HEAVY_FIRST = True
COOP_REQUIRES = ("cooperativeMatrix", "shaderFloat16", "storageBuffer16BitAccess")
COOP_OPTION = "sdpa_cooperative_matrix"
#: Whether boolean masks may run sdpa_coopmat.glsl (else sdpa_tiled.glsl). Its boolean
#: forms with the early exit were wrong on the H200 (driver 580.159: 98.5% of a
#: [1, 1, 320, 320] window mask's outputs) because the 12-byte shared vote array
#: tile_live[3] left the shared arrays after it off the 16-byte alignment cooperative-
#: matrix loads and stores need (the shader's comment, docs/PERF.md); the vote has
#: since given way to the mask's block map (TILE_MAP, kernels/attention_map.py), and
#: every shared array is whole 16-byte units (a test checks). With the block-map forms
#: the coopmat, tile-map, block-sparse and sdpa test files pass on an H100 with this
#: on (94 tests, 2026-12-05, validation off as cooperative matrices need), and the
#: 8192-token window-1024 boolean prefill takes 3.41 ms there against torch's 3.51 ms
#: (4.93 ms on sdpa_tiled.glsl; docs/PERF.md).
COOP_BOOL_MASK = True
#: The float16 prefill kernel on workgroup-scope cooperative matrices
#: (sdpa_coopmat_wg.glsl, VK_NV_cooperative_matrix2 with glslang 15): COOP2_BR query
#: rows per workgroup, tiles of COOP2_BC keys, head-dim buckets COOP2_D; for what
#: it covers (``coop2_fits``: [B, H, L, D] tensors without a mask tensor or window)
#: in place of sdpa_coopmat.glsl while COOP2_ENABLED is on (a benchmark form:
#: attention.COOP2_ENABLED=false).
COOP2 = "sdpa_coopmat_wg"
#: H100 (2026-12-06, benchmarks/sdpa.py --prefill --filter "2048 causal", 32 / 8 heads
#: x 128, fp16, 256 invocations): BR 128 x BC 64 0.235 ms (146 TFLOP/s); BR 64: 0.42-0.52
#: (67-82); BR 32: 0.52; BC 32 (BR 128 / 64): 0.251 / 0.46; BC 128: 1.76 (the S, M and
#: L matrices spill); 2 or 4 tiles per iteration: 0.24 (BR 128), 1.9-2.1 (BR 64).
COOP2_BR = 128
COOP2_BC = 64
COOP2_UNROLL = 1  # key tiles per loop iteration (the shader's UNROLL)
COOP2_D = (64, 128)
COOP2_ENABLED = True
#: The workgroup-scope GEMM's features, and row reductions and the accumulator -> A
#: conversion of P.
COOP2_REQUIRES = gemm_core.COOPMAT_WG_REQUIRES + (
    "cooperativeMatrixReductions", "cooperativeMatrixConversions")
#: Head-dim buckets (the shader's D_MAX): q/acc registers and tile rows are padded up.
D_BUCKETS = (32, 64, 128, 256)
MAX_HEAD_DIM = D_BUCKETS[-1]
#: Head-dim buckets up to which q and the accumulator stay in registers (the head-dim
#: loops unrolled): on CPU drivers (llvmpipe's LLVM took 15 s to compile D 64, minutes
#: for 256) and on GPUs (past 128 the registers spill anyway).
UNROLLED_D = {"cpu": 32, "gpu": 128}
BLOCK_M = 32  # query rows per workgroup (one per invocation)
#: Shared memory per workgroup: a K and a V tile of BLOCK_N x D_MAX fp32 each, within
#: the 16 KiB every Vulkan device offers (maxComputeSharedMemorySize's minimum).
SHARED_FLOATS = 4096
#: Split-K (flash decoding): used when the query blocks x heads x batch give fewer
#: than SPLIT_TARGET workgroups; enough splits to reach it, each of at least
#: SPLIT_MIN_TILES key tiles, at most MAX_SPLITS (the combine pass loops over them).
SPLIT_TARGET = 1024
SPLIT_MIN_TILES = 2
MAX_SPLITS = 64
#: Head-dim buckets from which a float16 query is held as packed fp16 pairs (Q_HALF in
#: sdpa.glsl: exact, half the registers; the fp32 q and accumulator of a row are 256
#: registers at 128, past the 255 an NVIDIA thread has).
HALF_Q_D = 128
#: The compile option (backend/options.py) that switches the early exit off.
SKIP_OPTION = "sdpa_skip_masked_tiles"
#: int32 "no limit" for the key count.
NO_LIMIT = (1 << 31) - 1

SDPA_PARAMS = ParamBlock("sdpa_block", [("scale", "vec4"), ("pos", "ivec4"),
                                        ("split", "ivec4")])
#: The block map of a boolean mask (TILE_MAP; kernels/attention_map.py): map_block =
#: (query rows, keys, query heads per workgroup, 0) of one map block, map_extent =
#: (query blocks, uint words per map row, 0, 0) at the upper-bound shapes.
MAP_PARAMS = ParamBlock("tile_map_block", [("map_block", "ivec4"),
                                              ("map_extent", "ivec4")])
COMBINE_PARAMS = ParamBlock("combine_block", [("splits", "ivec4")])


def block_n(d_max: int) -> int:
    """Keys per tile for head-dim bucket ``d_max``: 2 x BLOCK_N x d_max floats of
    shared memory, at most 32 keys (a tile's scores are a register array and its mask
    bits one uint)."""
    return min(32, SHARED_FLOATS // (2 * d_max))


def d_step(d_max: int, cpu: bool) -> int:
    """vec4s of a head dim per iteration of the shader's head-dim loops: all of them
    (unrolled, in registers) up to UNROLLED_D, else 4 (see sdpa.glsl). cpu: the device
    is a CPU driver (DeviceInfo.type "cpu")."""
    return d_max // 4 if d_max <= UNROLLED_D["cpu" if cpu else "gpu"] else 4


def iterations(s_max: int, d_max: int) -> int:
    """Loop iterations one invocation runs for ``s_max`` keys on llvmpipe (worst case,
    one split): per tile the tile loop, the mask-bit loop and two loops over its keys,
    each key's loops over the head dims when those are not unrolled; the scan of a
    boolean mask's block map (a word per 32 tiles, TILE_MAP)."""
    bn, d4, step = block_n(d_max), d_max // 4, d_step(d_max, cpu=True)
    per_key = 1 if step == d4 else 1 + d4 // step
    tiles = -(-s_max // bn)
    return tiles * (bn + 2 * bn * per_key + 1) + -(-tiles // 32)


def d_bucket(e: int, ev: int) -> int:
    """The smallest D_BUCKETS entry >= both head dims."""
    return next(d for d in D_BUCKETS if d >= max(e, ev))


def pack_for(q_heads: int, kv_heads: int) -> int:
    """Query heads per workgroup: Hq / Hk (grouped-query attention, each K/V tile read
    once for all of them) when that is a power of two up to BLOCK_M, else 1."""
    if kv_heads < 1 or q_heads % kv_heads:
        return 1
    n = q_heads // kv_heads
    return n if n <= BLOCK_M and n & (n - 1) == 0 else 1


def splits_for(l_max: int, heads: int, batch: int, s_max: int, d_max: int,
               pack: int = 1) -> int:
    """Key splits for these upper-bound sizes (``pack`` query heads per workgroup): 1
    (no split) unless the query blocks leave the device idle and the keys are many
    (see SPLIT_TARGET)."""
    groups = -(-l_max // (BLOCK_M // pack)) * (heads // pack) * batch
    tiles = -(-s_max // block_n(d_max))
    if groups >= SPLIT_TARGET:
        return 1
    n = min(MAX_SPLITS, tiles // SPLIT_MIN_TILES, -(-SPLIT_TARGET // groups))
    return n if n >= 2 else 1


@shader_bindings(COOP)
@shader_bindings(COOP2)
@shader_bindings(TILED)
@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    mask = "MASK_BOOL" in d or "MASK_FLOAT" in d
    tile_map = "TILE_MAP" in d
    metas = ("out_meta", "q_meta", "k_meta", "v_meta") + (("mask_meta",) if mask else ())
    texels = ()
    if "KV_TEXEL" in d:
        texels = (("k_data", _kv_format(d["K_T"])), ("v_data", _kv_format(d["V_T"])))
    return Bindings(outputs=("out_data",),
                    inputs=("q_data", "k_data", "v_data") + (("mask_data",) if mask else ())
                    + (("start_data",) if "POS_TENSOR" in d else ())
                    + (("map_data",) if tile_map else ()),
                    params=tuple(map(tensor_meta_block, metas)) + (SDPA_PARAMS,)
                    + ((MAP_PARAMS,) if tile_map else ()),
                    texels=texels)


def _kv_format(glsl_type: str) -> str:
    """The texel format KV_TEXEL reads K or V through, by its GLSL storage type."""
    return "rgba16f" if glsl_type == "float16_t" else "rgba32f"


def kv_texel_fits(b, k, v) -> bool:
    """Whether sdpa.glsl's KV_TEXEL form can read K and V on the node builder ``b``'s
    device: CPU drivers (texel views: NodeBuilder.texel_input; GPUs keep the staged
    form), both stored as fp32 or fp16, head dims and row strides multiples of 4
    (contiguous tensors: their last dims)."""
    if not getattr(b.device, "texel_inputs", False):
        return False
    if any(t.max_shape[-1] % 4 for t in (k, v)):
        return False
    return all(t.device_dtype in ("float16", "float32")
               and b.texel_input(t, "rgba16f" if t.device_dtype == "float16" else "rgba32f")
               for t in (k, v))


@shader_bindings(COMBINE)
def _combine_bindings(d) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("part_data",),
                    params=(tensor_meta_block("out_meta"), COMBINE_PARAMS))


@dataclass
class Attention:
    """One attention node for ``dispatch``. q, k, v, out, mask: runtime Tensors (mask
    None, bool or of q's dtype); seq_first: [B, L, H, D] layout (ExecuTorch's llama
    ops) instead of [B, H, L, D]; causal; window: sliding window in keys (0: none);
    positions: ``() -> (query position offset, key count)``, called at build and after
    every resize (start_pos read from a SymInt); nan_rows: fully masked rows are NaN
    (et_vk.sdpa) instead of 0 (ATen); start: a one-element int64/int32 runtime Tensor
    whose value, read by the shader on the device (POS_TENSOR), is the query position
    offset instead of positions()' (vkdelegate.sdpa_at)."""

    q: object
    k: object
    v: object
    out: object
    mask: object = None
    scale: Optional[float] = None
    causal: bool = False
    window: int = 0
    seq_first: bool = False
    nan_rows: bool = False
    positions: Optional[Callable[[], tuple]] = None
    start: object = None


def defines(out, q, k, v, mask, *, causal: bool, window: bool, d_max: int, cpu: bool,
            skip: bool, nan_rows: bool = False, seq_first: bool = False,
            split: bool = False, start=None, kv_texel: bool = False) -> dict:
    """The sdpa.glsl defines of one form (tensors: runtime Tensors or (graph, device)
    dtype pairs; ``out`` is the fp32 partial buffer when ``split``; ``start``: the
    start_pos tensor of POS_TENSOR, or None; ``kv_texel``: KV_TEXEL, K and V read as
    uniform texel buffers, CPU drivers: ``kv_texel_fits``)."""
    tensors = dict(OUT=out, Q=q, K=k, V=v)
    if mask is not None:
        tensors["MASK"] = mask
    if start is not None:
        tensors["START"] = start
    # Nothing to skip without a causal, window or boolean mask: one variant, not two.
    boolean = mask is not None and _dtype(mask) == "bool"
    skip = skip and (causal or window or boolean)
    d = storage_defines(**tensors)
    d.update(D_MAX=str(d_max), D_STEP=str(d_step(d_max, cpu)), BLOCK_M=str(BLOCK_M),
             BLOCK_N=str(block_n(d_max)), FULLY_MASKED="NAN_F" if nan_rows else "0.0")
    # TILE_MAP: a boolean mask's live tiles come from its block map (attention_map).
    flags = dict(CAUSAL=causal, WINDOW=window, SEQ_FIRST=seq_first, SPLIT_K=split,
                 SKIP_MASKED_TILES=skip, TILE_MAP=skip and boolean,
                 POS_TENSOR=start is not None,
                 Q_HALF=_dtype(q) == "float16" and d_max >= HALF_Q_D, KV_TEXEL=kv_texel)
    d.update({k: "1" for k, on in flags.items() if on})
    if mask is not None:
        d["MASK_BOOL" if _dtype(mask) == "bool" else "MASK_FLOAT"] = "1"
    return d


def tiled_block_n(d_max: int) -> int:
    """Keys per tile of sdpa_tiled.glsl for head-dim bucket ``d_max`` (a multiple of 8,
    at most 32), the largest whose shared memory fits TILED_SHARED_BYTES."""
    return next(bn for bn in (32, 16, 8) if tiled_shared_bytes(d_max, bn) <= TILED_SHARED_BYTES)


def tiled_shared_bytes(d_max: int, bn: int) -> int:
    """sdpa_tiled.glsl's shared memory in bytes: the query block and one K/V tile
    (rows padded by a vec4), the score tile (rows padded by a vec4), row statistics."""
    return 16 * ((TILED_BM + bn) * (d_max // 4 + 1) + TILED_BM * (bn // 4 + 1)) \
        + 8 * TILED_BM


def tiled_iterations(s_max: int, d_max: int) -> int:
    """Loop iterations one sdpa_tiled.glsl invocation runs on llvmpipe for ``s_max``
    keys: per tile the head-dim loop of the scores, the two softmax passes and the P V
    loop (vec4s of keys), and the tile loop itself; the scan of a boolean mask's block
    map (a word per 32 tiles, TILE_MAP)."""
    bn = tiled_block_n(d_max)
    tiles = -(-s_max // bn)
    return tiles * (d_max // 4 + 3 * (bn // 4) + 1) + -(-tiles // 32)


def use_tiled(l_max: int, d_max: int, shared_bytes: int = 0) -> bool:
    """Whether a node with ``l_max`` queries and head-dim bucket ``d_max`` runs
    sdpa_tiled.glsl (prefill) rather than sdpa.glsl (decode, split-K, head dim 256),
    on a device with ``shared_bytes`` of maxComputeSharedMemorySize (0: not known,
    taken as enough; a device with less than TILED_SHARED_BYTES runs sdpa.glsl,
    which fits the spec's 16 KiB minimum)."""
    return l_max >= TILED_MIN_L and d_max <= TILED_MAX_D and \
        (shared_bytes == 0 or shared_bytes >= TILED_SHARED_BYTES)


def tiled_defines(out, q, k, v, mask, *, causal: bool, window: bool, d_max: int,
                  skip: bool, nan_rows: bool = False, seq_first: bool = False,
                  start=None) -> dict:
    """The sdpa_tiled.glsl defines of one form: sdpa.glsl's (``defines``) without its
    tiling, with the tiled block sizes (WG, BM, BN; SR x SC scores and PR x PC
    accumulator vec4s per invocation: 8 x 8 invocation groups over rows and keys /
    columns)."""
    d = defines(out, q, k, v, mask, causal=causal, window=window, d_max=d_max, cpu=False,
                skip=skip, nan_rows=nan_rows, seq_first=seq_first, start=start)
    for name in ("D_STEP", "BLOCK_M", "BLOCK_N", "Q_HALF", "SPLIT_K"):
        d.pop(name, None)
    bn = tiled_block_n(d_max)
    d.update(WG=str(TILED_WG), BM=str(TILED_BM), BN=str(bn), SR=str(TILED_BM // 8),
             SC=str(bn // 8), PR=str(TILED_BM // 8), PC=str(d_max // 32))
    return d


def coop_defines(out, q, k, v, mask, *, causal: bool, window: bool, d_max: int,
                 skip: bool, nan_rows: bool = False, seq_first: bool = False,
                 start=None) -> dict:
    """The sdpa_coopmat.glsl defines of one form (float16 tensors; as ``defines``
    without its tiling: the block sizes are the shader's own)."""
    d = tiled_defines(out, q, k, v, mask, causal=causal, window=window, d_max=d_max,
                      skip=skip, nan_rows=nan_rows, seq_first=seq_first, start=start)
    for name in ("WG", "BM", "BN", "SR", "SC", "PR", "PC"):
        d.pop(name)
    d["STAGES"] = str(COOP_STAGES)
    if causal and COOP_HEAVY_FIRST:
        d["HEAVY_FIRST"] = "1"
    if d.get("MASK_T") == "uint8_t":  # boolean bytes read as 32-bit words (the shader)
        d["MASK_WORDS"] = "1"
    return d


def coop_fits(info, q, k, v, mask=None) -> bool:
    """Whether sdpa_coopmat.glsl can run on device ``info`` (a DeviceInfo) for these
    tensors: q, k and v stored as float16, a boolean mask only with COOP_BOOL_MASK,
    cooperative matrices with a 16 x 16 x 16 fp16 x fp16 + fp32 shape, fixed
    32-invocation subgroups with shuffles."""
    if mask is not None and _dtype(mask) == "bool" and not COOP_BOOL_MASK:
        return False
    caps = info.capabilities
    shape = any((s.m, s.n, s.k, s.a, s.b, s.c, s.result) ==
                (16, 16, 16, "FLOAT16_KHR", "FLOAT16_KHR", "FLOAT32_KHR", "FLOAT32_KHR")
                for s in caps.cooperative_matrix_shapes)
    return (shape and not caps.missing(COOP_REQUIRES) and "shuffle" in info.subgroup_ops
            and caps.subgroup_size == 32 and caps.max_subgroup_size in (0, 32)
            and all(_dtype(t) == "float16" for t in (q, k, v)))


def coop2_threads(caps, d_max: int) -> int:
    """The workgroup size sdpa_coopmat_wg.glsl runs head-dim bucket ``d_max`` with on
    a device whose capability table is ``caps``, or 0 where it cannot: it needs
    COOP2_REQUIRES and a flexible shape of the GEMM's types for its matrices (BR x
    D_MAX, D_MAX x BC, BR x BC, BC x D_MAX: Capabilities.workgroup_matrix_invocations)."""
    if caps.missing(COOP2_REQUIRES) or d_max not in COOP2_D:
        return 0
    return caps.workgroup_matrix_invocations(gemm_core.COOPMAT_WG_TYPES, m=(COOP2_BR,),
                                             n=(COOP2_BC, d_max), k=(COOP2_BC, d_max))


def coop2_fits(info, a: "Attention", d_max: int) -> int:
    """The workgroup size sdpa_coopmat_wg.glsl runs attention ``a`` with on device
    ``info``, or 0 where it does not take it: COOP2_ENABLED on, sdpa_coopmat.glsl's
    conditions (``coop_fits``), no mask tensor, no window, the [B, H, L, D] layout,
    head dims multiples of 8 (16-byte rows for the tensor-addressed loads) and
    ``coop2_threads``. Forms no GPU has run yet stay on sdpa_coopmat.glsl: a start
    position read on the device (vkdelegate.sdpa_at's POS_TENSOR) and NaN for fully
    masked rows (et_vk.sdpa); the shader has both."""
    if not COOP2_ENABLED or a.mask is not None or a.window or a.seq_first:
        return 0
    if a.start is not None or a.nan_rows:
        return 0
    if any(t.max_shape[-1] % 8 for t in (a.q, a.k, a.v)):
        return 0
    if not coop_fits(info, a.q, a.k, a.v):
        return 0
    return coop2_threads(info.capabilities, d_max)


def coop2_defines(out, q, k, v, *, causal: bool, d_max: int, skip: bool, threads: int,
                    nan_rows: bool = False, start=None) -> dict:
    """The sdpa_coopmat_wg.glsl defines of one form (float16 tensors, no mask)."""
    d = tiled_defines(out, q, k, v, None, causal=causal, window=False, d_max=d_max,
                      skip=skip, nan_rows=nan_rows, start=start)
    for name in ("WG", "BM", "BN", "SR", "SC", "PR", "PC"):
        d.pop(name)
    d.update(BR=str(COOP2_BR), BC=str(COOP2_BC), UNROLL=str(COOP2_UNROLL),
             THREADS=str(threads))
    if causal and COOP_HEAVY_FIRST:
        d["HEAVY_FIRST"] = "1"
    return d


def combine_defines(out, d_max: int, nan_rows: bool, seq_first: bool) -> dict:
    """The sdpa_combine.glsl defines (out: a Tensor or (graph, device) dtype pair)."""
    d = storage_defines(OUT=out, PART="float32")
    d.update(D_MAX=str(d_max), FULLY_MASKED="NAN_F" if nan_rows else "0.0")
    if seq_first:
        d["SEQ_FIRST"] = "1"
    return d


def _dtype(t) -> str:
    return t.dtype if hasattr(t, "dtype") else t[0]


def dispatch(b, a: Attention) -> None:
    """Declare the dispatches of attention ``a`` on NodeBuilder ``b``: one dispatch of
    sdpa_tiled.glsl / sdpa_coopmat.glsl (prefill), of sdpa_decode.glsl (few rows on
    GPUs, kernels/attention_decode.py) or of sdpa.glsl, or with split-K a partial pass
    and the combine pass; before it the block map of a boolean mask (TILE_MAP).
    Raises (through ``b.error``) for head dims over MAX_HEAD_DIM and, on llvmpipe, key
    counts past its loop budget."""
    q, k, v, out = a.q, a.k, a.v, a.out
    seq, head = (-3, -2) if a.seq_first else (-2, -3)  # dims of L and H
    e, ev = q.max_shape[-1], v.max_shape[-1]
    if max(e, ev) > MAX_HEAD_DIM:
        raise b.error(f"head dims {e}, {ev}: at most {MAX_HEAD_DIM}")
    scale = 1.0 / math.sqrt(e) if a.scale is None else float(a.scale)
    d_max = d_bucket(e, ev)
    s_max, l_max = k.max_shape[seq], q.max_shape[seq]
    heads = q.max_shape[head]
    batch = q.max_shape[0] if q.ndim == 4 else 1
    group = pack_for(heads, k.max_shape[head])
    splits = splits_for(l_max, heads, batch, s_max, d_max, group)
    tiled = use_tiled(l_max, d_max, b.device.info.max_shared_memory)
    if tiled:
        splits, group = 1, 1
    tiles = -(-s_max // block_n(d_max))
    per_split = -(-tiles // splits)
    positions = a.positions or (lambda: (0, NO_LIMIT))
    from vkdelegate.kernels import attention_decode  # it imports this module

    def params_for(n_splits: int, per: int, n_pack: int):
        """The sdpa_block parameters, rewritten after every resize (positions)."""
        def pack() -> bytes:
            offset, limit = positions()
            return SDPA_PARAMS.pack(scale=[scale, 0.0, 0.0, 0.0],
                                    pos=[int(offset), int(min(limit, NO_LIMIT)),
                                         int(a.window), n_splits],
                                    split=[per, n_pack, 0, 0])

        params = b.params(pack())
        if a.positions is not None:
            b.on_resize(lambda: params.write(pack()))
        return params

    if not tiled and attention_decode.use_decode(b.device.info, l_max, heads,
                                                 k.max_shape[head], d_max):
        attention_decode.dispatch(b, a, d_max=d_max, scale=scale, l_max=l_max,
                                  s_max=s_max, heads=heads, batch=batch,
                                  params_for=params_for)
        return
    loop_limit.check(b, tiled_iterations(s_max, d_max) if tiled else
                     iterations(min(s_max, per_split * block_n(d_max)), d_max),
                     f"{s_max} keys of head dim {d_max}")
    params = params_for(splits, per_split, group)
    cpu = b.device.info.type == "cpu"
    skip = bool(b.option(SKIP_OPTION, True))
    target = out
    if splits > 1:
        target = b.temporary((batch * heads * l_max * splits, d_max + 4), "float32")
    mask = a.mask
    metas = [target.meta, q.meta, k.meta, v.meta] + ([mask.meta] if mask else [])
    inputs = [q, k, v] + ([mask] if mask else []) + ([a.start] if a.start is not None else [])
    if tiled:
        form = dict(causal=a.causal, window=a.window > 0, d_max=d_max, skip=skip,
                    nan_rows=a.nan_rows, seq_first=a.seq_first, start=a.start)
        coop = b.option(COOP_OPTION, True)
        threads = coop2_fits(b.device.info, a, d_max) if coop else 0
        if threads:
            form.pop("window"), form.pop("seq_first")
            shader, d = COOP2, coop2_defines(out, q, k, v, threads=threads, **form)
            wg, bm, bn = threads, COOP2_BR, COOP2_BC
        elif coop and coop_fits(b.device.info, q, k, v, mask):
            shader, d, wg, bm = COOP, coop_defines(out, q, k, v, mask, **form), COOP_WG, COOP_BM
            bn = COOP_BN
        else:
            shader, d = TILED, tiled_defines(out, q, k, v, mask, **form)
            wg, bm, bn = TILED_WG, TILED_BM, tiled_block_n(d_max)
        map_inputs, map_params = _tile_map(b, a, d, params, rows=bm, keys=bn, heads=1)
        b.dispatch(shader, d, outputs=[out], inputs=inputs + map_inputs,
                   params=metas + [params] + map_params,
                   global_size=(-(-l_max // bm) * wg, heads, batch),
                   local_size=(wg, 1, 1),
                   grid=lambda: (-(-q.shape[seq] // bm) * wg, heads, batch))
        return
    d = defines(target, q, k, v, mask, causal=a.causal, window=a.window > 0, d_max=d_max,
                cpu=cpu, skip=skip, nan_rows=a.nan_rows, seq_first=a.seq_first,
                split=splits > 1, start=a.start, kv_texel=cpu and kv_texel_fits(b, k, v))
    map_inputs, map_params = _tile_map(b, a, d, params, rows=BLOCK_M // group,
                                       keys=block_n(d_max), heads=group)
    def grid(rows: int) -> tuple:
        return (-(-rows // (BLOCK_M // group)) * BLOCK_M * splits, heads // group, batch)

    b.dispatch(SHADER, d, outputs=[target], inputs=inputs + map_inputs,
               params=metas + [params] + map_params, global_size=grid(l_max),
               local_size=(BLOCK_M, 1, 1), grid=lambda: grid(q.shape[seq]))
    if splits > 1:
        dispatch_combine(b, out, target, d_max=d_max, splits=splits, l_max=l_max,
                         rows=batch * heads, nan_rows=a.nan_rows, seq_first=a.seq_first)


def _tile_map(b, a: Attention, d: dict, params, *, rows: int, keys: int,
              heads: int) -> tuple:
    """For a form with TILE_MAP (``d``): record the block-map dispatch of ``a``'s
    boolean mask for blocks of ``rows`` query rows x ``keys`` keys x ``heads`` query
    heads (one workgroup of the consuming kernel) and return ([the map], [its
    parameters]) for the consumer's inputs and params; else ([], [])."""
    if "TILE_MAP" not in d:
        return [], []
    from vkdelegate.kernels import attention_map  # it imports this module

    tile_map, map_params = attention_map.dispatch(b, a, params, rows=rows, keys=keys,
                                                  heads=heads)
    return [tile_map], [map_params]


def dispatch_combine(b, out, part, *, d_max: int, splits: int, l_max: int, rows: int,
                     nan_rows: bool, seq_first: bool) -> None:
    """Record sdpa_combine.glsl: merge the ``splits`` partial rows of ``part`` (fp32
    rows of d_max + 4, see sdpa.glsl's SPLIT_K) into ``out``, for ``l_max`` query rows
    of each of ``rows`` (batch x query heads) heads."""
    b.dispatch(COMBINE, combine_defines(out, d_max, nan_rows, seq_first),
               outputs=[out], inputs=[part],
               params=[out.meta, b.params(COMBINE_PARAMS.pack(splits=[splits, 0, 0, 0]))],
               global_size=(out.max_shape[-1], l_max, rows), local_size=(64, 1, 1))
