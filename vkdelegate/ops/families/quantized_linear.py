"""Quantized-weight linear: aten._weight_int8pack_mm.default, et_vk.linear_q4gsw.default,
et_vk.linear_dq8ca_q4gsw.default (ExecuTorch 1.5's schemas, backends/vulkan/
custom_ops_lib.py; made by the lowering pass backend/passes/quantized_linear.py from
torchao's quantized linears).

- _weight_int8pack_mm(self [M, K], mat2 int8 [N, K], scales [N]) -> [M, N] =
  (self @ mat2.T) * scales (ATen's int8 weight-only linear); fp32/fp16 self.
- linear_q4gsw(self [..., K], weights uint8 [N, K/2], weight_scales [K/gs, N],
  group_size, bias [N]?) -> [..., N]: int4 group-wise symmetric weights two per byte
  (ET's packing: k even in the low nibble, + 8); group sizes multiples of 8 dividing K;
  scales and bias may be padded past N (ExecuTorch's blobs pad them to 4).
- linear_dq8ca_q4gsw(input [..., K] fp32 or fp16, input_scales (input's dtype) and
  input_zp int8 one per row of input ([...], [..., 1] or [M]), weights,
  weight_sums int32, weight_scales, group_size, bias?): 8da4w, the activation
  quantized per row in the shader, integer products per group (dotPacked4x8EXT where
  the device has shaderIntegerDotProduct, a portable loop otherwise).

Shaders: for at most GEMV_ROWS rows (the upper bound) on GPUs (``use_gemv``), the
vectorized GEMV linear_qw_gemv.glsl (16-byte weight loads unpacked in registers, the
int4 group scale once per 32 values, subgroupAdd reduction, VWG invocations (VWG_FIT
for rows of few blocks) and VROWS outputs per workgroup (fewer for products of few
outputs: VMIN_GROUPS; int4 with fp16 x on devices
with shaderFloat16 in packed fp16 arithmetic: VHALF, the HALF_DOT form), x loaded per
invocation (VDIRECT) or staged in shared memory, or with
VSG_ROWS a subgroup per output over its whole K (no barrier); 8da4w reads x as its
qparams' dispatch quantized it, QX_IN, where that dispatch published the rows
(kernels/quantized_x.py; ``_quantized_x``), else quantizes x as it loads it) where the
weight allows it
(``vector_gemv``: 8-bit storage, int4 group sizes multiples of 32, int8 K a multiple
of 16); else linear_qw.glsl, whose
GEMV form (a workgroup of WG invocations per NPW columns of one row, K split in 32-bit
words, shared-memory reduction) takes the rest, and whose GEMM form (4 x 4 tiles) the
rows past GEMV_ROWS. On CPU drivers (``Device.texel_inputs``; ``texel_form``) the
weight-only products of any rows take linear_qw_texel.glsl instead, where their
weights allow it (constant weights and scales, int4 groups of 32k, int8 K a multiple
of 16; 8da4w keeps the GEMM form): no barrier, no shared memory; each invocation
(lane l of a tile of 8) computes TROWS columns (TROWS_SWIGLU for the SwiGLU form) of
one or four rows over the whole K, reading x, the weight and the scales as uniform
texel buffers (llvmpipe's vectorised gathers), the weight repacked at load into
16-byte blocks so that a SIMD vector's 8 lanes read 8 adjacent blocks, the scales
into vec4s of 4 rows, both over their own constants' buffers where this node is
their only reader (``NodeBuilder.repacked``); the residual, the SwiGLU chain and the
RMS norm (folded in as linear_qw_gemv.glsl folds it) in the same dispatch. The packed
weight is the program's constant itself, read as 32-bit words on devices with 8-bit
storage (stored once: 0.5 byte per int4 weight, 1 per int8). fp32 accumulation; linear_qw.glsl
rounds an fp16 model's dequantized int4 weights to fp16 as its eager dequantize does,
linear_qw_gemv.glsl and linear_qw_texel.glsl scale each block's or group's sum instead
(at most 2^-12 of each product).
``_record`` also serves vkdelegate.linear_q4gsw_add, weight_int8pack_mm_add and
linear_dq8ca_q4gsw_add (registered below; kernels/residual.py): every form's
HAS_RESIDUAL adds the residual in its epilogue; and vkdelegate.linear_q4gsw_swiglu,
weight_int8pack_mm_swiglu and linear_dq8ca_q4gsw_swiglu (registered below;
kernels/swiglu.py): a merged
gate/up weight [2F, ...] whose SwiGLU chain every form (linear_qw_gemv.glsl, and
linear_qw.glsl's GEMV and GEMM forms) runs in its epilogue (SWIGLU: row pairs
(n, F + n), each sum finished and rounded as the plain op's store, then the chain),
one dispatch on every device; and vkdelegate.rms_norm_linear_q4gsw,
rms_norm_weight_int8pack_mm and their _swiglu forms (registered below; made by
backend/passes/fuse_rms_norm_linear.py and fuse_linear_swiglu.py): the product (or its
SwiGLU form) of et_vk.rms_norm(x, norm_weight, eps), the norm folded into
linear_qw_gemv.glsl (RMS_NORM: x times the norm weight as it is loaded or staged, the
squares of x summed alongside and reduced with the products' sums, each row's sum
scaled by 1 / rms before W8's scale, the bias and the chain; one dispatch, the
normalized row never rounded to x's dtype) for the rows it takes (up to GEMV_ROWS, on
GPUs), and likewise into linear_qw_texel.glsl (CPU drivers, any rows; each invocation
sums the squares of the whole row), unless compile option ``rms_norm_prologue`` is
off; every other form (linear_qw.glsl's GEMV and GEMM forms: more rows on GPUs,
weights the vectorized GEMV cannot read) records the norm's own dispatch first
(kernels/norm_dispatch.rms_prologue) and reads its output, as the unfused pair does.
And vkdelegate.rms_norm_linear_q4gsw_rotary_cache and
rms_norm_weight_int8pack_mm_rotary_cache (registered at the end; made by
backend/passes/fuse_linear_rotary_cache.py): a decode layer's merged q/k/v product with
its norm, the rotary embedding and the K/V cache writes, in linear_qw_gemv.glsl's
ROTARY epilogue (rotary_cache.h, kernels/rotary_cache.py; one dispatch) where the
vectorized GEMV takes the product, else the unfused pair's dispatches.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from vkdelegate.errors import VkDelegateError
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.kernels import loop_limit
from vkdelegate.kernels import quantized_x
from vkdelegate.kernels import residual
from vkdelegate.kernels import rotary_cache
from vkdelegate.kernels import swiglu as swiglu_chains
from vkdelegate.kernels.cache_pair import INDEX_DTYPES
from vkdelegate.kernels.gemm import norm_input
from vkdelegate.kernels.norm_dispatch import rms_input_rule, rms_prologue
from vkdelegate.kernels.workgroup import has_subgroup_arithmetic
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import choose, declare_grid, flag_defines

SHADER = "linear_qw"
VSHADER = "linear_qw_gemv"
TSHADER = "linear_qw_texel"
# linear_qw_texel: output columns per invocation (R) by rows of x per invocation
# (M_TILE), for the plain and the SWIGLU form (2R weight rows); invocations per
# workgroup (one SIMD vector of llvmpipe: as many workgroups as its threads can share).
# From benchmarks/quant_gemv.py-style one-node timings on lavapipe (docs/PERF.md,
# "lavapipe: quantized decode"): R = 16 best for one row (8: +20% time, 32: register
# spills), 8 for the SwiGLU form and for 4-row tiles.
TROWS = {1: 16, 4: 8}
TROWS_SWIGLU = {1: 8, 4: 4}
TWG = 8
VWG = 128  # linear_qw_gemv invocations per workgroup (a power of two, >= subgroups)
VROWS = 8  # linear_qw_gemv outputs per workgroup (at most 16: the staged form's partial
#           sums live in the shared x of a sweep)
VDIRECT = True  # linear_qw_gemv's DIRECT form: x loaded per invocation, no staging
VUNROLL = 1  # DIRECT: weight blocks per row per iteration, all loads issued first
VSG_ROWS = False  # linear_qw_gemv's SG_ROWS form (devices with subgroup arithmetic): each
#                  subgroup owns whole outputs (units: VROWS per workgroup, SWIGLU's and
#                  ROTARY's row pairs included) over their whole K, subgroupAdd only, no
#                  barrier; VDIRECT does not apply (its loads are DIRECT's), nor SVEC.
#                  Off: on an H100 it was about 2x slower than DIRECT at 2048 x 16384
#                  int4 and the int4 decode 8% slower (docs/PERF.md, "An H100,
#                  2026-12-05 (fifth session)"); a --sweep form for other GPUs
VMIN_GROUPS = 528  # linear_qw_gemv: fewer rows per workgroup (VROWS halved, down to 2)
#                   while a dispatch would have fewer workgroups than this (0: VROWS
#                   always). 528 = 4 per SM of an H100 / H200 (132 SMs): the 1B int4
#                   decode's q/k/v, o_proj and down_proj products (256-384 workgroups
#                   of 8 rows) then take 768-1024; decode 862 -> 943 tokens/s on an
#                   H100 (docs/PERF.md, "An H100, 2026-12-06 (twelfth session)")
VWG_FIT = 64  # linear_qw_gemv: a product whose rows hold at most this many weight blocks
#             (K <= 2048 int4, 1024 int8) takes workgroups of this many invocations
#             instead of VWG, so that none idles (0: VWG always; not in SG_ROWS). The
#             1B int4 decode on an H100: 956 -> 989 tokens/s, 983 -> 900 us a step
#             (lm_head 103 -> 71, norm + gate/up + SwiGLU 280 -> 234); VWG = 64 for
#             every K made its K = 8192 down_proj slower (docs/PERF.md, "An H100,
#             2026-12-06 (thirteenth session)")
VHALF = True  # linear_qw_gemv's HALF_DOT form for int4 weights with fp16 x (devices with
#              shaderFloat16): the block products in packed fp16 arithmetic, summed in
#              fp16 over VHWORDS 32-bit words (8 weights each), then in fp32; the int4
#              decode 788 -> 862 tokens/s on an H100 (same section)
VHWORDS = 1  # HALF_DOT: words (1, 2 or 4) per fp16 partial sum (1: no finite fp16 x
#              overflows it; 4: 3% faster per GEMV on the H100, 4x the rounding,
#              overflow from |x| > 32752)
VPROBE = 0  # benchmarks only (quant_gemv.py --probe): linear_qw_gemv's PROBE form, wrong results
# VDIRECT / VWG / VROWS / VUNROLL: from the H200 sweep (benchmarks/quant_gemv.py --sweep
# --stream-mb 128, docs/PERF.md): DIRECT with 128 invocations and 8 rows was best or
# within 5% of the best form for int4 and int8 at 4096 x 4096 and 4096 x 14336.
DTYPES = frozenset({"float32", "float16"})
WG = 64  # GEMV invocations per workgroup (a power of two)
NPW = 4  # GEMV output columns per workgroup
GEMV_ROWS = quantized_x.ROWS  # at most this many rows (upper bound) run the GEMV form
# qdims: K, N, group size, weight chunks per row; qstrides: the row strides of the
# scales and of the weight sums (ExecuTorch's blobs pad N: scales to a multiple of 4,
# sums of 8).
PARAMS = ParamBlock("qlinear_block", [("qdims", "ivec4"), ("qstrides", "ivec4")])
# RMS_NORM (linear_qw_gemv.glsl): qnorm.x is the norm's eps.
NORM_PARAMS = ParamBlock("qnorm_block", [("qnorm", "vec4")])
INT8PACK, Q4GSW, DQ8CA = ("aten._weight_int8pack_mm.default", "et_vk.linear_q4gsw.default",
                          "et_vk.linear_dq8ca_q4gsw.default")


@shader_bindings(VSHADER)
@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    inputs = ["x_data", "w_data", "s_data"]
    if "HAS_BIAS" in d:
        inputs.append("c_data")
    if "DQ8CA" in d:
        inputs += ["xs_data", "xz_data", "sum_data"]
    if "HAS_RESIDUAL" in d:
        inputs.append("r_data")
    params = (tensor_meta_block("out_meta"), PARAMS)
    if "RMS_NORM" in d:
        inputs.append("n_data")
        params += (NORM_PARAMS,)
    found = Bindings(outputs=("out_data",), inputs=tuple(inputs), params=params)
    return rotary_cache.bindings(found) if "ROTARY" in d else found


@shader_bindings(TSHADER)
def _texel_bindings(d) -> Bindings:
    x_format = "rgba32ui" if "X16" in d else "rgba32f"
    inputs = ["x_data", "w_data", "s_data"]
    texels = (("x_data", x_format), ("w_data", "rgba32ui"),
              ("s_data", "rgba16f" if "S16" in d else "rgba32f"))
    params = (tensor_meta_block("out_meta"), PARAMS)
    if "HAS_BIAS" in d:
        inputs.append("c_data")
    if "HAS_RESIDUAL" in d:
        inputs.append("r_data")
    if "RMS_NORM" in d:
        inputs.append("n_data")
        texels += (("n_data", x_format),)
        params += (NORM_PARAMS,)
    return Bindings(outputs=("out_data",), inputs=tuple(inputs), params=params,
                    texels=texels)


def use_gemv(info, m: int) -> bool:
    """The GEMV form for at most GEMV_ROWS rows (the upper bound) on GPUs. CPU drivers
    (llvmpipe) get the GEMM form: a workgroup barrier costs more there than splitting
    K saves (4096 x 4096, one row, int8: 89 ms GEMV, 30 ms GEMM on lavapipe)."""
    return m <= GEMV_ROWS and quantized_x.gemv_device(info)


def folds_rms_norm(device, m: int) -> bool:
    """Whether a weight-only product of ``m`` rows (upper bound) with an RMS norm fused
    into it (vkdelegate.rms_norm_linear_q4gsw, ...) folds the norm into its one
    dispatch on ``device`` (its weights permitting: int4 groups of 32k, int8 K a
    multiple of 16): the vectorized GEMV's RMS_NORM (GPUs, up to GEMV_ROWS rows) or
    linear_qw_texel.glsl's (CPU drivers, ``Device.texel_inputs``, any rows)."""
    return use_gemv(device.info, m) or bool(getattr(device, "texel_inputs", False))


