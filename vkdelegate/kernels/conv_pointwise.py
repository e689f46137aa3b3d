"""The pointwise (1x1) convolution as an implicit GEMM on GPUs: conv2d_pw.glsl.

A 1x1, stride-1, unpadded, ungrouped convolution over NCHW (or NCL) data is, per
batch n, out[n][OC, P] = W[OC, IC] @ x[n][IC, P] with P the flattened pixels: no
im2col, the input is read in place. conv2d_pw.glsl computes 32 x 32 output blocks per
workgroup with an in-workgroup split of the reduction (``slices``) for layers with few
blocks and many input channels, and a bias + clamp + residual-add epilogue. A
dispatch of fewer than SPLIT_WORKGROUPS blocks (EfficientNet's 7 x 7 and 14 x 14
layers at batch 1: 12 to 28 blocks, so the reduction ran on that many of the H100's
132 SMs) also splits the reduction across workgroups (``split_k``, SPLIT_K): pass 1 is
conv2d_pw.glsl SPLIT_OUT, each split's raw fp32 sums into a scratch [N, splits, OC,
P]; pass 2 is conv2d_pw_reduce.glsl, the sum over the splits and the epilogue.

Planes whose pixel count is not a multiple of 4 (EfficientNet's 7 x 7 layers), where
conv2d_pw.glsl reads the input element by element, take conv2d_pw_tiled.glsl instead
(``tiled``): the whole batch as one GEMM over N x P columns, gemm.glsl's
register-blocked tiling with shared-memory K steps (64 x 64, 128 x 128, or 32 x 128
blocks for narrow layers), split across workgroups below TILED_SPLIT_BELOW blocks into
the same scratch layout and reduction pass.

On CPU drivers (llvmpipe) conv2d.glsl's POINTWISE path stays (``use_gemm``): there a
workgroup barrier costs more than the reuse gains (kernels/gemm.py ``use_tiled``), and
that path is tuned for llvmpipe. Torch-free; registers no op (ops/families/
convolution.py records it).
"""
from __future__ import annotations

import numpy as np

from vkdelegate.kernels import loop_limit
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "conv2d_pw"
BLOCK = 32  # output channels and pixels per workgroup (conv2d_pw.glsl)
THREADS = 64  # invocations per K slice
#: At most 8 K slices; slice s > 0 parks 4 KiB of partial sums in shared memory, so
#: a device gets at most 1 + maxComputeSharedMemorySize / 4 KiB - 1 (4 on Vulkan's
#: 16 KiB minimum, 8 from 32 KiB: llvmpipe, the H200's 48 KiB).
MAX_SLICES = 8
SLICE_SHARED_BYTES = 4096
#: Workgroup-slices a dispatch should have to fill a large GPU: more blocks than this
#: take one slice. On the H200 (132 SMs) 2112 with up to 8 slices took EfficientNet-
#: Lite0's pointwise layers from 662 to 498 us (batch 1) and 1485 to 1024 us (batch 8)
#: against 528 with up to 4 (docs/PERF.md, "EfficientNet-Lite0 on the H200: ...").
TARGET_UNITS = 2112
MIN_SLICE_K = 32  # input channels a slice sums at least
#: The cross-workgroup split of the reduction (``split_k``): False keeps one pass
#: everywhere. Dispatches of fewer than SPLIT_WORKGROUPS 32 x 32 blocks (the H100 and
#: the H200 have 132 SMs) split into up to ceil(SPLIT_WORKGROUPS / blocks) workgroups
#: per block, each split and slice keeping MIN_SLICE_K channels and all of them at most
#: TARGET_UNITS workgroup-slices; more blocks keep the single pass (no extra dispatch).
#: On an H100, EfficientNet-Lite0 batch 1 (profiled GPU us, docs/PERF.md "An H100,
#: 2026-12-05 (fifth session)"): single pass 875-877 over 51 dispatches; 132: 723 over
#: 74 (23 layers split); 64: 712-713 over 64 (13 layers split, none at batch 8), host
#: to host 0.98 ms against 1.04 single-pass. Hence 64.
SPLIT_K = True
SPLIT_WORKGROUPS = 64
MAX_SPLITS = 32  # bounds the scratch: splits x the output, fp32
REDUCE_SHADER = "conv2d_pw_reduce"  # split-K's second pass
#: Split-K without the second pass (both shaders' LAST_SUM): the split that finishes
#: last in each block adds the splits' sums (an atomic counter per block) and applies
#: the epilogue, the same bits as conv2d_pw_reduce.glsl. Removes a dispatch per split
#: layer (EfficientNet-Lite0 batch 1: 18 of 69); not yet measured on a GPU, so off.
LAST_SUM = False
DTYPES = ("float32", "float16")

