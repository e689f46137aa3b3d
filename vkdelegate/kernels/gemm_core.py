"""Recording the GPU GEMM kernels that kernels/gemm.py's ``select`` picks:

- gemm.glsl, the GEMM core (a ``form.block`` of (TM, TN, BK); ``form.vec_load``);
  with ``form.splits`` > 1 split-K: the core's SPLIT_K pass into an fp32 scratch,
  then gemm_reduce.glsl's sum and epilogue;
- gemm_coopmat.glsl, the core's cooperative-matrix form for fp16 data
  (GL_KHR_cooperative_matrix 16 x 16 x 16 FLOAT16 -> FLOAT32 tiles; a ``form.block``
  of (BM, BN, BK, WM, WN, STAGES), ``form.threads`` invocations per workgroup), on
  devices where ``coopmat_subgroup`` says it runs;
- gemm_coopmat_wg.glsl, its workgroup-scope form (VK_NV_cooperative_matrix2: one
  BM x BN matrix per workgroup, tensor-addressed loads the driver stages; a
  ``form.block`` of (BM, BN, BK, UNROLL), ``form.threads`` the flexible shape's
  workgroup size), on devices where ``coopmat_wg_threads`` says it runs;
- gemv.glsl, the GEMV path for one row (``form.tile`` outputs per workgroup for
  b [N, K], GEMV_UNROLL vector loads per row in flight per invocation, subgroupAdd
  reduction where the device has subgroup arithmetic), its HAS_RESIDUAL form
  (vkdelegate.linear_add: a residual of out's shape added in the epilogue) and its
  RMS_NORM form (vkdelegate.rms_norm_linear: the product of the RMS-normalized row,
  the norm weight applied to a as it is loaded and the 1 / rms scale to each sum) and
  its SWIGLU form (vkdelegate.linear_swiglu: a merged gate/up weight's row pairs
  combined by the SwiGLU chain in the epilogue, kernels/swiglu.py; with RMS_NORM,
  vkdelegate.rms_norm_linear_swiglu) and its ROTARY form (vkdelegate.
  rms_norm_linear_rotary_cache: a merged q/k/v product's rotary pairs rotated in the
  epilogue, q' stored and k' and v written into their cache rows; kernels/
  rotary_cache.py).

Products: out = alpha * (a @ B) + beta * bias, a [..., M, K], B = b [..., K, N]
(layout "kn") or b [..., N, K] read in place ("nk"), bias None or broadcasting to
out, batch dims broadcasting; fp32 and fp16 data, fp32 accumulation. ``form`` is
kernels/gemm.py's GemmForm (only its shader, block, vec_load, splits and tile are read
here). Torch-free; registers no op.
"""
from __future__ import annotations

import math

from vkdelegate.kernels import rotary_cache, swiglu
from vkdelegate.kernels.gemm_tiles import DEFAULT as GPU_TILES, TABLE
from vkdelegate.kernels.workgroup import has_subgroup_arithmetic
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

CORE_SHADER = "gemm"
COOPMAT_SHADER = "gemm_coopmat"
#: What gemm_coopmat.glsl needs of the device (capability-table names).
COOPMAT_REQUIRES = ("cooperativeMatrix", "shaderFloat16", "storageBuffer16BitAccess")
#: The cooperative-matrix shape it uses: M, N, K and the A, B, C, result component types
#: (VkCooperativeMatrixPropertiesKHR, VK_KHR_cooperative_matrix).
COOPMAT_SHAPE = (16, 16, 16, "FLOAT16_KHR", "FLOAT16_KHR", "FLOAT32_KHR", "FLOAT32_KHR")
COOPMAT_SUBGROUPS = (32, 64)  # subgroup sizes its variants are declared for
COOPMAT_WG_SHADER = "gemm_coopmat_wg"
#: What gemm_coopmat_wg.glsl needs of the device beyond COOPMAT_REQUIRES.
COOPMAT_WG_REQUIRES = COOPMAT_REQUIRES + (
    "cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
    "cooperativeMatrixTensorAddressing", "cooperativeMatrixPerElementOperations")