def _words(w, k: int, bits: int) -> bool:
    """Whether the weight buffer can be read as 32-bit words: 8-bit storage (bytes
    packed as the program has them) and whole words per row."""
    return w[1] in ("uint8", "int8") and (bits == 4 or k % 4 == 0)


def vector_gemv(w, k: int, bits: int, group: int, row_bytes: int) -> bool:
    """Whether linear_qw_gemv.glsl can run a GEMV: w a Tensor or (graph dtype, device
    dtype) pair stored as bytes (8-bit storage), rows of whole 16-byte blocks
    (``row_bytes``, ExecuTorch's padding included), int4 groups of 32k values (a block
    in one group; 8da4w too), int8 K a multiple of 16."""
    pair = (w.dtype, w.device_dtype) if hasattr(w, "device_dtype") else w
    if not _words(pair, k, bits) or row_bytes % 16:
        return False
    return group % 32 == 0 if bits == 4 else k % 16 == 0


def _half(t) -> bool:
    """Whether t (a Tensor or (graph dtype, device dtype) pair) is stored as fp16."""
    return (t.device_dtype if hasattr(t, "device_dtype") else t[1]) == "float16"


def sg_rows(info) -> bool:
    """Whether linear_qw_gemv.glsl runs its SG_ROWS form on device ``info`` (a
    DeviceInfo): VSG_ROWS, subgroup arithmetic, and VWG a multiple of every subgroup
    size the device may run (each subgroup full: its lanes stride a row by the subgroup
    size)."""
    return VSG_ROWS and has_subgroup_arithmetic(info) \
        and VWG % max(1, info.capabilities.max_subgroup_size) == 0


def workgroup_size(blocks: int, sg: bool, info) -> int:
    """Invocations of one linear_qw_gemv.glsl workgroup for rows of ``blocks`` weight
    blocks (16 bytes: 32 int4 or 16 int8 values): VWG_FIT where the rows hold at most
    that many (every invocation then has a block of each row; not in the SG_ROWS form
    ``sg``, nor below the largest subgroup of the device, ``info`` its DeviceInfo),
    else VWG."""
    largest = info.capabilities.max_subgroup_size
    if not sg and 0 < VWG_FIT < VWG and blocks <= VWG_FIT and VWG_FIT >= largest:
        return VWG_FIT
    return VWG


def units_per_workgroup(paired: bool, sg: bool, rows: "int | None" = None) -> int:
    """Units (outputs; SWIGLU's and ROTARY's row pairs) of a linear_qw_gemv.glsl
    workgroup: ``rows`` (None: VROWS) in the SG_ROWS form (``sg``), else
    ``out_rows(paired, rows)``."""
    return (rows or VROWS) if sg else out_rows(paired, rows)