#: conv2d_pw_tiled.glsl: the whole batch as one register-blocked GEMM (``tiled``).
TILED_SHADER = "conv2d_pw_tiled"
#: GPUs take the tiled form (False: conv2d_pw.glsl everywhere) for planes whose pixel
#: count is not a multiple of 4 (where conv2d_pw.glsl loads the input element by
#: element: EfficientNet's 7 x 7 layers), for other planes as TILED_ALIGNED_FULL says,
#: and with TILED_ALIGNED for every plane. On an H100 (docs/PERF.md "An H100,
#: 2026-12-07 (twentieth session)"), one node each at batch 8: the 7 x 7 layers 20-50%
#: faster tiled (1152 -> 320: 70.4 -> 34.4 us with the clock held, twenty-first
#: session); EfficientNet-Lite0 with the 7 x 7 layers tiled: GPU time 713 -> 632 us at
#: batch 1, 1289 -> 1043 us at batch 8.
TILED = True
TILED_ALIGNED = False
#: Planes of a multiple of 4 pixels take the tiled form where its blocks alone give
#: TILED_SPLIT_BELOW workgroups (no split-K). On an H100 at batch 8 (docs/PERF.md "An
#: H100, 2026-12-07 (twenty-first session)", the clock held busy, 4-vector stores):
#: those layers 15-25% faster tiled (16 -> 96 at 112 x 112: 52.6 -> 39.9 us; 40 -> 240
#: at 28 x 28: 16.9 -> 11.2; 112 -> 672 at 14 x 14: 19.8 -> 17.2), the ones it would
#: split 5-40% slower (240 -> 80 at 14 x 14: 10.7 -> 14.9; 672 -> 112: 24.2 -> 26.8);
#: EfficientNet-Lite0's batch-8 GPU time 1051 -> 973 us, batch 1 unchanged.
TILED_ALIGNED_FULL = True
#: Its blocks (TM, TN, WY): TM x TN outputs an invocation, a workgroup of WX = 256 / WY
#: by WY invocations, so WY * TM output channels by WX * TN columns: 64 x 64 and
#: 128 x 128, the larger where it still gives TILED_LARGE_BLOCKS workgroups; layers of
#: at most TILED_NARROW_OC output channels take TILED_NARROW (32 x 128: a 64-row block
#: would leave half its rows or more idle).
TILED_BLOCKS = ((4, 4, 16), (8, 8, 16))
TILED_LARGE_BLOCKS = 132
TILED_NARROW = (4, 4, 8)
TILED_NARROW_OC = 32
TILED_BK = 16  # input channels a shared-memory step
#: Dispatches of fewer blocks split the reduction across workgroups (the splits' sums
#: then go through conv2d_pw_reduce.glsl), each split at least TILED_MIN_SPLIT_K
#: channels, at most MAX_SPLITS splits.
TILED_SPLIT_BELOW = 132
TILED_MIN_SPLIT_K = 64

#: conv2d.glsl's parameter block (ops/families/convolution.py CONV_PARAMS): the same
#: layout, so that both shaders take the same buffer.
PARAMS = ParamBlock("conv_block", [("channels", "ivec4"), ("clamp", "vec4")])


def use_gemm(info) -> bool:
    """Whether pointwise convolutions on the device ``info`` (a DeviceInfo) take this
    kernel: every device but CPU drivers (see the module docstring)."""
    return info.type != "cpu"


