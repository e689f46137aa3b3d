"""The GEMM entry point: every matrix product of the op families is chosen and
recorded here (aten.mm, aten.bmm, aten.addmm, aten.linear), and the form of the
pointwise (1x1) convolution's GEMM is chosen here too.

Per the device type's row of the tile table (kernels/gemm_tiles.py): on GPUs two
shaders,

- gemm.glsl, the GEMM core: 16 x 16 workgroups computing 16 TM x 16 TN blocks
  through vec4 shared-memory tiles with register prefetch, batch broadcast, bias,
  alpha/beta and b as [K, N] or [N, K] (the tile table picks TM, TN, BK, vec4 global
  loads, and split-K for few blocks and a long K: gemm_reduce.glsl adds the parts).
- gemm_coopmat.glsl, the core's cooperative-matrix form, in place of gemm.glsl for
  fp16 products on devices with VK_KHR_cooperative_matrix (16 x 16 x 16 FLOAT16 ->
  FLOAT32 tiles, one fixed subgroup size: gemm_core.coopmat_subgroup); where the
  tile row names a ``coop_wg`` block and the device has VK_NV_cooperative_matrix2
  (workgroup scope, tensor addressing), gemm_coopmat_wg.glsl for the large products
  (one matrix per workgroup, loads staged by the driver).
- gemv.glsl, the GEMV path for one-row products (LLM decode): the K reduction split
  across a workgroup's invocations, vector loads of a constant B; with an
  ``RmsPrologue`` (vkdelegate.rms_norm_linear) the row RMS-normalized first, in the
  same dispatch.

kernels/gemm_core.py records those three (``record_core``).

On CPU drivers (llvmpipe) the core for aten.mm, else three shaders, plus one path
of a fourth:

- matmul.glsl: one invocation per output (CPU drivers, tiny outputs); loops K times.
- matmul_tiled.glsl: TILE x TILE workgroups staging blocks of both operands in shared
  memory, REG x REG outputs per invocation; loops K / TILE times (one-row products
  whose K is past the simple shader's loop budget).
- linear.glsl: a batched product with broadcasting batch dims, an optional bias and
  alpha/beta, 4 x 4 (or 1 x 4) output tiles per invocation and an unrolled LONG_K
  form for K past llvmpipe's loop budget; HAS_RESIDUAL adds a residual of the
  output's shape in the epilogue (vkdelegate.linear_add, as gemv.glsl does); SWIGLU
  combines a merged gate/up weight's column pairs by the SwiGLU chain in the epilogue
  (vkdelegate.linear_swiglu, as gemv.glsl does; ``swiglu`` below). A prepacked weight
  and the A_VEC4 rows are read as uniform texel buffers where the device can view
  them (B_TEXEL, A_TEXEL; ``texel_operands``, runtime/texel.py).
- conv2d.glsl's POINTWISE path (pixels x input channels x output channels, OC_TILE
  output channels and PX pixels per invocation, an unrolled LONG_LOOPS form past the
  budget): chosen here, declared and recorded by ops/families/convolution.py, which
  owns the rest of that shader.

``select`` is the one place that decides which shader and form a product gets;
``mm`` and ``matmul`` record it. fp32 and fp16 data, accumulated in fp32. Torch-free;
registers no op (the op families in ops/families/matmul.py and linear.py do).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from vkdelegate.kernels import gemm_core, loop_limit
from vkdelegate.kernels import swiglu as swiglu_chains
from vkdelegate.kernels.gemm_core import (COOPMAT_SHADER, COOPMAT_WG_SHADER, CORE_SHADER,
                                          GEMM_SHADERS, GEMV_SHADER, GEMV_THREADS,
                                          LINEAR_SCALARS, coopmat_subgroup,
                                          coopmat_threads, record_core)
from vkdelegate.kernels.gemm_tiles import tiles_for
from vkdelegate.kernels.workgroup import workgroup_for
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, acc_type, device_dtype, storage_defines
from vkdelegate.runtime.param_block import tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SIMPLE_SHADER = "matmul"
TILED_SHADER = "matmul_tiled"
LINEAR_SHADER = "linear"
CONV_SHADER = "conv2d"
CONV_PX = 8  # pixels per invocation of conv2d.glsl's POINTWISE path (its PX)
TILE = 16
REG = 4  # outputs per invocation per dim in the register-blocked tiled shader
DTYPES = frozenset({"float32", "float16"})
#: Whether fp16 products take gemm_coopmat_wg.glsl where the tile table and the device
#: allow it (``_workgroup_scope``); benchmarks/forms.py's gemm.WORKGROUP_SCOPE=false
#: (llm_decode.py rows, efficientnet.py --form) compares the subgroup form in one run.
WORKGROUP_SCOPE = True


@dataclass(frozen=True)
class GemmForm:
    """The kernel a product runs: ``shader`` (one of those above), ``tile`` (the
    tiled shader's REG, linear.glsl's M_TILE rows per invocation, conv2d.glsl's
    OC_TILE output channels per invocation; 1 for the simple shader) and ``long_k``
    (linear.glsl's LONG_K form, 16 K steps per iteration; conv2d.glsl's LONG_LOOPS
    form, 4 input channels per iteration)."""

    shader: str
    tile: int = 1
    long_k: bool = False
    block: tuple = ()  # core: (TM, TN, BK); gemm_coopmat: (BM, BN, BK, WM, WN, STAGES)
    vec_load: bool = False  # the core's VEC_LOAD (vec4 global loads where aligned)
    splits: int = 1  # the core's split-K parts (SPLIT_K, then gemm_reduce.glsl)
    threads: int = 0  # gemm_coopmat(_wg).glsl's invocations per workgroup

    def iterations(self, k: int) -> int:
        """Loop iterations one invocation of this form runs for a K of ``k``."""
        if self.shader in (COOPMAT_SHADER, COOPMAT_WG_SHADER):
            return -(-k // self.block[2]) + 1
        if self.shader == CORE_SHADER:
            return -(-k // (self.block[2] * self.splits)) + 1
        if self.shader == GEMV_SHADER:
            return -(-k // min(GEMV_THREADS.values()))
        if self.shader == TILED_SHADER:
            return -(-k // TILE)
        if self.shader == CONV_SHADER:
            # Plain: per channel one load and PX accumulations, then bias and stores;
            # LONG_LOOPS: only the 4-channel loop and its remainder count.
            return k // 4 + 3 if self.long_k else k * (1 + CONV_PX) + 2 * CONV_PX
        return loop_limit.unrolled_iterations(k) if self.long_k else k


@dataclass(frozen=True)
class RmsPrologue:
    """The RMS norm before a product (vkdelegate.rms_norm_linear and the other
    rms_norm_* ops): a's rows become et_vk.rms_norm(a, weight, eps). ``weight``: the
    norm weight Tensor [K] (a's dtype); ``unfused``: ``() -> Tensor``, records the
    separate norm dispatch of a (norm.glsl; kernels/norm_dispatch.py) and returns its
    output, for the forms that do not fold the norm in (``norm_input``)."""

    weight: object
    eps: float
    unfused: Callable


#: The compile option (backend/options.py) that turns the fold off (NodeBuilder.option).
RMS_PROLOGUE_OPTION = "rms_norm_prologue"


def norm_input(b, norm: "RmsPrologue | None", x, can_fold: bool):
    """(the product's input, the norm to fold or None) for a product of
    et_vk.rms_norm(x, ...) (``norm``; None: of x itself): the norm folds into the
    product's kernel where the form chosen can (``can_fold``) and compile option
    ``rms_norm_prologue`` is on; otherwise ``norm.unfused()`` records the norm's own
    dispatch first and the product reads its output. The one place the three
    recorders (``matmul``, ``swiglu``, ops/families/quantized_linear.py) decide it."""
    if norm is None:
        return x, None
    if can_fold and b.option(RMS_PROLOGUE_OPTION, True):
        return x, norm
    return norm.unfused(), None


def use_tiled(info, m: int, n: int, k: int = 0) -> bool:
    """Shared-memory tiles pay off on GPUs (each loaded element is used TILE times).
    On CPU drivers (llvmpipe) a workgroup barrier costs more than the reuse saves: the
    tiled shader measured 2.6x slower there at 256x512x256, so they get the simple one
    unless K is longer than its loop may run. Outputs smaller than a tile gain
    nothing."""
    if loop_limit.over_budget(k):
        return True
    return info.type != "cpu" and m * n >= TILE * TILE


def register_block(m: int, n: int) -> int:
    """Outputs per invocation per dim in the tiled shader: 4 (a 64 x 64 block per
    workgroup) once the output has enough such blocks to fill a large GPU (H200:
    slower at 256 x 256 with 16 blocks, 1.7x faster at 1024 x 1024), else 1."""
    return REG if m * n >= 512 * 512 else 1


def select(info, m: int, n: int, k: int, *, plain: bool,
           pointwise_conv: bool = False, batch: int = 1, dtype: str = "float32",
           nk: bool = False) -> GemmForm:
    """The form of a ``batch`` of [m, k] x [k, n] products (upper-bound sizes) on the
    device ``info`` (a DeviceInfo). Where the tile table (kernels/gemm_tiles.py) has a
    row for the device type: the GEMV path for one row (m == 1), else for ``dtype``
    float16 on a device with cooperative matrices (gemm_core.coopmat_subgroup) and
    the row's ``coopmat`` the core's cooperative-matrix form with the row's
    ``coop_block`` (where its shared memory, gemm_core.coopmat_shared_bytes, fits
    the device's ``max_shared_memory``), else the GEMM core with the row's block for that output (and its VEC_LOAD choice for graph dtype
    ``dtype`` and b [N, K] when ``nk``), both per the row's ``plain_only`` and
    ``gemv``. Otherwise:
    plain: two matrices, no batch, bias or scaling (aten.mm),
    which the matmul shaders run; every other product runs linear.glsl, whose rows per
    invocation share each load of the second operand (a single row, a classifier's
    batch of one, would waste 3 of 4). pointwise_conv: a 1x1 convolution with a
    prepacked constant weight (m pixels, k input channels, n output channels; plain is
    ignored), which runs conv2d.glsl's POINTWISE path with 4 output channels per
    invocation when n allows it and LONG_LOOPS past the loop budget."""
    if pointwise_conv:
        tile = 4 if n % 4 == 0 else 1
        plain_form = GemmForm(CONV_SHADER, tile)
        return GemmForm(CONV_SHADER, tile, loop_limit.over_budget(plain_form.iterations(k)))
    tiles = tiles_for(info.type)
    if tiles is not None and (plain or not tiles.plain_only):
        if m == 1 and tiles.gemv:
            return GemmForm(GEMV_SHADER, tiles.gemv_rows)
        subgroup = coopmat_subgroup(info.capabilities) if tiles.coopmat else 0
        if m != 1 and dtype == "float16" and subgroup:
            block = tiles.coop_block(batch, m, n)
            shared = getattr(info, "max_shared_memory", 0)  # 0: not known, assume it fits
            if not shared or gemm_core.coopmat_shared_bytes(block, nk) <= shared:
                form = GemmForm(COOPMAT_SHADER, block=block,
                                threads=coopmat_threads(block, subgroup))
                return _workgroup_scope(info, tiles, form, batch, m, n, k)
        if m != 1:
            block = tiles.core_block(batch, m, n, dtype)
            return GemmForm(CORE_SHADER, block=block,
                            vec_load=tiles.uses_vec_load(dtype, nk, block),
                            splits=tiles.splits(batch, m, n, k, block))
    if plain:
        if use_tiled(info, m, n, k):
            return GemmForm(TILED_SHADER, register_block(m, n))
        return GemmForm(SIMPLE_SHADER)
    return GemmForm(LINEAR_SHADER, 4 if m >= 4 else 1, loop_limit.over_budget(k))


def _workgroup_scope(info, tiles, form: GemmForm, batch: int, m: int, n: int,
                     k: int) -> GemmForm:
    """gemm_coopmat_wg.glsl in place of ``form`` (gemm_coopmat.glsl's) where
    WORKGROUP_SCOPE is on, the tile row has a workgroup-scope block for the output
    (``coop_wg_block``), the device runs it (gemm_core.coopmat_wg_threads) and the
    product has at least ``coop_wg_min_macs`` multiply-adds (upper bounds)."""
    block = tiles.coop_wg_block(batch, m, n)
    if not WORKGROUP_SCOPE or not block or batch * m * n * k < tiles.coop_wg_min_macs:
        return form
    threads = gemm_core.coopmat_wg_threads(info.capabilities, block)
    if not threads:
        return form
    return GemmForm(COOPMAT_WG_SHADER, block=block, threads=threads)


def checked_select(b, m: int, n: int, k: int, *, plain: bool,
                   pointwise_conv: bool = False, what: str | None = None,
                   batch: int = 1, dtype: str = "float32", nk: bool = False) -> GemmForm:
    """``select`` on the node builder ``b``'s device, then the loop-budget check of the
    form chosen. Raises DeviceLimitError (b.error) naming ``what`` (default "K = k")
    when even that form loops past llvmpipe's budget."""
    form = select(b.device.info, m, n, k, plain=plain, pointwise_conv=pointwise_conv,
                  batch=batch, dtype=dtype, nk=nk)
    loop_limit.check(b, form.iterations(k), what or f"K = {k}")
    return form


# ---- aten.mm: matmul.glsl / matmul_tiled.glsl ---------------------------------------
def mm_defines(out, a, b, dtype: str, transposed: bool) -> dict:
    """Defines of both matmul shaders; ``transposed``: b is a prepacked [N, K]."""
    return dict(storage_defines(OUT=out, A=a, B=b), ACC_T=acc_type(dtype),
                **flag_defines(B_TRANSPOSED=transposed))


@shader_bindings(SIMPLE_SHADER)
@shader_bindings(TILED_SHADER)
def _mm_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("a_data", "b_data"),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("a_meta")))


def mm(b, out, a, w, transposed: bool) -> None:
    """Record out [M, N] = a [M, K] @ w, w being [K, N] (or [N, K] when
    ``transposed``). Raises DeviceLimitError (b.error) when K is longer than even the
    tiled shader can loop on llvmpipe."""
    defines = mm_defines(out, a, w, out.dtype, transposed)
    m, n = out.max_shape
    form = checked_select(b, m, n, a.max_shape[1], plain=True, dtype=out.dtype,
                          nk=transposed)
    if form.shader in GEMM_SHADERS + (GEMV_SHADER,):
        record_core(b, form, out, a, w, None, "nk" if transposed else "kn")
        return
    if form.shader == TILED_SHADER:
        b.dispatch(TILED_SHADER, dict(defines, TILE=str(TILE), REG=str(form.tile)),
                   outputs=[out], inputs=[a, w], params=[out.meta, a.meta],
                   global_size=(-(-n // form.tile), -(-m // form.tile)),
                   local_size=(TILE, TILE, 1))
        return
    b.dispatch(SIMPLE_SHADER, defines, outputs=[out],
               inputs=[a, w], params=[out.meta, a.meta], global_size=(out.max_numel,),
               local_size=b.local_size_1d(out.max_numel))


# ---- every other product: linear.glsl -----------------------------------------------
def linear_defines(out, a, b, bias, layout: str, m_tile: int, long_k: bool = False,
                   residual=None, swiglu=None, a_vec4: bool = False,
                   texels: tuple = ()) -> dict:
    """layout: "kn" (b is [..., K, N]), "nk" (a [N, K] weight read in place) or
    "packed" (a constant [N, K] weight prepacked as fp32 vec4 [ceil(N/4), K]);
    residual: None, or the Tensor (pair) HAS_RESIDUAL adds to the output; swiglu:
    None, or kernels/swiglu.py's defines of the SWIGLU epilogue (layout "nk" or
    "packed", the gate and up halves packed apart: ``pack_halves``); a_vec4: a read 4
    elements a load (A_VEC4; ``a_vec4`` says when); texels: the operands read as
    uniform texel buffers, "b" (B_TEXEL, layout "packed") and "a" (A_TEXEL, with
    a_vec4): ``texel_operands`` says which."""
    tensors = dict(OUT=out, A=a, B=b)
    if bias is not None:
        tensors["C"] = bias
    if residual is not None:
        tensors["R"] = residual
    d = storage_defines(**tensors)
    d.update(M_TILE=str(m_tile), **flag_defines(LONG_K=long_k, HAS_BIAS=bias is not None,
                                                B_NK=layout == "nk",
                                                B_PACKED=layout == "packed",
                                                HAS_RESIDUAL=residual is not None))
    if swiglu is not None:
        d.update(swiglu)
    if a_vec4:
        d.update(A_VEC4="1", A4_T="f16vec4" if d["A_T"] == "float16_t" else "vec4")
    d.update(flag_defines(A_TEXEL="a" in texels, B_TEXEL="b" in texels))
    if layout == "packed":
        # The packed buffer is always fp32 vec4: one variant whatever b's dtype.
        d.pop("B_T")
        d.pop("B_STORE(v)", None)
    return d


def _linear_texels(d) -> tuple:
    """(binding, texel format) of linear.glsl's texel inputs (defines ``d``)."""
    a_format = "rgba16f" if d.get("A4_T") == "f16vec4" else "rgba32f"
    return ((("a_data", a_format),) if "A_TEXEL" in d else ()) + \
        ((("b_data", "rgba32f"),) if "B_TEXEL" in d else ())


@shader_bindings(LINEAR_SHADER)
def _linear_bindings(d) -> Bindings:
    """The core's bindings (gemm_core.product_bindings), a and b as uniform texel
    buffers in the A_TEXEL / B_TEXEL forms."""
    return dataclasses.replace(gemm_core.product_bindings(d), texels=_linear_texels(d))


def texel_operands(b, a, packed, vec4: bool) -> tuple:
    """The operands linear.glsl reads as uniform texel buffers (``linear_defines``'s
    ``texels``) on the node builder ``b``'s device, for the product of ``a`` and the
    prepacked weight ``packed`` (None for another layout), a read as vec4s when
    ``vec4`` (A_VEC4): CPU drivers only (NodeBuilder.texel_input: the device's formats
    and limits), b when packed, a too when read as vec4s; neither where b cannot be."""
    if packed is None or not b.texel_input(packed, "rgba32f"):
        return ()
    fmt = "rgba16f" if a.device_dtype == "float16" else "rgba32f"
    return ("b", "a") if vec4 and b.texel_input(a, fmt) else ("b",)


def a_vec4(layout: str, k: int) -> bool:
    """Whether linear.glsl reads a 4 elements a load (A_VEC4): for a constant weight
    prepacked at load (layout "packed", the CPU drivers' form of every linear), whose K
    is fixed, when K is a multiple of 4, so that every row of a (contiguous, K elements
    each) starts on 4 elements. On llvmpipe, where each load is a loop over the SIMD
    lanes, this is 2 loads per k for a 4-row tile instead of 5."""
    return layout == "packed" and k % 4 == 0


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """[N, K] weight -> fp32 [ceil(N/4), K, 4], zero-padded: the shader's vec4 rows."""
    n, k = weight.shape
    padded = np.zeros((-(-n // 4) * 4, k), np.float32)
    padded[:n] = weight
    return np.ascontiguousarray(padded.reshape(-1, 4, k).transpose(0, 2, 1))


def pack_halves(weight: np.ndarray) -> np.ndarray:
    """A merged gate/up weight [2F, K] -> its halves packed apart (``pack_weight``
    each, the up half's vec4 rows after the gate half's ceil(F / 4)): linear.glsl's
    SWIGLU form reads the same 4 columns of both halves for any F."""
    f = weight.shape[0] // 2
    return np.concatenate([pack_weight(weight[:f]), pack_weight(weight[f:])])


def swiglu(b, out, a, mat, bias, layout: str, chain: dict,
           norm: "RmsPrologue | None" = None, steps: "str | None" = None) -> None:
    """Record out [..., F] = the SwiGLU chain over (gate, up) halves of linear(a, mat,
    bias), mat a merged gate/up weight [2F, K] ("nk", or "packed": a constant),
    bias [2F]? (vkdelegate.linear_swiglu; ``chain``: kernels/swiglu.py's defines of
    the chain text ``steps``). For one row where the tile table has a GEMV path (GPUs)
    one dispatch, gemv.glsl's SWIGLU epilogue; where the product takes linear.glsl
    (every product on CPU drivers) one dispatch, its SWIGLU epilogue; where it takes
    the GEMM core or its cooperative-matrix form (several rows on GPUs: a prefill's
    merged gate/up, passes/merge_linears) the unfused program's dispatches
    (``_swiglu_after_core``), so that the product keeps the core's speed.
    VkDelegateError (b.error) on mixed dtypes, DeviceLimitError when K is past
    llvmpipe's loop budget even in the LONG_K form. ``norm`` (an RmsPrologue;
    vkdelegate.rms_norm_linear_swiglu): the product of et_vk.rms_norm(a, ...), in the
    GEMV path (gemv.glsl's RMS_NORM with SWIGLU) unless the compile option
    ``rms_norm_prologue`` is off, else ``norm.unfused()``'s dispatch first."""
    if len({t.dtype for t in (out, a, mat) + ((bias,) if bias is not None else ())}) != 1:
        raise b.error("mixed dtypes")
    shape = (1, 1) + tuple(out.max_shape)
    m, f, batch = shape[-2], shape[-1], math.prod(shape[:-2])
    k = a.max_shape[-1] if a.ndim else 1
    form = checked_select(b, m, 2 * f, k, plain=False, batch=batch, dtype=out.dtype,
                          nk=True)
    a, norm = norm_input(b, norm, a, form.shader == GEMV_SHADER)
    if form.shader == GEMV_SHADER:
        record_core(b, form, out, a, mat, bias, "nk", swiglu=chain,
                    norm=None if norm is None else (norm.weight, norm.eps))
        return
    if form.shader in GEMM_SHADERS and steps is not None:
        _swiglu_after_core(b, form, out, a, mat, bias, steps)
        return
    form = GemmForm(LINEAR_SHADER, 4 if m >= 4 else 1, loop_limit.over_budget(k))
    loop_limit.check(b, form.iterations(k), f"K = {k}")
    params = [out.meta, a.meta, mat.meta] + ([bias.meta] if bias is not None else [])
    params.append(b.params(LINEAR_SCALARS.pack(scalars=[1.0, 1.0])))
    if layout == "packed":
        mat = b.packed_constant(mat, pack_halves, "float32")
    grid = (-(-f // 4), -(-m // form.tile), batch)
    vec4 = a_vec4(layout, k)
    texels = texel_operands(b, a, mat if layout == "packed" else None, vec4)
    b.dispatch(LINEAR_SHADER, linear_defines(out, a, mat, bias, layout, form.tile,
                                             form.long_k, swiglu=chain, a_vec4=vec4,
                                             texels=texels),
               outputs=[out], inputs=[a, mat] + ([bias] if bias is not None else []),
               params=params, global_size=grid, local_size=workgroup_for(grid),
               grid=lambda: linear_grid(out.shape, form.tile))


def _swiglu_after_core(b, form, out, a, mat, bias, steps: str) -> None:
    """``swiglu`` where the product takes the GEMM core (``form``; several rows on a
    GPU): y = linear(a, mat, bias) [..., 2F] by the core into a scratch tensor, its
    gate and up halves copied apart (kernels/affine_copy.py, as narrow_last copies a
    part of several rows), then fused_elementwise.glsl's chain ``steps`` over them:
    the dispatches and the bits of the unfused program (merged linear, narrow_last
    parts, fused_elementwise chain). The scratch tensors follow out's sizes."""
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.kernels import elementwise_chain
    from vkdelegate.kernels.affine_copy import copy_last_part
    from vkdelegate.kernels.broadcast import plan_dispatch

    f = out.max_shape[-1]
    y = b.temporary(tuple(out.max_shape[:-1]) + (2 * f,), out.dtype)
    halves = [b.temporary(out.max_shape, out.dtype) for _ in range(2)]

    def resize() -> None:  # registered before the dispatches' own hooks
        y.set_shape(tuple(out.shape[:-1]) + (2 * f,))
        for half in halves:
            half.set_shape(out.shape)
    resize()
    b.on_resize(resize)
    record_core(b, form, y, a, mat, bias, "nk")
    for half, start in zip(halves, (0, f)):
        copy_last_part(b, half, y, start)
    try:
        parsed = elementwise_chain.parse(steps, 2, 0)
        defines = elementwise_chain.chain_defines(out, halves, parsed, [])
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    plan_dispatch(b, elementwise_chain.SHADER, defines, out, halves)


def linear_grid(out_shape, tile: int) -> tuple:
    """linear.glsl's invocations for an output of ``out_shape`` [..., M, N] (its
    upper bound, or its current sizes for NodeBuilder.dispatch's ``grid``): 4 columns
    by ``tile`` rows each, per batch."""
    shape = (1, 1) + tuple(out_shape)
    return (-(-shape[-1] // 4), -(-shape[-2] // tile), math.prod(shape[:-2]))


def matmul(b, out, a, mat, bias, layout: str, alpha: float = 1.0, beta: float = 1.0,
           residual=None, norm: "RmsPrologue | None" = None) -> bool:
    """Record out = alpha * (a @ mat) + beta * bias on the form ``select`` picks
    (linear.glsl where the tile table has no row for the device): a [..., M, K],
    mat per ``layout`` (see linear_defines; "packed" prepacks the constant ``mat``
    here), bias None or broadcasting to out, batch dims broadcasting. ``residual``
    (None, or a Tensor of out's shape and dtype): added in the epilogue by the GEMV
    path and linear.glsl (HAS_RESIDUAL); the GEMM core and its cooperative-matrix form
    leave it to the caller. Returns whether the residual was added (False without
    one). ``norm`` (an RmsPrologue, not with a residual): the product of
    et_vk.rms_norm(a, ...): in the GEMV path (gemv.glsl's RMS_NORM) for one row of
    b [N, K] unless the compile option ``rms_norm_prologue`` is off, else
    ``norm.unfused()`` records the norm first and the product reads its output (two
    dispatches, as unfused). Raises VkDelegateError (b.error) on mixed dtypes,
    DeviceLimitError when K is longer than llvmpipe's loop budget allows even in the
    LONG_K form."""
    if len({t.dtype for t in (out, a, mat) + ((bias,) if bias is not None else ())}) != 1:
        raise b.error("mixed dtypes")
    shape = (1, 1) + tuple(out.max_shape)
    k = a.max_shape[-1] if a.ndim else 1
    form = checked_select(b, shape[-2], shape[-1], k, plain=False,
                          batch=math.prod(shape[:-2]), dtype=out.dtype, nk=layout != "kn")
    if norm is not None and residual is not None:
        raise b.error("an RMS norm with a residual")
    a, norm = norm_input(b, norm, a, shape[-2] == 1 and layout != "kn"
                         and gemm_core.rms_norm_fits(form, True))
    if norm is not None:
        record_core(b, form, out, a, mat, bias, "nk", alpha, beta,
                    norm=(norm.weight, norm.eps))
        return False
    if form.shader in GEMM_SHADERS + (GEMV_SHADER,):
        # The core reads a constant [N, K] weight in place: no packing.
        fused = residual if form.shader == GEMV_SHADER else None
        record_core(b, form, out, a, mat, bias, "kn" if layout == "kn" else "nk",
                    alpha, beta, fused)
        return fused is not None
    params = [out.meta, a.meta, mat.meta] + ([bias.meta] if bias is not None else [])
    params.append(b.params(LINEAR_SCALARS.pack(scalars=[alpha, beta])))
    if layout == "packed":
        mat = b.packed_constant(mat, pack_weight, "float32")
    grid = linear_grid(out.max_shape, form.tile)
    vec4 = a_vec4(layout, k)
    texels = texel_operands(b, a, mat if layout == "packed" else None, vec4)
    b.dispatch(LINEAR_SHADER, linear_defines(out, a, mat, bias, layout, form.tile,
                                             form.long_k, residual, a_vec4=vec4,
                                             texels=texels),
               outputs=[out], inputs=[a, mat] + ([bias] if bias is not None else []) +
               ([residual] if residual is not None else []),
               params=params, global_size=grid, local_size=workgroup_for(grid),
               grid=lambda: linear_grid(out.shape, form.tile))
    return residual is not None


# Every variant ``select`` may pick, for both dtypes and storage profiles.
def _mm_variant(profile, dtype: str, transposed: bool, reg: "int | None" = None) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    defines = mm_defines(ddt, ddt, ddt, dtype, transposed)
    return defines if reg is None else dict(defines, TILE=str(TILE), REG=str(reg))


def _linear_variant(profile, dtype: str, layout: str, bias: bool, m_tile: int,
                    long_k: bool, residual: bool, chain: "str | None",
                    vec4: bool, texels: tuple) -> "dict | None":
    ddt = (dtype, device_dtype(dtype, profile))
    if chain is not None and (layout == "kn" or residual
                              or chain not in swiglu_chains.CHAINS_FOR[dtype]):
        return None  # SWIGLU: a [2F, K] weight, no residual
    if (vec4 or texels) and layout != "packed" or "a" in texels and not vec4:
        return None
    return linear_defines(ddt, ddt, ddt, ddt if bias else None, layout, m_tile, long_k,
                          ddt if residual else None,
                          None if chain is None else swiglu_chains.defines(chain, dtype),
                          vec4, texels)


_GRID = dict(profile=STORAGE_PROFILES, dtype=DTYPES)
declare_grid(SIMPLE_SHADER, _mm_variant, **_GRID, transposed=(False, True))
declare_grid(TILED_SHADER, _mm_variant, **_GRID, transposed=(False, True), reg=(1, REG))
declare_grid(LINEAR_SHADER, _linear_variant, **_GRID, layout=("kn", "nk", "packed"),
             bias=(False, True), m_tile=(1, 4), long_k=(False, True),
             residual=(False, True), chain=(None,) + swiglu_chains.CHAINS,
             vec4=(False, True), texels=((), ("b",), ("b", "a")))