def out_rows(swiglu: bool, rows: "int | None" = None) -> int:
    """Outputs of a linear_qw_gemv.glsl workgroup of ``rows`` weight rows (None:
    VROWS): that many, or half (at least one) in the SWIGLU form (its 2 * out_rows
    weight rows, as many as the plain GEMV's: that many gate rows, then the matching
    up rows). Also the runs of consecutive weight rows whose scales SVEC reads by
    vector loads."""
    rows = rows or VROWS
    return max(1, rows // 2) if swiglu else rows


def workgroup_rows(units: int, paired: bool, sg: bool) -> int:
    """The weight rows (SG_ROWS: units) of one linear_qw_gemv.glsl workgroup for a
    product of ``units`` outputs (ROTARY: row pairs): VROWS, halved (down to 2) while
    the dispatch would have fewer than VMIN_GROUPS workgroups (not in SG_ROWS)."""
    rows = VROWS
    while VMIN_GROUPS and not sg and rows > 2 and \
            -(-units // out_rows(paired, rows)) < VMIN_GROUPS:
        rows //= 2
    return rows


def scales_per_load(s, swiglu: bool = False, rows: "int | None" = None) -> int:
    """Int4 scales linear_qw_gemv.glsl's SVEC form reads per vector load: 8 stored as
    fp16 (a uvec4), 4 as fp32 (a vec4) (s a Tensor or (graph dtype, device dtype)
    pair); the SWIGLU form's fp16 scales 4 (a uvec2) where its runs of ``out_rows``
    rows hold no whole uvec4 (VROWS = 8: runs of 4)."""
    if not _half(s):
        return 4
    return 4 if swiglu and out_rows(True, rows) % 8 else 8


def vector_scales(s, n: int, s_stride: int, swiglu: bool = False,
                  rows: "int | None" = None) -> bool:
    """Whether the int4 scales [K / group, >= n] (row stride ``s_stride``) can be read
    by SVEC's vector loads in a workgroup of ``rows`` weight rows (None: VROWS): the
    run (``out_rows``) and the stride multiples of scales_per_load, n (the output
    columns) one of the run."""
    run = out_rows(swiglu, rows)
    spl = scales_per_load(s, swiglu, rows)
    return run % spl == 0 and n % run == 0 and s_stride % spl == 0


def vector_defines(out, x, s, bias, bits: int, subgroup: bool, dq=None,
                   svec: bool = False, residual=None, swiglu=None,
                   norm: bool = False, rotary=None, sg: "bool | None" = None,
                   rows: "int | None" = None, wg: "int | None" = None,
                   qx: bool = False) -> dict:
    """Defines of linear_qw_gemv.glsl (tensors and dq as for ``qlinear_defines``, the
    integer-dot variant added by ``choose``); subgroup: the device has subgroup
    arithmetic (VkPhysicalDeviceSubgroupProperties); svec: the int4 scales of a
    workgroup's rows are read by vector loads (``vector_scales``); residual: None, or
    the Tensor (pair) of out's shape that HAS_RESIDUAL adds to the output; swiglu:
    None, or kernels/swiglu.py's defines of the SWIGLU epilogue; norm: the RMS_NORM
    form (the norm folded in; its weight has x's dtype); rotary: None, or
    kernels/rotary_cache.py's defines of the ROTARY epilogue (no svec: a unit's rows
    are not a run); sg: the SG_ROWS form (``sg_rows``; None: VSG_ROWS where
    ``subgroup``), ``rows`` units per workgroup, no svec; rows: the weight rows (SG_ROWS:
    units) of a workgroup (``workgroup_rows``; None: VROWS); wg: its invocations
    (``workgroup_size``; None: VWG); qx: with dq, the QX_IN form (x bound is the row
    quantized by the qparams' dispatch, kernels/quantized_x.py's layout; the DIRECT and
    SG_ROWS forms only)."""
    rows = rows or VROWS
    wg = wg or VWG
    tensors = dict(OUT=out, S=s) | (dict(C=bias) if bias is not None else {})
    if dq is not None:
        tensors.update(XS=dq[0], XZ=dq[1])
    if residual is not None:
        tensors["R"] = residual
    d = storage_defines(**tensors)
    xdev = x.device_dtype if hasattr(x, "device_dtype") else x[1]
    xdt = x.dtype if hasattr(x, "device_dtype") else x[0]
    d.update(flag_defines(W4=bits == 4, W8=bits == 8, HAS_BIAS=bias is not None,
                          X16=xdev == "float16", SUBGROUP=subgroup, DQ8CA=dq is not None,
                          XQ16=dq is not None and xdt == "float16",
                          HAS_RESIDUAL=residual is not None, RMS_NORM=norm,
                          QX_IN=qx and dq is not None))
    paired = swiglu is not None or rotary is not None  # two weight rows per output
    if sg is None:
        sg = VSG_ROWS and subgroup
    if sg:  # ROWS: the units of a workgroup
        d.update(WG=str(wg), ROWS=str(rows), SG_ROWS="1", DIRECT="1",
                 UNROLL=str(VUNROLL))
    else:
        d.update(WG=str(wg), ROWS=str(2 * out_rows(True, rows) if paired else rows))
    if VDIRECT and not sg:
        d.update(DIRECT="1", UNROLL=str(VUNROLL))
    if VPROBE:
        d["PROBE"] = str(VPROBE)
    if svec and bits == 4 and not sg:
        spl = scales_per_load(s, swiglu is not None, rows)
        half = _half(s)
        d.update(SVEC="1", SPL=str(spl),
                 SV_T=("uvec4" if spl == 8 else "uvec2") if half else "vec4",
                 **flag_defines(SV_HALF=half))
    if swiglu is not None:
        d.update(swiglu)
    if rotary is not None:
        d.update(rotary)
    return d


def half_dot(defines: dict) -> dict:
    """linear_qw_gemv.glsl's HALF_DOT form of int4 ``defines`` with fp16 x (X16, not
    DQ8CA): the block products in packed fp16 arithmetic, VHWORDS words per fp16
    partial sum; declared to require shaderFloat16. VkDelegateError for a VHWORDS
    other than 1, 2 or 4 (the shader sums a block's 4 words in runs of it)."""
    if VHWORDS not in (1, 2, 4):
        raise VkDelegateError(f"quantized_linear.VHWORDS = {VHWORDS!r}: the words per fp16 "
                              f"partial sum of the HALF_DOT form are 1, 2 or 4")
    return dict(defines, HALF_DOT="1", HWORDS=str(VHWORDS))


def qlinear_defines(out, x, w, s, bias, bits: int, k: int, gemv: bool, f16: bool,
                    dq=None, int_dot: bool = False, m_tile: int = 4, swiglu=None,
                    residual=None) -> dict:
    """Defines of linear_qw.glsl. Tensors as Tensors or (graph dtype, device dtype)
    pairs; dq: (input_scales, input_zp, weight_sums) for DQ8CA; m_tile: the GEMM
    form's rows per invocation (4, or 1 for fewer than 4 rows); swiglu: None, or
    kernels/swiglu.py's defines of the SWIGLU epilogue; residual: None, or the Tensor
    (pair) of out's shape that HAS_RESIDUAL adds to the output."""
    tensors = dict(OUT=out, X=x, S=s)
    pair = (w.dtype, w.device_dtype) if hasattr(w, "device_dtype") else w
    words = _words(pair, k, bits)
    if not words:
        tensors["W"] = w
    if bias is not None:
        tensors["C"] = bias
    if dq is not None:
        tensors.update(XS=dq[0], XZ=dq[1])
    if residual is not None:
        tensors["R"] = residual
    d = storage_defines(**tensors)
    d.update(flag_defines(W4=bits == 4, W8=bits == 8, W_WORDS=words, GEMV=gemv,
                          HAS_RESIDUAL=residual is not None,
                          HAS_BIAS=bias is not None, F16_WEIGHTS=f16 and bits == 4,
                          DQ8CA=dq is not None, XQ16=dq is not None and f16,
                          INT_DOT=int_dot))
    if gemv:
        d.update(WG=str(WG), NPW=str(NPW))
    else:
        d["M_TILE"] = str(m_tile)
    if swiglu is not None:
        d.update(swiglu)
    return d


def _x_format(x) -> str:
    """The texel format linear_qw_texel.glsl reads x (and the norm weight) through:
    fp16 stored as fp16 8 values a texel (X16), else fp32 4 a texel."""
    return "rgba32ui" if _half(x) else "rgba32f"


def texel_rows(swiglu: bool, m_tile: int) -> int:
    """linear_qw_texel.glsl's output columns per invocation (R) for ``m_tile`` rows of
    x per invocation: TROWS, or TROWS_SWIGLU (twice as many weight rows)."""
    return (TROWS_SWIGLU if swiglu else TROWS)[m_tile]


def texel_defines(out, x, s, bias, bits: int, m_tile: int, residual=None, swiglu=None,
                  norm: bool = False) -> dict:
    """Defines of linear_qw_texel.glsl (tensors as for ``qlinear_defines``, s the
    scales (their device dtype: S16, read as fp16); m_tile:
    rows of x per invocation, 1 or 4; residual: None, or the Tensor (pair) of out's
    shape HAS_RESIDUAL adds; swiglu: None, or kernels/swiglu.py's defines; norm: the
    RMS_NORM form, the norm folded in, its weight of x's dtype)."""
    tensors = dict(OUT=out)
    if bias is not None:
        tensors["C"] = bias
    if residual is not None:
        tensors["R"] = residual
    d = storage_defines(**tensors)
    d.update(flag_defines(W4=bits == 4, W8=bits == 8, HAS_BIAS=bias is not None,
                          HAS_RESIDUAL=residual is not None, RMS_NORM=norm,
                          X16=_x_format(x) == "rgba32ui", S16=_half(s)))
    d.update(R=str(texel_rows(swiglu is not None, m_tile)), M_TILE=str(m_tile))
    if swiglu is not None:
        d.update(swiglu)
    return d


def texel_form(b, w, s, k: int, bits: int, group: int, dq=None, m: int = 1,
               swiglu: bool = False) -> bool:
    """Whether linear_qw_texel.glsl can take the product of ``m`` rows (x permitting:
    the caller checks that it can be read as a texel buffer): devices that read inputs
    through texel views (``Device.texel_inputs``: CPU drivers; GPUs keep their forms),
    the weight-only formats (not 8da4w) with a constant weight and scales, which it
    repacks, int4 groups of 32k values (a block in one group), int8 K a multiple of 16,
    the repacked weight within the device's texel limit."""
    if dq is not None or not getattr(b.device, "texel_inputs", False):
        return False
    info = b.device.info
    if not {"rgba32ui", "rgba32f", "rgba16f"} <= info.texel_formats:
        return False
    if group % 32 if bits == 4 else k % 16:
        return False
    r = texel_rows(swiglu, 4 if m >= 4 else 1)
    n = w.max_shape[0] // 2 if swiglu else w.max_shape[0]
    texels = -(-n // (8 * r)) * 8 * r * (2 if swiglu else 1) * (k * bits // 128)
    if texels > info.max_texel_buffer_elements:
        return False
    return b.constant_array(w) is not None and b.constant_array(s) is not None


def _texel_row_map(n: int, r: int, swiglu: bool) -> np.ndarray:
    """Weight rows [tiles, RW, 8] of linear_qw_texel.glsl's invocations: lane l of tile
    t has columns c = min(8r t + 8q + l, n - 1), q < r, then (``swiglu``: a merged
    gate/up weight) the up rows n + c."""
    tiles = -(-n // (8 * r))
    cols = np.minimum(np.arange(tiles)[:, None, None] * (8 * r)
                      + np.arange(r)[None, :, None] * 8 + np.arange(8)[None, None, :], n - 1)
    return np.concatenate([cols, cols + n], axis=1) if swiglu else cols


def pack_texel_weight(w: np.ndarray, k: int, bits: int, r: int, swiglu: bool) -> np.ndarray:
    """The weight bytes w [rows, >= K * bits / 8] (the program's constant) as
    linear_qw_texel.glsl reads them: uint32 [tiles, K / KV, RW, 8, 4], the 16-byte
    blocks (KV = 32 int4 / 16 int8 values of k, bytes as stored) of the rows
    ``_texel_row_map`` gives (n = rows, or rows / 2 with ``swiglu``)."""
    rows = w.shape[0]
    kbytes = k * bits // 8
    blocks = np.ascontiguousarray(w[:, :kbytes]).view(np.uint32).reshape(rows, -1, 4)
    row_map = _texel_row_map(rows // 2 if swiglu else rows, r, swiglu)
    return np.ascontiguousarray(blocks[row_map].transpose(0, 3, 1, 2, 4))


def pack_texel_scales(s: np.ndarray, rows: int, r: int, swiglu: bool) -> np.ndarray:
    """The scales (int4: [K / group, >= rows]; int8: [>= rows], one group) as
    linear_qw_texel.glsl reads them: [tiles, groups, RW / 4, 8, 4] of s's dtype, the
    scales of rows 4q .. 4q + 3 of each lane (``_texel_row_map``) as one vec4."""
    s = np.asarray(s).reshape(-1, s.shape[-1])[:, :rows]
    row_map = _texel_row_map(rows // 2 if swiglu else rows, r, swiglu)  # [T, RW, 8]
    packed = s[:, row_map]  # [G, T, RW, 8]
    tiles, rw = row_map.shape[:2]
    packed = packed.reshape(s.shape[0], tiles, rw // 4, 4, 8).transpose(1, 0, 2, 4, 3)
    return np.ascontiguousarray(packed)


def _texel_weight(w: np.ndarray, k: int, bits: int, r: int, swiglu: bool) -> np.ndarray:
    """``pack_texel_weight`` as int32 texels [-1, 4]."""
    return pack_texel_weight(w, k, bits, r, swiglu).view(np.int32).reshape(-1, 4)


def _texel_scales(s: np.ndarray, rows: int, r: int, swiglu: bool) -> np.ndarray:
    """``pack_texel_scales`` as texels [-1, 4]."""
    return pack_texel_scales(s, rows, r, swiglu).reshape(-1, 4)


def _texel_constant(b, t, pack, dtype: str, fmt: str):
    """Constant ``t`` in the shader's layout ``pack`` makes (4-value texels), packed
    once (NodeBuilder.packed_constant: pooled across methods, or over t's own
    buffer), viewed as ``fmt`` (whole texels); else a new constant of its own size."""
    packed = b.packed_constant(t, pack, dtype)
    if not b.texel_input(packed, fmt):
        packed = b.prepacked(pack(b.constant_array(t)), dtype)
    return packed


def _record_texel(b, x, w, s, bias, out, bits, group, k, n, m, residual=None,
                  swiglu=None, norm=None) -> None:
    """linear_qw_texel.glsl's dispatch (``texel_form`` said it can take the product,
    x is viewable); n: the output columns (SWIGLU: half the weight's rows); norm: None,
    or the RmsPrologue its RMS_NORM form folds in."""
    m_tile = 4 if m >= 4 else 1
    r = texel_rows(swiglu is not None, m_tile)
    kv = 32 if bits == 4 else 16
    group = group if bits == 4 else k
    rows = w.max_shape[0]
    loop_limit.check(b, k // kv + k // group + 8, f"K = {k}")
    if s.max_shape[-1] < rows or (s.ndim != 2 or s.max_shape[0] != k // group
                                  if bits == 4 else s.ndim != 1):
        raise b.error(f"weight scales {list(s.max_shape)} for K = {k}, N = {rows} and "
                      f"group size {group}")
    swiglu_rows = swiglu is not None
    wt = _texel_constant(b, w, functools.partial(_texel_weight, k=k, bits=bits, r=r,
                                                 swiglu=swiglu_rows), "int32", "rgba32ui")
    st = _texel_constant(b, s, functools.partial(_texel_scales, rows=rows, r=r,
                                                 swiglu=swiglu_rows),
                         s.dtype, "rgba16f" if _half(s) else "rgba32f")
    tiles = -(-n // (8 * r))
    params = [out.meta, b.params(PARAMS.pack(
        qdims=[k, n, 0, k // kv], qstrides=[0, group // kv, k // group, 0]))]
    inputs = [x, wt, st] + ([bias] if bias is not None else []) + \
        ([residual] if residual is not None else [])
    if norm is not None:
        inputs.append(norm.weight)
        params.append(b.params(NORM_PARAMS.pack(qnorm=[norm.eps, 0.0, 0.0, 0.0])))
    b.dispatch(TSHADER, texel_defines(out, x, st, bias, bits, m_tile, residual, swiglu,
                                      norm is not None),
               outputs=[out], inputs=inputs, params=params,
               global_size=(tiles * 8, -(-max(m, 1) // m_tile)), local_size=(TWG, 1, 1),
               grid=lambda: (tiles * 8, -(-max(_rows_of(out), 1) // m_tile)))


def vector_form(b, w, k: int, bits: int, group: int, m: int) -> bool:
    """Whether a weight-only product of ``m`` rows (upper bound) and K = ``k`` takes
    linear_qw_gemv.glsl on this device: the GEMV form (``use_gemv``) and a weight it
    can read (``vector_gemv``)."""
    return use_gemv(b.device.info, m) and vector_gemv(w, k, bits, group, w.max_shape[1])


def _record(b, node, x, w, s, bias, out, bits: int, group: int, dq=None,
            residual=None, swiglu=None, norm=None, rotary=None) -> None:
    """Record out = x @ dequant(w).T [+ bias] on the form for the device and sizes;
    ``residual`` (None, or a Tensor of out's shape and dtype) is added in the epilogue
    of every form (HAS_RESIDUAL). ``swiglu`` (None, or kernels/swiglu.py's defines;
    not with a residual): w is a merged gate/up
    weight [2F, ...], out [..., F] the chain over the product's halves, in every
    form's epilogue (SWIGLU). ``norm`` (None, or a kernels/gemm.py RmsPrologue; not
    with dq or a residual): the product of et_vk.rms_norm(x, norm.weight, norm.eps),
    folded into linear_qw_gemv.glsl (RMS_NORM) unless compile option
    ``rms_norm_prologue`` is off; every other form (linear_qw.glsl's GEMV and GEMM)
    reads the output of ``norm.unfused()``, the norm's own dispatch first. ``rotary``
    (None, or a kernels/rotary_cache.py RotaryCache; with or without ``norm``, nothing
    else): linear_qw_gemv.glsl's ROTARY epilogue, w a merged q/k/v weight of one row's
    product, out its ProductShape; only where ``vector_form`` holds (VkDelegateError,
    b.error, otherwise)."""
    rows = w.max_shape[0]  # weight rows: the product's columns
    n = rows // 2 if swiglu is not None else rows  # output columns
    k = x.max_shape[-1] if x.ndim else 1
    if swiglu is not None and (residual is not None or rows % 2):
        raise b.error(f"weights [{rows}, {w.max_shape[1]}]: no SwiGLU epilogue for "
                      f"this product")
    if norm is not None and (dq is not None or residual is not None):
        raise b.error("no RMS norm for this product")
    if rotary is not None and (residual is not None or swiglu is not None or rows % 2):
        raise b.error(f"weights [{rows}, {w.max_shape[1]}]: no rotary epilogue for this "
                      f"product")
    if bits == 4 and (k % 8 or group % 8 or k % group or w.max_shape[1] * 2 < k):
        raise b.error(f"int4 weights [{rows}, {w.max_shape[1]}] with group size {group} "
                      f"for K = {k}: K and the group size must be multiples of 8")
    if out.dtype != x.dtype or s.dtype != x.dtype:
        raise b.error(f"input {x.dtype}, scales {s.dtype}, output {out.dtype}: "
                      f"expected one dtype")
    m = out.max_numel // n if n else 0
    chunk = 8 if bits == 4 else (4 if _words((w.dtype, w.device_dtype), k, 8) else 1)
    chunks = k // chunk
    gemv = use_gemv(b.device.info, m)
    vector = vector_form(b, w, k, bits, group, m)
    if rotary is not None and not vector:
        raise b.error("the rotary epilogue needs linear_qw_gemv.glsl")
    texel = not gemv and texel_form(b, w, s, k, bits, group, dq, m, swiglu is not None)
    xfmt = _x_format(x)
    fold = texel and norm is not None and b.texel_input(x, xfmt) \
        and b.texel_input(norm.weight, xfmt)
    x, norm = norm_input(b, norm, x, vector or fold)
    if texel and b.texel_input(x, xfmt):
        _record_texel(b, x, w, s, bias, out, bits, group, k, n, m, residual, swiglu, norm)
        return
    if vector:
        _record_vector(b, x, w, s, bias, out, bits, group, k, n, m, dq, residual, swiglu,
                       norm, rotary)
        return
    loop_limit.check(b, -(-chunks // WG) + 8 if gemv else chunks, f"K = {k}")
    m_tile = 4 if m >= 4 else 1
    base = qlinear_defines(out, x, w, s, bias, bits, k, gemv, x.dtype == "float16", dq,
                           m_tile=m_tile, swiglu=swiglu, residual=residual)
    defines = base
    if dq is not None:
        defines = choose(SHADER, [dict(base, INT_DOT="1"), base],
                         b.device.info.capabilities)
    inputs = [x, w, s] + ([bias] if bias is not None else []) + (list(dq) if dq else []) \
        + ([residual] if residual is not None else [])
    s_stride = s.max_shape[1] if bits == 4 else rows
    w_stride = w.max_shape[1] // 4 if bits == 4 else chunks  # int4: words per row
    if bits == 4 and w.max_shape[1] % 4:
        raise b.error(f"int4 weights [{rows}, {w.max_shape[1]}]: rows of whole 32-bit "
                      f"words expected (K padded to a multiple of 8)")
    sums_stride = dq[2].max_shape[1] if dq is not None else 0
    if bits == 4 and (s.ndim != 2 or s_stride < rows or s.max_shape[0] != k // group):
        raise b.error(f"weight scales {list(s.max_shape)} for K = {k}, N = {rows} and "
                      f"group size {group}")
    params = [out.meta, b.params(PARAMS.pack(qdims=[k, n, group, chunks],
                                             qstrides=[s_stride, sums_stride, w_stride, 0]))]
    if gemv:
        per_group = NPW // 2 if swiglu is not None else NPW  # outputs per workgroup
        grid, local = (-(-n // per_group) * WG, max(m, 1)), (WG, 1, 1)
    else:
        grid, local = (-(-n // 4), -(-m // m_tile)), (8, 8, 1)
    if gemv:
        def now():
            return (grid[0], max(_rows_of(out), 1))
    else:
        def now():
            return (grid[0], -(-_rows_of(out) // m_tile))
    b.dispatch(SHADER, defines, outputs=[out], inputs=inputs, params=params,
               global_size=grid, local_size=local, grid=now)


def _rows_of(out) -> int:
    """The rows of product ``out`` [..., N] at its current sizes (every dim but the
    last)."""
    return math.prod(out.shape[:-1])


def _record_vector(b, x, w, s, bias, out, bits, group, k, n, m, dq=None,
                   residual=None, swiglu=None, norm=None, rotary=None) -> None:
    """linear_qw_gemv.glsl's dispatch; n: the output columns (SWIGLU: half the
    weight's rows; ROTARY: the weight's rows, N / 2 units); norm: None, or the
    RmsPrologue its RMS_NORM form folds in; rotary: None, or the RotaryCache of its
    ROTARY form (no SVEC: a unit's rows are not a run)."""
    rows = w.max_shape[0]
    blocks = k // (32 if bits == 4 else 16)
    sg = sg_rows(b.device.info)
    wg = workgroup_size(blocks, sg, b.device.info)
    if sg:  # a subgroup's units one after the other, each over its K by subgroup
        lanes = max(1, b.device.info.capabilities.min_subgroup_size)
        loop_limit.check(b, VROWS * (-(-blocks // (VUNROLL * lanes)) + 2), f"K = {k}")
    else:
        loop_limit.check(b, -(-blocks // wg) + 8, f"K = {k}")
    if bits == 4 and (s.ndim != 2 or s.max_shape[1] < rows or s.max_shape[0] != k // group):
        raise b.error(f"weight scales {list(s.max_shape)} for K = {k}, N = {rows} and "
                      f"group size {group}")
    s_stride = s.max_shape[1] if bits == 4 else rows
    paired = swiglu is not None or rotary is not None  # two weight rows per output
    rows = workgroup_rows(n // 2 if rotary is not None else n, paired, sg)
    svec = bits == 4 and rotary is None and not sg \
        and vector_scales(s, n, s_stride, swiglu is not None, rows)
    qx = _quantized_x(b, x, dq, blocks, m) if (VDIRECT or sg) else None
    defines = vector_defines(out, x, s, bias, bits, has_subgroup_arithmetic(b.device.info),
                             dq, svec, residual, swiglu, norm is not None,
                             None if rotary is None else rotary.defines, sg, rows, wg,
                             qx is not None)
    if qx is not None:
        x = qx  # QX_IN: bound in x's place
    if dq is not None:
        defines = choose(VSHADER, [dict(defines, INT_DOT="1"), defines],
                         b.device.info.capabilities)
    elif VHALF and bits == 4 and "X16" in defines:
        defines = choose(VSHADER, [half_dot(defines), defines], b.device.info.capabilities)
    sums_stride = dq[2].max_shape[1] if dq is not None else 0
    params = [out.meta, b.params(PARAMS.pack(
        qdims=[k, n, group, blocks], qstrides=[s_stride, sums_stride, w.max_shape[1] // 16, 0]))]
    inputs = [x, w, s] + ([bias] if bias is not None else []) + (list(dq) if dq else []) + \
        ([residual] if residual is not None else [])
    if norm is not None:
        inputs.append(norm.weight)
        params.append(b.params(NORM_PARAMS.pack(qnorm=[norm.eps, 0.0, 0.0, 0.0])))
    outputs, units = [out], n
    if rotary is not None:  # after the product's bindings (rotary_cache.bindings)
        outputs, units = rotary.outputs, n // 2
        inputs += rotary.inputs
        params.append(rotary.params)
    # outputs (ROTARY: units) per workgroup
    per_group = units_per_workgroup(paired, sg, rows)
    groups = -(-units // per_group)
    b.dispatch(VSHADER, defines, outputs=outputs, inputs=inputs, params=params,
               global_size=(groups * wg, max(m, 1)), local_size=(wg, 1, 1))


def _quantized_x(b, x, dq, blocks: int, m: int):
    """8da4w (dq not None): the rows of x already quantized by the dispatch of its
    qparams (choose_qparams' QX form, published under the quantized_x.key of dq's
    scale and zero point) when they cover this product's ``m`` rows of ``blocks`` int4
    blocks (K = 32 * blocks), else None (x is quantized as it is loaded)."""
    if dq is None:
        return None
    key = quantized_x.key(dq[0], dq[1])
    qx = b.published(key) if key is not None else None
    if qx is None or qx.max_shape[0] < max(m, 1) \
            or qx.max_shape[1] != quantized_x.words(32 * blocks):
        return None
    return qx


def _int8pack_impl(b, node):
    x_id, w_id, s_id, out_id = node.args
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id), None,
            b.tensor(out_id), 8, 0)


def _q4gsw_impl(b, node):
    x_id, w_id, s_id, gs_id, bias_id, out_id = node.args
    bias = b.value(bias_id)
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id), bias,
            b.tensor(out_id), 4, int(b.scalar(gs_id)))


def _dq8ca_impl(b, node):
    x_id, xs_id, xz_id, w_id, sums_id, s_id, gs_id, bias_id, out_id = node.args
    dq = (b.tensor(xs_id), b.tensor(xz_id), b.tensor(sums_id))
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id), b.value(bias_id),
            b.tensor(out_id), 4, int(b.scalar(gs_id)), dq)


# ---- rules and shapes -------------------------------------------------------------
def _int8pack_rule(node: NodeSpec):
    x, w, s = node.args[:3]
    if x.rank != 2 or w.rank != 2 or x.shape[1] != w.shape[1] or s.shape != (w.shape[0],):
        return f"input {list(x.shape)}, weight {list(w.shape)}, scales {list(s.shape)}"
    if x.dynamic and x.dynamic[-1]:
        return "dynamic input features"
    return None if s.dtype == x.dtype else f"scales {s.dtype} for input {x.dtype}"


def _q4_rule(node: NodeSpec, w_at: int, s_at: int, gs_at: int):
    x, w, s, gs = node.args[0], node.args[w_at], node.args[s_at], node.args[gs_at]
    bias = node.args[gs_at + 1]
    if x.rank < 1 or (x.dynamic and x.dynamic[-1]):
        return "input of rank 0 or with dynamic features"
    k, n = x.shape[-1], w.shape[0] if w.rank == 2 else -1
    if w.rank != 2 or not isinstance(gs, int) or gs <= 0 or gs % 8 or k % gs \
            or w.shape[1] * 2 < k or w.shape[1] % 4 or s.rank != 2 or s.shape[0] != k // gs \
            or s.shape[1] < n:
        return (f"input {list(x.shape)}, int4 weights {list(w.shape)}, scales "
                f"{list(s.shape)}, group size {gs}: K and the group size must be "
                f"multiples of 8, the group size divide K")
    if bias is not None and (bias.rank != 1 or bias.shape[0] < n):
        return f"bias of sizes {list(bias.shape)} for {n} outputs"
    if s.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return f"scales {s.dtype} / bias for input {x.dtype}"
    return None


def _dq8ca_rule(node: NodeSpec):
    x, xs, xz = node.args[:3]
    rows = 1
    for size in x.shape[:-1]:
        rows *= size
    per_row = x.rank >= 1 and tuple(xs.shape) in (tuple(x.shape[:-1]),
                                                  tuple(x.shape[:-1]) + (1,), (rows,))
    if not per_row or xz.shape != xs.shape or xs.is_dynamic != x.is_dynamic:
        return (f"input scales {list(xs.shape)} / zero points {list(xz.shape)}: expected "
                f"one per row of the input {list(x.shape)}")
    if xs.dtype != x.dtype:
        return f"input scales {xs.dtype} for input {x.dtype}"
    sums = node.args[4]
    n = node.args[3].shape[0] if node.args[3].rank == 2 else -1
    gs = node.args[6]
    if sums.rank != 2 or not isinstance(gs, int) or gs <= 0 \
            or sums.shape[0] != x.shape[-1] // gs or sums.shape[1] < n:
        return f"weight sums {list(sums.shape)} for K = {x.shape[-1]}, group size {gs}"
    return _q4_rule(node, 3, 5, 6)


def _shape(w_at: int):
    return lambda args: tuple(args[0].shape[:-1]) + (args[w_at].shape[0],)


register(OpSpec(name=INT8PACK, dtypes=DTYPES, impl=_int8pack_impl, shape_fn=_shape(1),
                rules=(_int8pack_rule,), arg_dtypes={1: frozenset({"int8"})}, max_rank=2,
                notes="int8 per-channel weight-only linear; GEMV (16-byte weight blocks "
                      "where K % 16 == 0, else 32-bit words) / GEMM forms; CPU drivers: "
                      "texel-buffer form (K % 16 == 0)"))
register(OpSpec(name=Q4GSW, dtypes=DTYPES, impl=_q4gsw_impl, shape_fn=_shape(1),
                rules=(lambda n: _q4_rule(n, 1, 2, 3),),
                arg_dtypes={1: frozenset({"uint8"})},
                notes="int4 group-wise weights two per byte (ET packing), groups of "
                      "8k; GEMV (16-byte blocks for groups of 32k) / GEMM forms; CPU "
                      "drivers: texel-buffer form (groups of 32k)"))
register(OpSpec(name=DQ8CA, dtypes=DTYPES, impl=_dq8ca_impl,
                shape_fn=_shape(3), rules=(_dq8ca_rule,),
                arg_dtypes={2: frozenset({"int8"}), 3: frozenset({"uint8"}),
                            4: frozenset({"int32"})},
                notes="8da4w: per-row int8 activations x int4 weights, integer "
                      "products (dotPacked4x8EXT with shaderIntegerDotProduct); "
                      "GEMV / GEMM forms"))


# ---- variants ---------------------------------------------------------------------
def _variants(profile, op: str, dtype: str, gemv: bool, bias: bool, odd_k: bool,
              m_tile: int = 4, chain: "str | None" = None, residual: bool = False):
    if op != INT8PACK and odd_k or residual and chain is not None:
        return None
    if chain is not None and chain not in swiglu_chains.CHAINS_FOR[dtype]:
        return None
    if op == INT8PACK and bias:
        return None
    pair = (dtype, device_dtype(dtype, profile))
    bits = 8 if op == INT8PACK else 4
    wdt = "int8" if bits == 8 else "uint8"
    w = (wdt, device_dtype(wdt, profile))
    k = 5 if odd_k else 8
    dq = None
    if op == DQ8CA:
        dq = (pair, ("int8", device_dtype("int8", profile)), ("int32", "int32"))
    if gemv and m_tile != 4:
        return None  # m_tile is the GEMM form's
    return qlinear_defines(pair, pair, w, pair, pair if bias else None, bits, k, gemv,
                           dtype == "float16", dq, m_tile=m_tile,
                           swiglu=None if chain is None else swiglu_chains.defines(chain,
                                                                                   dtype),
                           residual=pair if residual else None)


def _dq8ca_dot(profile, dtype: str, gemv: bool, bias: bool, m_tile: int,
               chain: "str | None", residual: bool):
    found = _variants(profile, DQ8CA, dtype, gemv, bias, False, m_tile, chain, residual)
    return None if found is None else dict(found, INT_DOT="1")


_AXES = dict(profile=STORAGE_PROFILES, gemv=(True, False), bias=(False, True),
             m_tile=(1, 4))
declare_grid(SHADER, _variants, **_AXES, op=(INT8PACK, Q4GSW, DQ8CA), dtype=DTYPES,
             odd_k=(False, True), chain=(None,) + swiglu_chains.CHAINS,
             residual=(False, True))
declare_grid(SHADER, _dq8ca_dot, requires=("shaderIntegerDotProduct",), **_AXES,
             dtype=DTYPES, chain=(None,) + swiglu_chains.CHAINS, residual=(False, True))


def _vector_variants(profile, op: str, dtype: str, bias: bool, subgroup: bool,
                     svec: bool = False, residual: bool = False,
                     chain: "str | None" = None, norm: bool = False, rotary: bool = False,
                     rows: "int | None" = None, wg: "int | None" = None, qx: bool = False):
    if op == INT8PACK and (bias or svec):
        return None
    if qx and (op != DQ8CA or not (VDIRECT or VSG_ROWS and subgroup)):
        return None  # QX_IN: 8da4w's DIRECT and SG_ROWS forms
    if norm and (op == DQ8CA or residual):
        return None  # RMS_NORM: the rms_norm_* forms of the weight-only products
    if chain is not None and (residual or chain not in swiglu_chains.CHAINS_FOR[dtype]):
        return None  # SWIGLU: the *_swiglu ops, no residual
    if rotary and (residual or chain is not None or svec):
        return None  # ROTARY: the *_rotary_cache forms (their norm folded in or not)
    pair = (dtype, device_dtype(dtype, profile))
    bits = 8 if op == INT8PACK else 4
    wdt = "int8" if bits == 8 else "uint8"
    if not vector_gemv((wdt, device_dtype(wdt, profile)), 32, bits, 32, 16):
        return None
    dq = None
    if op == DQ8CA:
        dq = (pair, ("int8", device_dtype("int8", profile)), ("int32", "int32"))
    if wg not in (None, VWG) and VSG_ROWS and subgroup:
        return None  # SG_ROWS takes VWG
    if svec and (VSG_ROWS and subgroup
                 or out_rows(chain is not None, rows)
                 % scales_per_load(pair, chain is not None, rows)):
        return None  # SG_ROWS reads no scales by vector loads
    # The rotary epilogue's cos/sin have the product's dtype, its positions either index
    # dtype.
    rotaries = [rotary_cache.defines(pair, (i, device_dtype(i, profile)), dtype)
                for i in rotary_cache.INDEX_DTYPES] if rotary else [None]
    return [vector_defines(pair, pair, pair, pair if bias else None, bits, subgroup, dq,
                           svec, pair if residual else None,
                           None if chain is None else swiglu_chains.defines(chain, dtype),
                           norm, r, rows=rows, wg=wg, qx=qx) for r in rotaries]


def _vector_dot(profile, dtype: str, bias: bool, subgroup: bool, svec: bool, rows: int,
                wg: int, residual: bool, chain: "str | None", rotary: bool, qx: bool):
    found = _vector_variants(profile, DQ8CA, dtype, bias, subgroup, svec, residual, chain,
                             rotary=rotary, rows=rows, wg=wg, qx=qx)
    return None if found is None else [dict(d, INT_DOT="1") for d in found]


#: workgroup_rows' choices: VROWS, halved down to 2 for products of few outputs.
_ROWS = tuple(r for r in (VROWS, VROWS // 2, VROWS // 4, VROWS // 8)
              if r >= 2 and (r == VROWS or VMIN_GROUPS))
#: workgroup_size's choices: VWG, and VWG_FIT for short rows.
_WGS = (VWG,) + ((VWG_FIT,) if 0 < VWG_FIT < VWG else ())
_VAXES = dict(profile=STORAGE_PROFILES, bias=(False, True), subgroup=(True, False),
              svec=(False, True), rows=_ROWS, wg=_WGS)
declare_grid(VSHADER, _vector_variants, **_VAXES, op=(INT8PACK, Q4GSW, DQ8CA), dtype=DTYPES,
             residual=(False, True), chain=(None,) + swiglu_chains.CHAINS,
             norm=(False, True), rotary=(False, True), qx=(False, True))
declare_grid(VSHADER, _vector_dot, requires=("shaderIntegerDotProduct",), **_VAXES,
             dtype=DTYPES, residual=(False, True), chain=(None,) + swiglu_chains.CHAINS,
             rotary=(False, True), qx=(False, True))


def _vector_half(profile, bias: bool, subgroup: bool, svec: bool, rows: int, wg: int,
                 residual: bool, chain: "str | None", norm: bool, rotary: bool):
    found = _vector_variants(profile, Q4GSW, "float16", bias, subgroup, svec, residual,
                             chain, norm, rotary, rows, wg)
    return None if found is None else [half_dot(d) for d in found if "X16" in d]


declare_grid(VSHADER, _vector_half, requires=("shaderFloat16",), **_VAXES,
             residual=(False, True), chain=(None,) + swiglu_chains.CHAINS,
             norm=(False, True), rotary=(False, True))


def _texel_variants(profile, op: str, dtype: str, bias: bool, m_tile: int,
                    residual: bool = False, chain: "str | None" = None, norm: bool = False):
    if op == INT8PACK and bias:
        return None
    if residual and (chain is not None or norm):
        return None  # the fused forms: _add, rms_norm_*, *_swiglu, rms_norm_*_swiglu
    if chain is not None and chain not in swiglu_chains.CHAINS_FOR[dtype]:
        return None
    pair = (dtype, device_dtype(dtype, profile))
    return texel_defines(pair, pair, pair, pair if bias else None, 8 if op == INT8PACK else 4,
                         m_tile, pair if residual else None,
                         None if chain is None else swiglu_chains.defines(chain, dtype),
                         norm)


declare_grid(TSHADER, _texel_variants, profile=STORAGE_PROFILES, op=(INT8PACK, Q4GSW),
             dtype=DTYPES, bias=(False, True), m_tile=(1, 4), residual=(False, True),
             chain=(None,) + swiglu_chains.CHAINS, norm=(False, True))


# ---- vkdelegate.linear_q4gsw_add.default: residual + linear_q4gsw (kernels/residual.py)
Q4GSW_ADD = "vkdelegate.linear_q4gsw_add.default"


def _q4gsw_add_impl(b, node):
    x_id, w_id, s_id, gs_id, bias_id, r_id, out_id = node.args
    out, r = residual.residual_tensor(b, out_id, r_id)
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id),
            b.value(bias_id), out, 4, int(b.scalar(gs_id)), residual=r)


def _q4_add_shape(args):
    return tuple(args[0].shape[:-1]) + (args[1].shape[0],)


register(OpSpec(name=Q4GSW_ADD, dtypes=DTYPES, impl=_q4gsw_add_impl, shape_fn=_q4_add_shape,
                rules=(lambda n: _q4_rule(n, 1, 2, 3), residual.residual_rule(5)),
                arg_dtypes={1: frozenset({"uint8"})},
                notes="residual + linear_q4gsw(...): the add in every form's epilogue "
                      "(one dispatch); fused from aten.add.Tensor"))


# ---- vkdelegate.linear_dq8ca_q4gsw_add.default: residual + linear_dq8ca_q4gsw -------
DQ8CA_ADD = "vkdelegate.linear_dq8ca_q4gsw_add.default"


def _dq8ca_add_impl(b, node):
    x_id, xs_id, xz_id, w_id, sums_id, s_id, gs_id, bias_id, r_id, out_id = node.args
    out, r = residual.residual_tensor(b, out_id, r_id)
    dq = (b.tensor(xs_id), b.tensor(xz_id), b.tensor(sums_id))
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id),
            b.value(bias_id), out, 4, int(b.scalar(gs_id)), dq, residual=r)


register(OpSpec(name=DQ8CA_ADD, dtypes=DTYPES, impl=_dq8ca_add_impl, shape_fn=_shape(3),
                rules=(_dq8ca_rule, residual.residual_rule(8)),
                arg_dtypes={2: frozenset({"int8"}), 3: frozenset({"uint8"}),
                            4: frozenset({"int32"})},
                notes="residual + linear_dq8ca_q4gsw(...) (8da4w): the add in every "
                      "form's epilogue (one dispatch); fused from aten.add.Tensor"))


# ---- vkdelegate.weight_int8pack_mm_add.default: residual + _weight_int8pack_mm -----
INT8PACK_ADD = "vkdelegate.weight_int8pack_mm_add.default"


def _int8pack_add_impl(b, node):
    x_id, w_id, s_id, r_id, out_id = node.args
    out, r = residual.residual_tensor(b, out_id, r_id)
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id), None, out, 8, 0,
            residual=r)


register(OpSpec(name=INT8PACK_ADD, dtypes=DTYPES, impl=_int8pack_add_impl,
                shape_fn=_shape(1), rules=(_int8pack_rule, residual.residual_rule(3)),
                arg_dtypes={1: frozenset({"int8"})}, max_rank=2,
                notes="residual + _weight_int8pack_mm(...): the add in every form's "
                      "epilogue (one dispatch); fused from aten.add.Tensor"))


# ---- the SwiGLU chain in the epilogue (kernels/swiglu.py) -----------------------------
# vkdelegate.linear_q4gsw_swiglu(self, weights [2F, K/2], weight_scales, group_size,
# bias?, steps) and vkdelegate.weight_int8pack_mm_swiglu(self, mat2 [2F, K], scales,
# steps): the merged gate/up product's halves combined by the SwiGLU chain -> [..., F].
Q4GSW_SWIGLU = "vkdelegate.linear_q4gsw_swiglu.default"
INT8PACK_SWIGLU = "vkdelegate.weight_int8pack_mm_swiglu.default"


def _q4gsw_swiglu_impl(b, node):
    x_id, w_id, s_id, gs_id, bias_id, steps_id, out_id = node.args
    out = b.tensor(out_id)
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id), b.value(bias_id), out,
            4, int(b.scalar(gs_id)), swiglu=swiglu_chains.node_defines(b, steps_id, out.dtype))


def _int8pack_swiglu_impl(b, node):
    x_id, w_id, s_id, steps_id, out_id = node.args
    out = b.tensor(out_id)
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id), None, out, 8, 0,
            swiglu=swiglu_chains.node_defines(b, steps_id, out.dtype))


register(OpSpec(name=Q4GSW_SWIGLU, dtypes=DTYPES, impl=_q4gsw_swiglu_impl,
                shape_fn=swiglu_chains.halves_shape(1),
                rules=(lambda n: _q4_rule(n, 1, 2, 3), swiglu_chains.halves_rule(1, 5, 4)),
                arg_dtypes={1: frozenset({"uint8"})},
                notes="SwiGLU chain over the halves of a merged gate/up linear_q4gsw "
                      "(weights [2F, K/2]) -> [..., F]: the chain in every form's "
                      "epilogue (one dispatch); fused from the linear's narrow_last "
                      "parts and vkdelegate.fused_elementwise"))


def _dq8ca_swiglu_impl(b, node):
    x_id, xs_id, xz_id, w_id, sums_id, s_id, gs_id, bias_id, steps_id, out_id = node.args
    out = b.tensor(out_id)
    dq = (b.tensor(xs_id), b.tensor(xz_id), b.tensor(sums_id))
    _record(b, node, b.tensor(x_id), b.tensor(w_id), b.tensor(s_id), b.value(bias_id), out,
            4, int(b.scalar(gs_id)), dq,
            swiglu=swiglu_chains.node_defines(b, steps_id, out.dtype))


DQ8CA_SWIGLU = "vkdelegate.linear_dq8ca_q4gsw_swiglu.default"
register(OpSpec(name=DQ8CA_SWIGLU, dtypes=DTYPES, impl=_dq8ca_swiglu_impl,
                shape_fn=swiglu_chains.halves_shape(3),
                rules=(_dq8ca_rule, swiglu_chains.halves_rule(3, 8, 7)),
                arg_dtypes={2: frozenset({"int8"}), 3: frozenset({"uint8"}),
                            4: frozenset({"int32"})},
                notes="SwiGLU chain over the halves of a merged gate/up "
                      "linear_dq8ca_q4gsw (8da4w; weights [2F, K/2]) -> [..., F]: the "
                      "chain in every form's epilogue (one dispatch); fused from the "
                      "product's narrow_last parts and vkdelegate.fused_elementwise"))
register(OpSpec(name=INT8PACK_SWIGLU, dtypes=DTYPES, impl=_int8pack_swiglu_impl,
                shape_fn=swiglu_chains.halves_shape(1),
                rules=(_int8pack_rule, swiglu_chains.halves_rule(1, 3, None)),
                arg_dtypes={1: frozenset({"int8"})}, max_rank=2,
                notes="SwiGLU chain over the halves of a merged gate/up "
                      "_weight_int8pack_mm (mat2 [2F, K]) -> [M, F]: the chain in every "
                      "form's epilogue (one dispatch); fused from the product's "
                      "narrow_last parts and vkdelegate.fused_elementwise"))


# ---- the RMS norm folded into the product (vkdelegate.rms_norm_*) ----------------------
# vkdelegate.rms_norm_linear_q4gsw(x, norm_weight, eps, weights, weight_scales,
# group_size, bias?) and vkdelegate.rms_norm_weight_int8pack_mm(x [M, K], norm_weight,
# eps, mat2, scales): the plain products of et_vk.rms_norm(x, norm_weight, eps);
# their _swiglu forms (..., steps) the SwiGLU forms' of it. linear_qw_gemv.glsl's
# RMS_NORM folds the norm in (one dispatch); the other forms record the norm's dispatch
# (ops/families/norm.py) first.
RMS_Q4GSW = "vkdelegate.rms_norm_linear_q4gsw.default"
RMS_Q4GSW_SWIGLU = "vkdelegate.rms_norm_linear_q4gsw_swiglu.default"
RMS_INT8PACK = "vkdelegate.rms_norm_weight_int8pack_mm.default"
RMS_INT8PACK_SWIGLU = "vkdelegate.rms_norm_weight_int8pack_mm_swiglu.default"


def _norm_rule(node: NodeSpec):
    """The norm's arguments (x, norm_weight [K], eps; ops/families/norm.py's rule) and
    a norm weight of x's dtype."""
    why = rms_input_rule(node)
    if why is not None:
        return why
    x, nw = node.args[:2]
    return None if nw.dtype == x.dtype else f"norm_weight {nw.dtype} for input {x.dtype}"


def _rms_int8pack_rule(node: NodeSpec):
    """_int8pack_rule for (self, mat2, scales), the fused norm's arguments between."""
    return _int8pack_rule(dataclasses.replace(node, args=(node.args[0],) + node.args[3:5]))


def _rms_q4gsw_impl(b, node):
    x_id, nw_id, eps_id, w_id, s_id, gs_id, bias_id = node.args[:7]
    x, out = b.tensor(x_id), b.tensor(node.args[-1])
    swiglu = swiglu_chains.node_defines(b, node.args[7], out.dtype) if len(node.args) == 9 else None
    _record(b, node, x, b.tensor(w_id), b.tensor(s_id), b.value(bias_id), out, 4,
            int(b.scalar(gs_id)), swiglu=swiglu,
            norm=rms_prologue(b, node, x, nw_id, eps_id))


def _rms_int8pack_impl(b, node):
    x_id, nw_id, eps_id, w_id, s_id = node.args[:5]
    x, out = b.tensor(x_id), b.tensor(node.args[-1])
    swiglu = swiglu_chains.node_defines(b, node.args[5], out.dtype) if len(node.args) == 7 else None
    _record(b, node, x, b.tensor(w_id), b.tensor(s_id), None, out, 8, 0, swiglu=swiglu,
            norm=rms_prologue(b, node, x, nw_id, eps_id))


_RMS_NOTE = ("the norm folded into the int{bits} vectorized GEMV and the texel-buffer "
             "form (x times the norm weight as loaded, its squares summed with the "
             "products, each sum scaled by 1 / rms; one dispatch), else the norm's "
             "dispatch first; fused from et_vk.rms_norm -> {source}")
register(OpSpec(name=RMS_Q4GSW, dtypes=DTYPES, impl=_rms_q4gsw_impl, shape_fn=_shape(3),
                rules=(_norm_rule, lambda n: _q4_rule(n, 3, 4, 5)),
                arg_dtypes={3: frozenset({"uint8"})},
                notes="linear_q4gsw(et_vk.rms_norm(x, w, eps), ...): "
                      + _RMS_NOTE.format(bits=4, source="et_vk.linear_q4gsw")))
register(OpSpec(name=RMS_Q4GSW_SWIGLU, dtypes=DTYPES, impl=_rms_q4gsw_impl,
                shape_fn=swiglu_chains.halves_shape(3),
                rules=(_norm_rule, lambda n: _q4_rule(n, 3, 4, 5),
                       swiglu_chains.halves_rule(3, 7, 6)),
                arg_dtypes={3: frozenset({"uint8"})},
                notes="linear_q4gsw_swiglu(et_vk.rms_norm(x, w, eps), ...) -> [..., F]: "
                      "the norm, the merged gate/up int4 product and the chain in one "
                      "dispatch on the vectorized GEMV and the texel-buffer form, else "
                      "the norm's dispatch first; fused from rms_norm_linear_q4gsw and a "
                      "SwiGLU chain"))
register(OpSpec(name=RMS_INT8PACK, dtypes=DTYPES, impl=_rms_int8pack_impl,
                shape_fn=_shape(3), rules=(_norm_rule, _rms_int8pack_rule),
                arg_dtypes={3: frozenset({"int8"})}, max_rank=2,
                notes="_weight_int8pack_mm(et_vk.rms_norm(x, w, eps), ...): "
                      + _RMS_NOTE.format(bits=8, source="(view ->) "
                                                        "aten._weight_int8pack_mm")))
register(OpSpec(name=RMS_INT8PACK_SWIGLU, dtypes=DTYPES, impl=_rms_int8pack_impl,
                shape_fn=swiglu_chains.halves_shape(3),
                rules=(_norm_rule, _rms_int8pack_rule,
                       swiglu_chains.halves_rule(3, 5, None)),
                arg_dtypes={3: frozenset({"int8"})}, max_rank=2,
                notes="weight_int8pack_mm_swiglu(et_vk.rms_norm(x, w, eps), ...) -> "
                      "[M, F]: the norm, the merged gate/up int8 product and the chain "
                      "in one dispatch on the vectorized GEMV and the texel-buffer form, "
                      "else the norm's dispatch first; fused from "
                      "rms_norm_weight_int8pack_mm and a SwiGLU chain"))


# ---- the rotary embedding and K/V cache writes in the epilogue (kernels/rotary_cache.py)
# vkdelegate.rms_norm_linear_q4gsw_rotary_cache(x, norm_weight, eps, weights,
# weight_scales, group_size, bias?, cos, sin, cache, cache2, indices, q_sizes, kv_sizes)
# and vkdelegate.rms_norm_weight_int8pack_mm_rotary_cache(x [1, K], norm_weight, eps,
# mat2, scales, cos, ..., kv_sizes) -> (q', cache', cache2'): the int4 / int8 forms of
# vkdelegate.rms_norm_linear_rotary_cache (ops/families/cache_update.py): a decode
# layer's input norm, its merged q/k/v product of one row, the rotary embedding of q
# and k and the K/V cache writes. Made by backend/passes/fuse_linear_rotary_cache.py.
# Where the product takes linear_qw_gemv.glsl (``vector_form``: GPUs) one dispatch, its
# ROTARY epilogue (the norm folded in unless compile option ``rms_norm_prologue`` is
# off: then the norm's dispatch first); elsewhere (CPU drivers: linear_qw_texel.glsl;
# linear_qw.glsl's forms) the unfused pair's dispatches: the product (with its norm, as
# rms_norm_linear_q4gsw / rms_norm_weight_int8pack_mm record it) into a scratch row,
# then rotary_scatter_pair.glsl. Both give every element the bits of the unfused pair
# on the same form (tests/ops/test_quantized_rotary_cache.py).
RMS_Q4GSW_ROTARY = "vkdelegate.rms_norm_linear_q4gsw_rotary_cache.default"
RMS_INT8PACK_ROTARY = "vkdelegate.rms_norm_weight_int8pack_mm_rotary_cache.default"
DQ8CA_ROTARY = "vkdelegate.linear_dq8ca_q4gsw_rotary_cache.default"


def _record_rotary(b, node, at: int, bias, bits: int, group: int, s_at: int = 4,
                   dq8ca: bool = False) -> None:
    """Record a *_rotary_cache node (its product's weight and scales at arguments 3 and
    ``s_at``, cos and the rest from ``at``; the norm's weight and eps at 1 and 2, or
    with ``dq8ca`` x's scales and zero points there and the weight sums at 4)."""
    x, w, s = (b.tensor(i) for i in (node.args[0], node.args[3], node.args[s_at]))
    write = rotary_cache.CacheWrite(b, node, at, x, w.max_shape[0])
    if dq8ca:
        norm, dq = None, tuple(b.tensor(node.args[i]) for i in (1, 2, 4))
    else:
        norm, dq = rms_prologue(b, node, x, node.args[1], node.args[2]), None
    if vector_form(b, w, x.max_shape[-1], bits, group, 1):
        product, rotary = write.fused(b)
        _record(b, node, x, w, s, bias, product, bits, group, dq, norm=norm, rotary=rotary)
        return
    y = write.product_row(b)
    _record(b, node, x, w, s, bias, y, bits, group, dq, norm=norm)
    write.unfused(b, y)


def _rms_q4gsw_rotary_impl(b, node):
    _record_rotary(b, node, 7, b.value(node.args[6]), 4, int(b.scalar(node.args[5])))


def _rms_int8pack_rotary_impl(b, node):
    _record_rotary(b, node, 5, None, 8, 0)


def _dq8ca_rotary_impl(b, node):
    _record_rotary(b, node, 8, b.value(node.args[7]), 4, int(b.scalar(node.args[6])), 5,
                   dq8ca=True)


_ROTARY_NOTE = ("rotary_index_put_pair of the q/k/v parts of a one-row {product} (a "
                "decode layer's norm, int{bits} q/k/v GEMV, rotary and K/V cache "
                "writes): one dispatch on the vectorized GEMV (the rotary pairs and "
                "cache writes in its epilogue), else the unfused pair's; bitwise the "
                "pair's")
register(OpSpec(name=RMS_Q4GSW_ROTARY, dtypes=DTYPES, impl=_rms_q4gsw_rotary_impl,
                shape_fn=rotary_cache.shape(7),
                rules=(_norm_rule, lambda n: _q4_rule(n, 3, 4, 5),
                       rotary_cache.rule(7, 3, (1, 4, 6))),
                arg_dtypes={3: frozenset({"uint8"}), 11: INDEX_DTYPES}, max_rank=4,
                notes=_ROTARY_NOTE.format(product="rms_norm_linear_q4gsw", bits=4)))
register(OpSpec(name=DQ8CA_ROTARY, dtypes=DTYPES, impl=_dq8ca_rotary_impl,
                shape_fn=rotary_cache.shape(8),
                rules=(_dq8ca_rule, rotary_cache.rule(8, 3, (1, 5, 7))),
                arg_dtypes={2: frozenset({"int8"}), 3: frozenset({"uint8"}),
                            4: frozenset({"int32"}), 12: INDEX_DTYPES}, max_rank=4,
                notes="rotary_index_put_pair of the q/k/v parts of a one-row "
                      "linear_dq8ca_q4gsw (8da4w; a decode layer's q/k/v GEMV, rotary "
                      "and K/V cache writes): one dispatch on the vectorized GEMV (the "
                      "rotary pairs and cache writes in its epilogue), else the unfused "
                      "pair's; bitwise the pair's"))
register(OpSpec(name=RMS_INT8PACK_ROTARY, dtypes=DTYPES, impl=_rms_int8pack_rotary_impl,
                shape_fn=rotary_cache.shape(5),
                rules=(_norm_rule, _rms_int8pack_rule, rotary_cache.rule(5, 3, (1, 4))),
                arg_dtypes={3: frozenset({"int8"}), 9: INDEX_DTYPES}, max_rank=4,
                notes=_ROTARY_NOTE.format(product="rms_norm_weight_int8pack_mm", bits=8)))