def slices(info, batch: int, pixels: int, oc: int, ic: int) -> int:
    """K slices per workgroup (1, 2, 4 or 8) for a [batch, oc, pixels] output and ``ic``
    input channels: doubled while the dispatch has fewer than TARGET_UNITS
    workgroup-slices and each slice keeps MIN_SLICE_K channels, within the device's
    workgroup size and shared memory (``info.max_shared_memory``, bytes)."""
    blocks = _blocks(batch, pixels, oc)
    shared = getattr(info, "max_shared_memory", 0) or 16384  # Vulkan's minimum
    limit = min(MAX_SLICES, info.max_workgroup_invocations // THREADS or 1,
                shared // SLICE_SHARED_BYTES - 1 or 1)
    ks = 1
    while ks < limit and blocks * ks < TARGET_UNITS and ic // (2 * ks) >= MIN_SLICE_K:
        ks *= 2
    return ks


def _blocks(batch: int, pixels: int, oc: int) -> int:
    return max(batch, 1) * -(-pixels // BLOCK) * -(-oc // BLOCK)


def tiled(info, batch: int, pixels: int, oc: int, ic: int) -> "tuple | None":
    """conv2d_pw_tiled.glsl's form for a [batch, oc, pixels] output and ``ic`` input
    channels on the device ``info``: ((TM, TN, WY), splits), or None where
    conv2d_pw.glsl runs (CPU drivers, TILED off; planes of a multiple of 4 pixels
    unless TILED_ALIGNED, or TILED_ALIGNED_FULL and the block alone gives
    TILED_SPLIT_BELOW workgroups). The block: TILED_NARROW up to TILED_NARROW_OC output
    channels, else TILED_BLOCKS' largest that gives TILED_LARGE_BLOCKS workgroups
    (else the first); below TILED_SPLIT_BELOW workgroups
    the channels split into up to ceil(TILED_SPLIT_BELOW / blocks) parts of at least
    TILED_MIN_SPLIT_K channels (at most MAX_SPLITS; 1: the single pass). Only blocks
    within the device's shared memory (``info.max_shared_memory``) are taken, and
    none on a device of fewer than 256 invocations a workgroup."""
    # A plane of a multiple of 4 pixels without TILED_ALIGNED: tiled only where it fills
    # the GPU (TILED_ALIGNED_FULL), else never.
    full_only = pixels % 4 == 0 and not TILED_ALIGNED
    if not (TILED and use_gemm(info)) or (full_only and not TILED_ALIGNED_FULL):
        return None
    columns = max(batch, 1) * pixels

    def blocks(block):
        tm, tn, wy = block
        return -(-columns // (256 // wy * tn)) * -(-oc // (wy * tm))

    shared = getattr(info, "max_shared_memory", 0) or 16384  # Vulkan's minimum
    fits = [b for b in TILED_BLOCKS + (TILED_NARROW,) if tiled_shared_bytes(b) <= shared]
    if info.max_workgroup_invocations < 256 or not fits:
        return None  # a 256-invocation workgroup (Vulkan guarantees 128)
    if oc <= TILED_NARROW_OC and TILED_NARROW in fits:
        block = TILED_NARROW
    else:
        square = [b for b in TILED_BLOCKS if b in fits] or fits
        block = square[0]
        for b in square[1:]:
            if blocks(b) >= TILED_LARGE_BLOCKS:
                block = b
    n = blocks(block)
    if full_only and n < TILED_SPLIT_BELOW:
        return None  # conv2d_pw.glsl's split-K was faster there (TILED_ALIGNED_FULL)
    splits = 1
    if n < TILED_SPLIT_BELOW:
        splits = max(1, min(-(-TILED_SPLIT_BELOW // n), MAX_SPLITS,
                            ic // TILED_MIN_SPLIT_K))
    return block, splits


def split_k(info, batch: int, pixels: int, oc: int, ic: int) -> tuple[int, int]:
    """(splits, slices) for a [batch, oc, pixels] output and ``ic`` input channels:
    ``splits`` workgroups per block sum a part of the channels each (1: the single
    pass), each with ``slices`` K slices. Splits only with SPLIT_K and fewer than
    SPLIT_WORKGROUPS blocks. The K parts in all (splits x slices) are at most
    ic // MIN_SLICE_K (each part keeps MIN_SLICE_K channels) and TARGET_UNITS // blocks;
    splits first reach SPLIT_WORKGROUPS workgroups (at least 2, else the single pass),
    ``slices`` then doubles for the channels of one split as in the single pass, and
    the parts left go to more splits (at most MAX_SPLITS): a slice's loop is what
    bounds a latency-bound dispatch's time (the H100's 1152 -> 192 at 7 x 7 took 57 to
    65 us at batch 8 and 1, 144 channels a slice either way)."""
    blocks = _blocks(batch, pixels, oc)
    parts = min(ic // MIN_SLICE_K, TARGET_UNITS // blocks)
    splits = min(-(-SPLIT_WORKGROUPS // blocks), MAX_SPLITS, parts)
    if not SPLIT_K or blocks >= SPLIT_WORKGROUPS or splits < 2:
        return 1, slices(info, batch, pixels, oc, ic)
    ks = slices(info, max(batch, 1) * splits, pixels, oc, -(-ic // splits))
    return max(splits, min(parts // ks, MAX_SPLITS)), ks


def tiled_shared_bytes(block: tuple) -> int:
    """Shared memory of conv2d_pw_tiled.glsl's ``block`` (TM, TN, WY), bytes: the
    weight and input slices, BK rows of BM / 4 + 1 and BN / 4 + 1 vec4s (128 x 128:
    16.5 KiB, past Vulkan's guaranteed 16 KiB)."""
    tm, tn, wy = block
    return TILED_BK * (wy * tm // 4 + 1 + 256 // wy * tn // 4 + 1) * 16


def tiled_defines(base: dict, block: tuple) -> dict:
    """``defines``' dict with conv2d_pw_tiled.glsl's block (TM, TN, WY), BK and OUT4_T
    (OUT_T's 4-vector, for its aligned stores)."""
    out4 = "f16vec4" if base["OUT_T"] == "float16_t" else "vec4"
    return dict(base, TM=str(block[0]), TN=str(block[1]), WY=str(block[2]),
                BK=str(TILED_BK), OUT4_T=out4)


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """Weight [OC, IC, 1, 1] or [OC, IC, 1] (ATen) -> fp32 [IC, ceil(OC / 4), 4]: the
    4 output channels of a quad contiguous, zero-padded past OC."""
    oc, ic = weight.shape[:2]
    w = np.zeros((-(-oc // 4) * 4, ic), np.float32)
    w[:oc] = weight.reshape(oc, ic)
    return np.ascontiguousarray(w.T.reshape(ic, -1, 4))


def defines(out, x, bias, clamp: bool, residual=None) -> dict:
    """Defines for out, x, bias (Tensors or (graph dtype, device dtype) pairs; the
    bias fp32), with CLAMP and RESIDUAL (``residual``: its tensor or pair). ``bias``
    None: split-K's first pass (SPLIT_OUT; ``out`` its fp32 scratch, no epilogue)."""
    if bias is None:
        d = dict(storage_defines(OUT=out, IN=x), **flag_defines(SPLIT_OUT=True))
    else:
        d = reduce_defines(out, bias, clamp, residual)
        d.update(storage_defines(IN=x))
    d["IN4_T"] = "f16vec4" if d["IN_T"] == "float16_t" else "vec4"
    return d


def last_sum_defines(out, x, bias, clamp: bool, residual=None) -> dict:
    """``defines`` of the one-pass split-K form (LAST_SUM): the real output's
    epilogue, SPLIT_OUT and LAST_SUM."""
    d = defines(out, x, bias, clamp, residual)
    d.update(flag_defines(SPLIT_OUT=True, LAST_SUM=True))
    return d


def reduce_defines(out, bias, clamp: bool, residual=None) -> dict:
    """Defines of the epilogue (conv2d_pw.glsl's, conv2d_pw_reduce.glsl's): out and
    bias storage, CLAMP, RESIDUAL (``residual``: its tensor or pair, or None)."""
    tensors = dict(OUT=out, B=bias)
    if residual is not None:
        tensors["R"] = residual
    return dict(storage_defines(**tensors), **flag_defines(CLAMP=clamp,
                                                           RESIDUAL=residual is not None))


#: LAST_SUM's outputs after the output: the splits' sums and the blocks' counters.
_LAST_SUM_OUTPUTS = ("part_data", "count_data")


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    last_sum = "LAST_SUM" in d
    return Bindings(outputs=("out_data",) + (_LAST_SUM_OUTPUTS if last_sum else ()),
                    inputs=("in_data", "in4_data", "w_data") +
                    (("b_data",) if "SPLIT_OUT" not in d or last_sum else ()) +
                    (("r_data",) if "RESIDUAL" in d else ()),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            PARAMS))


@shader_bindings(TILED_SHADER)
def _tiled_bindings(d) -> Bindings:
    # out4_data: the output again, 4 elements a store (conv2d_pw_tiled.glsl).
    plain = _bindings(d)
    return Bindings(outputs=("out_data", "out4_data") + plain.outputs[1:],
                    inputs=plain.inputs, params=plain.params)


@shader_bindings(REDUCE_SHADER)
def _reduce_bindings(d) -> Bindings:
    return Bindings(outputs=("out_data",),
                    inputs=("partial_data", "b_data") +
                    (("r_data",) if "RESIDUAL" in d else ()),
                    params=(tensor_meta_block("out_meta"), PARAMS))


def record(b, out, x, weight, bias, lo: float, hi: float, clamp: bool,
           spatial: int, residual=None) -> None:
    """Record out = [residual +] clamp(conv1x1(x, weight) + bias) on the node builder
    ``b``: x [N, IC, *S], out [N, OC, *S] (``spatial`` = len(S), 1 or 2), ``weight``
    the constant Tensor [OC, IC, 1(, 1)] (bound packed, ``pack_weight``), ``bias`` a
    fp32 Tensor [OC], clamp bounds ``lo``/``hi`` used when ``clamp``, ``residual``
    None or a Tensor of out's shape and dtype. conv2d_pw_tiled.glsl where ``tiled``
    says so (one dispatch, or two with its splits), else conv2d_pw.glsl as follows.
    Raises DeviceLimitError (b.error) when a slice's channel loop would
    run past llvmpipe's loop budget. With ``split_k``'s splits > 1: two dispatches
    (the split sums into a node-owned fp32 scratch sized for the upper-bound shape,
    then conv2d_pw_reduce.glsl), or with LAST_SUM one (the last split of each block
    adds them, counted in a zeroed int32 buffer of a counter per block); else one."""
    mx = out.max_shape
    pixels = int(np.prod(mx[2:]))
    oc, ic = mx[1], x.max_shape[1]
    form = tiled(b.device.info, mx[0], pixels, oc, ic)
    if form is None:
        splits, ks = split_k(b.device.info, mx[0], pixels, oc, ic)
        part = -(-ic // splits)  # the channels one split sums
        steps = -(-part // ks)  # a slice's share of them
    else:
        steps = -(-ic // TILED_BK)
    loop_limit.check(b, steps + loop_limit.SLACK, f"{ic} input channels")
    w = b.packed_constant(weight, pack_weight, "float32")
    params = b.params(PARAMS.pack(channels=[ic, oc], clamp=[lo, hi]))
    if form is not None:
        _record_tiled(b, out, x, w, bias, params, clamp, spatial, residual, *form)
        return
    rest = [residual] if residual is not None else []
    grid = (-(-pixels // BLOCK) * THREADS * ks, -(-oc // BLOCK), mx[0] * splits)
    if splits == 1:
        b.dispatch(SHADER, defines(out, x, bias, clamp, residual), outputs=[out],
                   inputs=[x, x, w, bias] + rest, params=[out.meta, x.meta, params],
                   global_size=grid, local_size=(THREADS * ks, 1, 1),
                   spec_constants=(ks, spatial))
        return
    partial = b.temporary((splits * out.max_numel,), "float32")
    if LAST_SUM:
        blocks = -(-pixels // BLOCK) * -(-oc // BLOCK) * mx[0]
        b.dispatch(SHADER, last_sum_defines(out, x, bias, clamp, residual),
                   outputs=[out, partial, b.zeroed((blocks,), "int32")],
                   inputs=[x, x, w, bias] + rest, params=[out.meta, x.meta, params],
                   global_size=grid, local_size=(THREADS * ks, 1, 1),
                   spec_constants=(ks, spatial, splits))
        return
    b.dispatch(SHADER, defines(partial, x, None, False), outputs=[partial],
               inputs=[x, x, w], params=[out.meta, x.meta, params], global_size=grid,
               local_size=(THREADS * ks, 1, 1), spec_constants=(ks, spatial, splits))
    _reduce(b, out, partial, bias, params, clamp, spatial, splits, rest)


def _reduce(b, out, partial, bias, params, clamp: bool, spatial: int, splits: int,
            rest: list) -> None:
    """Record conv2d_pw_reduce.glsl: out = the epilogue of the ``splits`` sums."""
    residual = rest[0] if rest else None
    b.dispatch(REDUCE_SHADER, reduce_defines(out, bias, clamp, residual), outputs=[out],
               inputs=[partial, bias] + rest, params=[out.meta, params],
               global_size=(out.max_numel,), local_size=b.local_size_1d(out.max_numel),
               spec_constants=(splits, spatial))


def _record_tiled(b, out, x, w, bias, params, clamp: bool, spatial: int, residual,
                  block: tuple, splits: int) -> None:
    """``record``'s dispatches with conv2d_pw_tiled.glsl (``tiled``'s ``block`` and
    ``splits``): ``w`` the packed weight, ``params`` the conv_block."""
    rest = [residual] if residual is not None else []
    columns = out.max_shape[0] * int(np.prod(out.max_shape[2:]))
    tm, tn, wy = block
    wx = 256 // wy
    grid = (-(-columns // (wx * tn)) * wx, -(-out.max_shape[1] // (wy * tm)) * wy, splits)
    if splits == 1:
        b.dispatch(TILED_SHADER, tiled_defines(defines(out, x, bias, clamp, residual),
                                               block),
                   outputs=[out, out], inputs=[x, x, w, bias] + rest,
                   params=[out.meta, x.meta, params], global_size=grid,
                   local_size=(wx, wy, 1), spec_constants=(spatial, 1))
        return
    partial = b.temporary((splits * out.max_numel,), "float32")
    if LAST_SUM:
        blocks = grid[0] // wx * (grid[1] // wy)
        b.dispatch(TILED_SHADER, tiled_defines(last_sum_defines(out, x, bias, clamp,
                                                                residual), block),
                   outputs=[out, out, partial, b.zeroed((blocks,), "int32")],
                   inputs=[x, x, w, bias] + rest, params=[out.meta, x.meta, params],
                   global_size=grid, local_size=(wx, wy, 1),
                   spec_constants=(spatial, splits))
        return
    b.dispatch(TILED_SHADER, tiled_defines(defines(partial, x, None, False), block),
               outputs=[partial, partial], inputs=[x, x, w],
               params=[out.meta, x.meta, params], global_size=grid,
               local_size=(wx, wy, 1), spec_constants=(spatial, splits))
    _reduce(b, out, partial, bias, params, clamp, spatial, splits, rest)


def _variant(profile, dtype: str, clamp: bool, residual: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return defines(ddt, ddt, ("float32", "float32"), clamp, ddt if residual else None)


def _split_variant(profile, dtype: str) -> dict:
    return defines(("float32", "float32"), (dtype, device_dtype(dtype, profile)), None,
                   False)


def _last_sum_variant(profile, dtype: str, clamp: bool, residual: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return last_sum_defines(ddt, ddt, ("float32", "float32"), clamp,
                            ddt if residual else None)


def _reduce_variant(profile, dtype: str, clamp: bool, residual: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return reduce_defines(ddt, ("float32", "float32"), clamp, ddt if residual else None)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=DTYPES,
             clamp=(False, True), residual=(False, True))
declare_grid(SHADER, _split_variant, profile=STORAGE_PROFILES, dtype=DTYPES)
declare_grid(TILED_SHADER, lambda block, **kw: tiled_defines(_variant(**kw), block),
             profile=STORAGE_PROFILES, dtype=DTYPES, clamp=(False, True),
             residual=(False, True), block=TILED_BLOCKS + (TILED_NARROW,))
declare_grid(TILED_SHADER, lambda block, **kw: tiled_defines(_split_variant(**kw), block),
             profile=STORAGE_PROFILES, dtype=DTYPES, block=TILED_BLOCKS + (TILED_NARROW,))
if LAST_SUM:  # declared (build-shaders) where the lowering picks it
    declare_grid(SHADER, _last_sum_variant, profile=STORAGE_PROFILES, dtype=DTYPES,
                 clamp=(False, True), residual=(False, True))
    declare_grid(TILED_SHADER,
                 lambda block, **kw: tiled_defines(_last_sum_variant(**kw), block),
                 profile=STORAGE_PROFILES, dtype=DTYPES, clamp=(False, True),
                 residual=(False, True), block=TILED_BLOCKS + (TILED_NARROW,))
declare_grid(REDUCE_SHADER, _reduce_variant, profile=STORAGE_PROFILES, dtype=DTYPES,
             clamp=(False, True), residual=(False, True))