#: Its flexible shape's component types (A, B, C, result), of workgroup scope.
COOPMAT_WG_TYPES = ("FLOAT16_KHR", "FLOAT16_KHR", "FLOAT32_KHR", "FLOAT32_KHR")
#: The several-row forms ``record_core`` records (with the GEMV path: all its forms).
GEMM_SHADERS = (CORE_SHADER, COOPMAT_SHADER, COOPMAT_WG_SHADER)
REDUCE_SHADER = "gemm_reduce"  # split-K's second pass
GEMV_SHADER = "gemv"
GEMV_THREADS = {True: 128, False: 16}  # gemv.glsl's K split: B_NK, b [K, N]
#: gemv.glsl's vector steps per row per iteration for b [N, K] (UNROLL): their loads
#: are all issued before the first product. 4: K = 4096 fp16 is one iteration of 4
#: uvec4s per row per invocation (H200 numbers in docs/PERF.md). Up to GEMV_SHORT_K
#: (``gemv_unroll``) 1: K = 2048 fp16 is 2 uvec4s per row per invocation, so 4 would
#: issue 2 clamped duplicate loads; on the H200 (held busy, weights streamed) UNROLL 1
#: took 2048 x 16384 from 27.8 to 23.0 us and 2048 x 128256 (a Llama-3.2-1B lm_head)
#: from 149 to 122 us, the other 1B decode shapes 1-5% (docs/PERF.md, 2026-12-03
#: evening).
GEMV_UNROLL = 4
GEMV_SHORT_K = 2048
LINEAR_SCALARS = ParamBlock("scalars_block", [("scalars", "vec4")])  # alpha, beta, eps
DTYPES = ("float32", "float16")


def gemv_unroll(k: int) -> int:
    """UNROLL of gemv.glsl for b [N, K] with K = ``k``: 1 up to GEMV_SHORT_K, else
    GEMV_UNROLL."""
    return 1 if k <= GEMV_SHORT_K else GEMV_UNROLL


def _bindings(inputs: tuple, d) -> Bindings:
    bias = "HAS_BIAS" in d
    metas = ("out_meta", "a_meta", "b_meta") + (("c_meta",) if bias else ())
    inputs += (("c_data",) if bias else ()) + (("r_data",) if "HAS_RESIDUAL" in d else ())
    inputs += ("n_data",) if "RMS_NORM" in d else ()
    params = tuple(map(tensor_meta_block, metas)) + (LINEAR_SCALARS,)
    found = Bindings(outputs=("out_data",), inputs=inputs, params=params)
    return rotary_cache.bindings(found) if "ROTARY" in d else found


@shader_bindings(CORE_SHADER)
@shader_bindings(COOPMAT_SHADER)
@shader_bindings(COOPMAT_WG_SHADER)
@shader_bindings(GEMV_SHADER)
def product_bindings(d) -> Bindings:
    """Bindings of gemm.glsl, gemm_coopmat(_wg).glsl, gemv.glsl and linear.glsl (defines
    ``d``): out_data; a_data, b_data (c_data with HAS_BIAS, then r_data with
    HAS_RESIDUAL, then n_data with RMS_NORM); out/a/b (c) metadata; scalars_block.
    gemv.glsl's ROTARY adds cache_data, cache2_data and error_flags to the outputs,
    cos_data, sin_data and index_data to the inputs and rotary_cache_block."""
    return _bindings(("a_data", "b_data"), d)


@shader_bindings(REDUCE_SHADER)
def _reduce_bindings(d) -> Bindings:
    return _bindings(("partial_data",), d)


def _vector_types(d: dict) -> dict:
    return {f"{n}_VT": "f16vec4" if d[f"{n}_T"] == "float16_t" else "vec4"
            for n in ("A", "B", "NW") if f"{n}_T" in d}


