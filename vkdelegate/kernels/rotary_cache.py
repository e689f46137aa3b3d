"""The rotary + cache-write epilogue of a merged q/k/v GEMV (gemv.glsl's ROTARY form;
vkdelegate.rms_norm_linear_rotary_cache, ops/families/cache_update.py).

The merged product y [N] of one row is q | k | v: q the first Nq rows, k the next Nk,
v the last Nk (passes/merge_linears concatenates q_proj, k_proj and v_proj in that
order). The epilogue gives each workgroup's ROWS weight rows as ROWS / 2 *units* of two
rows each: unit u < (Nq + Nk) / 2 is the rotary pair (h D + i, h D + i + D/2) of a q or
k head (h = u div D/2, i = u mod D/2; the pairs of q's heads, then k's), and each later
unit two adjacent v rows. Invocation t < ROWS / 2 of a workgroup has both sums of its
unit, so it rounds each as the linear's store rounds it (``ROTARY_ROUND``), rotates the
pair (rotary_half.h's expression, cos/sin broadcast to q's or k's sizes) and writes q'
in q's order, or k' and v straight into their cache rows at the step's position
(scatter_pair.h: negative indices wrapped, an index ATen rejects flagged in the node's
error word and not written). No weight is permuted: the unit's rows are index
arithmetic, so the weight is the one the unfused product reads, and each row's sum is
computed as the plain GEMV computes it; every element gets the bits of the unfused
GEMV then rotary_scatter_pair.glsl (rms_norm_linear + rotary_index_put_pair).

``ROTARY_CACHE_PARAMS`` mirrors gemv.glsl's ``rotary_cache_block``; ``defines`` gives
the form's defines; ``RotaryCache`` is what kernels/gemm_core.py's ``record_core``
binds for it. Torch-free; registers no op.
"""
from __future__ import annotations

from dataclasses import dataclass

from vkdelegate.runtime.dtypes import storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.variants import flag_defines

ROTARY_CACHE_PARAMS = ParamBlock("rotary_cache_block", [
    ("rot", "ivec4"),        # x: Nq, y: Nk (v's rows alike), z: D / 2, w: error-flag word
    ("sizes", "ivec4"),      # q's sizes, padded with leading 1s to rank 4
    ("fstrides", "ivec4"),   # element strides of cos/sin along q's 4 dims (0: broadcast)
    ("sizes2", "ivec4"),     # k's sizes
    ("fstrides2", "ivec4"),  # element strides of cos/sin along k's 4 dims
    ("scatter", "ivec4")])   # scatter_pair.h's (region numel, inner, count, dim size)
INDEX_DTYPES = ("int64", "int32")


def defines(freqs, index, dtype: str) -> dict:
    """gemv.glsl's ROTARY defines: F_T (cos/sin storage; ``freqs`` a Tensor or a
    (graph, device) dtype pair), IDX_T (the positions'), ROTARY and ROTARY_ROUND(v) (a
    sum rounded to the output's graph dtype ``dtype`` as the product's store rounds it:
    round_to_half for float16)."""
    d = storage_defines(F=freqs, IDX=index)
    d.update(flag_defines(ROTARY=True))
    d["ROTARY_ROUND(v)"] = "round_to_half(v)" if dtype == "float16" else "(v)"
    return d


@dataclass(frozen=True)
class ProductShape:
    """What ``record_core`` reads of the product's output when it is never stored
    (the ROTARY form): its sizes ([..., N], one row), its TensorMeta buffer and dtypes."""

    max_shape: tuple
    meta: object
    dtype: str
    device_dtype: str


@dataclass(frozen=True)
class RotaryCache:
    """gemv.glsl's ROTARY epilogue for ``record_core``: ``outputs`` [q', cache, cache2,
    the node's ErrorFlag] (in place of the product's output), ``inputs`` [cos, sin,
    index] (after the product's), ``params`` (the ROTARY_CACHE_PARAMS ParamBuffer),
    ``defines`` (``defines``)."""

    outputs: list
    inputs: list
    params: object
    defines: dict