def core_defines(out, a, b, bias, nk: bool, *, block: "tuple | None" = None,
                 vec_load: bool = False, split: bool = False, rows: int = 0,
                 vec: int = 1, unroll: int = 1, subgroup: bool = False,
                 residual=None, norm_weight=None, swiglu=None, rotary=None) -> dict:
    """Defines for out, a, b, bias (None, or the bias Tensor; Tensors or (graph dtype,
    device dtype) pairs), b [N, K] when ``nk``: gemm.glsl's with ``block`` (TM, TN,
    BK), ``vec_load`` and ``split`` (SPLIT_K); else gemv.glsl's, ``vec`` elements per
    load (1, 4 or 8) and with b [N, K] ``rows`` outputs per workgroup, ``unroll``
    vector loads per row per iteration (UNROLL) and the subgroupAdd reduction
    (``subgroup``: the device has subgroup arithmetic); gemv.glsl's HAS_RESIDUAL
    with ``residual`` (None, or the residual's Tensor or pair) and its RMS_NORM
    form with ``norm_weight`` (None, or the norm weight's Tensor or pair; b [N, K]
    only); its SWIGLU epilogue with ``swiglu`` (None, or kernels/swiglu.py's defines
    of the chain; b [N, K] only; with or without RMS_NORM); its ROTARY epilogue with
    ``rotary`` (None, or kernels/rotary_cache.py's defines; b [N, K] only)."""
    tensors = dict(OUT=out, A=a, B=b)
    if bias is not None:
        tensors["C"] = bias
    if residual is not None:
        tensors["R"] = residual
    if norm_weight is not None:
        tensors["NW"] = norm_weight
    d = storage_defines(**tensors)
    if norm_weight is not None:
        d["RMS_NORM"] = "1"
    d.update(flag_defines(B_NK=nk, HAS_BIAS=bias is not None,
                          HAS_RESIDUAL=residual is not None))
    if swiglu is not None:
        d.update(swiglu)
    if rotary is not None:
        d.update(rotary)
    if block is not None:
        tm, tn, bk = block
        d.update(TM=str(tm), TN=str(tn), BK=str(bk), **flag_defines(SPLIT_K=split))
        if vec_load:
            d.update(VEC_LOAD="1", **_vector_types(d))
        return d
    if nk:
        d.update(ROWS=str(rows), UNROLL=str(unroll), **flag_defines(SUBGROUP=subgroup))
    if vec == 4:
        d.update(VEC4="1", **_vector_types(d))
    elif vec == 8:
        d["VEC8"] = "1"
    return d


def coopmat_subgroup(caps) -> int:
    """The subgroup size gemm_coopmat.glsl runs with on a device whose capability table
    (vkdelegate/capabilities.py) is ``caps``, or 0 where it cannot run: it needs
    COOPMAT_REQUIRES, the COOPMAT_SHAPE among the device's cooperative-matrix shapes,
    and one fixed subgroup size (minSubgroupSize == maxSubgroupSize, one of
    COOPMAT_SUBGROUPS), since its workgroup is a fixed number of subgroups."""
    if caps.missing(COOPMAT_REQUIRES):
        return 0
    shapes = {(s.m, s.n, s.k, s.a, s.b, s.c, s.result)
              for s in caps.cooperative_matrix_shapes}
    size = caps.subgroup_size
    fixed = caps.min_subgroup_size in (0, size) and caps.max_subgroup_size in (0, size)
    return size if COOPMAT_SHAPE in shapes and fixed and size in COOPMAT_SUBGROUPS else 0


def coopmat_wg_threads(caps, block: tuple) -> int:
    """The workgroup size (invocations) gemm_coopmat_wg.glsl runs ``block`` (BM, BN,
    BK, UNROLL) with on a device whose capability table is ``caps``, or 0 where it
    cannot: it needs COOPMAT_WG_REQUIRES and a flexible shape of COOPMAT_WG_TYPES for
    its BM x BK, BK x BN and BM x BN matrices (Capabilities.
    workgroup_matrix_invocations)."""
    if caps.missing(COOPMAT_WG_REQUIRES):
        return 0
    bm, bn, bk = block[:3]
    return caps.workgroup_matrix_invocations(COOPMAT_WG_TYPES, m=(bm,), n=(bn,), k=(bk,))


def coopmat_threads(block: tuple, subgroup: int) -> int:
    """Invocations per workgroup of gemm_coopmat.glsl's ``block`` (BM, BN, BK, WM, WN,
    STAGES) with subgroups of ``subgroup`` invocations."""
    bm, bn, _, wm, wn, _ = block
    return (bm // wm) * (bn // wn) * subgroup


def coopmat_shared_bytes(block: tuple, nk: bool) -> int:
    """Bytes of shared memory gemm_coopmat.glsl declares for ``block`` (BM, BN, BK,
    WM, WN, STAGES) and b [N, K] (``nk``) or [K, N]: per stage a BM x BK tile of a
    and B's BN x BK (or BK x BN) tile, as uvec4s of 8 fp16 with one uvec4 of padding
    per row (the shader's A_SIZE, B_SIZE). A block past the device's
    maxComputeSharedMemorySize must not be dispatched: the H200's driver (48 KiB)
    loses the device on a 60 KiB one instead of failing the pipeline."""
    bm, bn, bk, _, _, stages = block
    b_rows, b_row = (bn, bk) if nk else (bk, bn)
    return 16 * stages * (bm * (bk // 8 + 1) + b_rows * (b_row // 8 + 1))


def _coopmat_storage(out, a, b, bias) -> dict:
    """The storage defines of out, a, b and the bias (None: none) of both
    cooperative-matrix GEMMs."""
    return storage_defines(OUT=out, A=a, B=b, **({} if bias is None else {"C": bias}))


def coopmat_defines(out, a, b, bias, nk: bool, block: tuple, threads: int) -> dict:
    """Defines of gemm_coopmat.glsl (tensors as for ``core_defines``; fp16 a and b
    stored as fp16) for ``block`` (BM, BN, BK, WM, WN, STAGES) and ``threads``
    invocations per workgroup."""
    d = _coopmat_storage(out, a, b, bias)
    bm, bn, bk, wm, wn, stages = block
    d.update(flag_defines(B_NK=nk, HAS_BIAS=bias is not None), BM=str(bm), BN=str(bn),
             BK=str(bk), WM=str(wm), WN=str(wn), STAGES=str(stages), THREADS=str(threads))
    return d


def coopmat_wg_defines(out, a, b, bias, nk: bool, block: tuple, threads: int) -> dict:
    """Defines of gemm_coopmat_wg.glsl (tensors as for ``core_defines``) for
    ``block`` (BM, BN, BK, UNROLL) and ``threads`` invocations per workgroup."""
    d = _coopmat_storage(out, a, b, bias)
    bm, bn, bk, unroll = block
    d.update(flag_defines(B_NK=nk, HAS_BIAS=bias is not None), BM=str(bm), BN=str(bn),
             BK=str(bk), UNROLL=str(unroll), THREADS=str(threads))
    return d


def reduce_defines(out, bias) -> dict:
    """Defines of gemm_reduce.glsl for ``out`` and ``bias`` (None or its Tensor)."""
    tensors = dict(OUT=out) if bias is None else dict(OUT=out, C=bias)
    return dict(storage_defines(**tensors), **flag_defines(HAS_BIAS=bias is not None))


def gemv_vec(mat, k: int, n: int, nk: bool) -> int:
    """Elements per vector load of gemv.glsl for b ``mat`` (a Tensor): 4 when the
    (constant, so fixed-size) b's innermost dim (``k`` with b [N, K] (``nk``), else
    ``n``) and so every batch offset is a multiple of 4, 8 when also b is [N, K] and K
    a multiple of 8 and b fp16 stored as 16 bits, else 1."""
    vec = 4 if mat.constant and (k if nk else n) % 4 == 0 else 1
    if vec == 4 and nk and k % 8 == 0 and mat.device_dtype == "float16":
        vec = 8
    return vec


def rms_norm_fits(form, nk: bool) -> bool:
    """Whether gemv.glsl's RMS_NORM form can run ``form`` (kernels/gemm.py's choice)
    for a one-row product: the GEMV path with b [N, K] (any K: the form holds nothing
    of the row in shared memory)."""
    return form.shader == GEMV_SHADER and nk


def swiglu_rows(rows: int) -> int:
    """ROWS of gemv.glsl's SWIGLU and ROTARY forms for ``rows`` (the tile table's
    gemv_rows): as many weight rows per workgroup as the plain GEMV's, half of them
    gate rows and half up rows (ROTARY: each unit's first and second row), at least
    one pair."""
    return 2 * max(1, rows // 2)


def record_core(b, form, out, a, mat, bias, layout: str, alpha: float = 1.0,
                beta: float = 1.0, residual=None, norm=None, swiglu=None,
                rotary=None) -> None:
    """Record out = alpha * (a @ mat) + beta * bias [+ residual] on the node builder
    ``b`` with ``form`` (the GEMM core, its cooperative-matrix form or the GEMV path,
    from kernels/gemm.py's ``select``):
    a [..., M, K], mat [..., K, N] (layout "kn") or [..., N, K] ("nk"); ``residual``
    (a Tensor of out's shape and dtype, added in the epilogue) with the GEMV path
    only (VkDelegateError, b.error, otherwise); ``norm`` (None, or (norm weight
    Tensor [K], eps)): a's rows RMS-normalized in the GEMV's prologue (b [N, K], one
    row, and ``rms_norm_fits``; VkDelegateError otherwise; not with a residual);
    ``swiglu`` (None, or kernels/swiglu.py's defines): the GEMV path's SWIGLU epilogue,
    mat the merged gate/up weight [2N, K] of an out of N columns (b [N, K] layout, no
    residual; VkDelegateError otherwise), with or without ``norm``; ``rotary`` (None,
    or a kernels/rotary_cache.py RotaryCache): the GEMV path's ROTARY epilogue, mat a
    merged q/k/v weight [N, K] (b [N, K] layout, no residual or SwiGLU), ``out`` then
    the product's ProductShape (never stored: the epilogue writes rotary.outputs),
    with or without ``norm``."""
    if swiglu is not None and (form.shader != GEMV_SHADER or layout != "nk"
                               or residual is not None):
        raise b.error(f"{form.shader}: no SwiGLU epilogue for this product")
    if rotary is not None and (form.shader != GEMV_SHADER or layout != "nk"
                               or residual is not None or swiglu is not None):
        raise b.error(f"{form.shader}: no rotary epilogue for this product")
    if residual is not None and form.shader != GEMV_SHADER:
        raise b.error(f"{form.shader}: only the GEMV path adds a residual")
    if norm is not None and (residual is not None or not rms_norm_fits(form, layout == "nk")):
        raise b.error(f"{form.shader}: no RMS norm in this product")
    nk = layout == "nk"
    shape = (1, 1) + tuple(out.max_shape)
    m, n, batch = shape[-2], shape[-1], math.prod(shape[:-2])
    k = a.max_shape[-1] if a.ndim else 1
    params = [out.meta, a.meta, mat.meta] + ([bias.meta] if bias is not None else [])
    eps = 0.0 if norm is None else float(norm[1])
    params.append(b.params(LINEAR_SCALARS.pack(scalars=[alpha, beta, eps])))
    inputs = [a, mat] + ([bias] if bias is not None else []) + \
        ([residual] if residual is not None else []) + \
        ([norm[0]] if norm is not None else [])
    outputs = [out]
    if rotary is not None:
        inputs += rotary.inputs
        params.append(rotary.params)
        outputs = rotary.outputs
    if form.shader == CORE_SHADER and form.splits > 1:
        _record_split_k(b, form, out, a, mat, bias, nk, params, (m, n, batch))
        return
    if form.shader in (COOPMAT_SHADER, COOPMAT_WG_SHADER):  # one BM x BN block a workgroup
        bm, bn = form.block[:2]
        make = coopmat_defines if form.shader == COOPMAT_SHADER else coopmat_wg_defines
        defines = make(out, a, mat, bias, nk, form.block, form.threads)
        grid, local = (-(-n // bn) * form.threads, -(-m // bm), batch), (form.threads, 1, 1)
    elif form.shader == CORE_SHADER:
        tm, tn, _ = form.block
        defines = core_defines(out, a, mat, bias, nk, block=form.block,
                               vec_load=form.vec_load)
        grid, local = (-(-n // tn), -(-m // tm), batch), (16, 16, 1)
    else:
        vec = gemv_vec(mat, k, n, nk)
        paired = swiglu is not None or rotary is not None  # two rows per output unit
        rows = swiglu_rows(form.tile) if paired else form.tile
        defines = core_defines(out, a, mat, bias, nk, rows=rows, vec=vec,
                               unroll=gemv_unroll(k) if nk else GEMV_UNROLL,
                               subgroup=nk and has_subgroup_arithmetic(b.device.info),
                               residual=residual,
                               norm_weight=None if norm is None else norm[0],
                               swiglu=swiglu,
                               rotary=None if rotary is None else rotary.defines)
        if nk:
            out_rows = rows // 2 if paired else rows  # output units per workgroup
            units = n // 2 if rotary is not None else n  # ROTARY: N / 2 row pairs
            grid, local = (-(-units // out_rows) * GEMV_THREADS[True], 1, batch), \
                (128, 1, 1)
        else:
            grid, local = (-(-n // 64) * 16, 16, batch), (16, 16, 1)
    b.dispatch(form.shader, defines, outputs=outputs, inputs=inputs, params=params,
               global_size=grid, local_size=local)


def _record_split_k(b, form, out, a, mat, bias, nk: bool, params: list,
                    sizes: tuple) -> None:
    """Split-K: the core sums ``form.splits`` parts of K into an fp32 scratch
    [splits * batch * M * N] (params: out's, a's, b's metadata, [bias's], scalars),
    then gemm_reduce.glsl adds them up with the epilogue into ``out``."""
    m, n, batch = sizes
    tm, tn, _ = form.block
    partial = b.temporary((form.splits * batch * m * n,), "float32")
    first = core_defines(partial, a, mat, None, nk, block=form.block,
                         vec_load=form.vec_load, split=True)
    b.dispatch(CORE_SHADER, first, outputs=[partial], inputs=[a, mat],
               params=params[:3] + params[-1:],  # no bias in the first pass
               global_size=(-(-n // tn), -(-m // tm), batch * form.splits),
               local_size=(16, 16, 1), spec_constants=(form.splits,))
    b.dispatch(REDUCE_SHADER, reduce_defines(out, bias), outputs=[out],
               inputs=[partial] + ([bias] if bias is not None else []), params=params,
               global_size=(out.max_numel,), local_size=b.local_size_1d(out.max_numel),
               spec_constants=(form.splits,))


# Every variant the tile table's rows may pick, for both dtypes and storage profiles.
def _core_variant(profile, dtype: str, nk: bool, bias: bool, block: tuple,
                  vec_load: bool, split: bool) -> "dict | None":
    ddt = (dtype, device_dtype(dtype, profile))
    if split and bias:
        return None  # split-K's first pass has no epilogue
    return core_defines("float32" if split else ddt, ddt, ddt, ddt if bias else None, nk,
                        block=block, vec_load=vec_load, split=split)


def _reduce_variant(profile, dtype: str, bias: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return reduce_defines(ddt, ddt if bias else None)


def _gemv_variant(profile, dtype: str, nk: bool, bias: bool, vec: int,
                  subgroup: bool, residual: bool, short: bool,
                  rms: bool, chain: "str | None", rotary: bool) -> "list | None":
    ddt = (dtype, device_dtype(dtype, profile))
    if vec == 8 and not (nk and ddt[1] == "float16") or subgroup and not nk \
            or short and not nk:
        return None
    if rms and (residual or not nk):
        return None  # the RMS norm form: b [N, K], no residual
    if chain is not None and (not nk or residual or chain not in swiglu.CHAINS_FOR[dtype]):
        return None  # the SwiGLU epilogue: b [N, K], no residual
    if rotary and (not nk or residual or chain is not None):
        return None  # the rotary epilogue: b [N, K], no residual or SwiGLU
    rows = GPU_TILES.gemv_rows
    # The rotary epilogue's cos/sin have the product's dtype, its positions either index
    # dtype.
    rotaries = [rotary_cache.defines(ddt, (i, device_dtype(i, profile)), dtype)
                for i in rotary_cache.INDEX_DTYPES] if rotary else [None]
    return [core_defines(ddt, ddt, ddt, ddt if bias else None, nk,
                         rows=swiglu_rows(rows) if chain or rotary else rows, vec=vec,
                         unroll=gemv_unroll(1 if short else GEMV_SHORT_K + 1),
                         subgroup=subgroup, residual=ddt if residual else None,
                         norm_weight=ddt if rms else None,
                         swiglu=None if chain is None else swiglu.defines(chain, dtype),
                         rotary=r) for r in rotaries]


def _coopmat_variant(dtype: str, nk: bool, bias: bool, block: tuple,
                     subgroup: int) -> "dict | None":
    bm, bn, bk, _, _, _ = block
    threads = coopmat_threads(block, subgroup)
    if (bm * bk // 8) % threads or (bn * bk // 8) % threads:
        return None  # not whole uvec4 loads per invocation: never chosen
    return coopmat_defines(dtype, "float16", "float16", "float16" if bias else None, nk,
                           block, threads)


def _coopmat_wg_variant(dtype: str, nk: bool, bias: bool, block: tuple,
                        threads: int) -> dict:
    return coopmat_wg_defines(dtype, "float16", "float16", "float16" if bias else None, nk,
                              block, threads)


_GRID = dict(profile=STORAGE_PROFILES, dtype=DTYPES)
_ROWS = [GPU_TILES] + [t for t in TABLE.values() if t is not None]  # tile-table rows
_BLOCKS = sorted({t.large for t in _ROWS} | {t.small for t in _ROWS}
                 | {t.large_fp32 for t in _ROWS if t.large_fp32})
declare_grid(CORE_SHADER, _core_variant, **_GRID, nk=(False, True), bias=(False, True),
             block=_BLOCKS, vec_load=(False, True), split=(False, True))
declare_grid(COOPMAT_SHADER, _coopmat_variant, requires=COOPMAT_REQUIRES,
             dtype=("float16",), nk=(False, True), bias=(False, True),
             block=sorted({t.coop_large for t in _ROWS} | {t.coop_small for t in _ROWS}),
             subgroup=COOPMAT_SUBGROUPS)
_WG_BLOCKS = sorted({b for t in _ROWS for b in (t.coop_wg, t.coop_wg_small) if b})
declare_grid(COOPMAT_WG_SHADER, _coopmat_wg_variant, requires=COOPMAT_WG_REQUIRES,
             dtype=("float16",), nk=(False, True), bias=(False, True), block=_WG_BLOCKS,
             threads=(128, 256))
declare_grid(REDUCE_SHADER, _reduce_variant, **_GRID, bias=(False, True))
declare_grid(GEMV_SHADER, _gemv_variant, **_GRID, nk=(False, True), bias=(False, True),
             vec=(1, 4, 8), subgroup=(False, True), residual=(False, True),
             short=(False, True), rms=(False, True), chain=(None,) + swiglu.CHAINS,
             rotary=(False, True))
