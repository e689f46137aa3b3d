"""The rotary + cache-write epilogue of a merged q/k/v GEMV (rotary_cache.h, the ROTARY
form of gemv.glsl and of linear_qw_gemv.glsl) and what the ops built on it share: the
rotary_cache ops (vkdelegate.rms_norm_linear_rotary_cache, ops/families/cache_update.py;
its int4 / int8 weight-only forms rms_norm_linear_q4gsw_rotary_cache and
rms_norm_weight_int8pack_mm_rotary_cache, ops/families/quantized_linear.py).

The merged product y [N] of one row is q | k | v: q the first Nq rows, k the next Nk,
v the last Nk (passes/merge_linears concatenates q_proj, k_proj and v_proj in that
order). The epilogue gives each workgroup's ROWS weight rows as ROWS / 2 *units* of two
rows each: unit u < (Nq + Nk) / 2 is the rotary pair (h D + i, h D + i + D/2) of a q or
k head (h = u div D/2, i = u mod D/2; the pairs of q's heads, then k's), and each later
unit two adjacent v rows. Invocation t < ROWS / 2 of a workgroup has both sums of its
unit, so it finishes each as the plain product finishes it (ROTARY_FINISH: the bias,
the int8 scale), rounds it as the product's store rounds it (``ROTARY_ROUND``), rotates
the pair (rotary_half.h's expression, cos/sin broadcast to q's or k's sizes) and writes
q' in q's order, or k' and v straight into their cache rows at the step's position
(scatter_pair.h: negative indices wrapped, an index ATen rejects flagged in the node's
error word and not written). No weight is permuted: the unit's rows are index
arithmetic, so the weight is the one the unfused product reads, and each row's sum is
computed as the plain GEMV computes it; every element gets the bits of the unfused
GEMV then rotary_scatter_pair.glsl (the rms_norm product + rotary_index_put_pair).

``ROTARY_CACHE_PARAMS`` mirrors rotary_cache.h's ``rotary_cache_block``; ``defines``
gives the form's defines, ``bindings`` its bindings; ``RotaryCache`` is what the
GEMVs' recorders bind for it. The ops share their load rule (``rule``) and
``CacheWrite``: their cos/sin, caches, positions, sizes and outputs, the epilogue of
the fused form (``fused``) and the unfused form's rotary_scatter_pair.glsl dispatch
(``unfused``). Torch-free; registers no op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from vkdelegate.kernels.cache_pair import PairRegion, index_put_pair_rule, rotary_scatter
from vkdelegate.kernels.rotary_half import broadcast_strides, padded_sizes, pair_reason
from vkdelegate.ops.registry import NodeSpec, TensorSpec
from vkdelegate.runtime.dtypes import storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.runtime.params import meta_record
from vkdelegate.shaders.bindings import Bindings
from vkdelegate.shaders.variants import flag_defines

ROTARY_CACHE_PARAMS = ParamBlock("rotary_cache_block", [
    ("rot", "ivec4"),        # x: Nq, y: Nk (v's rows alike), z: D / 2, w: error-flag word
    ("sizes", "ivec4"),      # q's sizes, padded with leading 1s to rank 4
    ("fstrides", "ivec4"),   # element strides of cos/sin along q's 4 dims (0: broadcast)
    ("sizes2", "ivec4"),     # k's sizes
    ("fstrides2", "ivec4"),  # element strides of cos/sin along k's 4 dims
    ("scatter", "ivec4")])   # scatter_pair.h's (region numel, inner, count, dim size)
INDEX_DTYPES = ("int64", "int32")
DTYPES = ("float32", "float16")


def defines(freqs, index, dtype: str) -> dict:
    """The ROTARY form's defines (gemv.glsl, linear_qw_gemv.glsl): F_T (cos/sin
    storage; ``freqs`` a Tensor or a (graph, device) dtype pair), IDX_T (the
    positions'), ROTARY and ROTARY_ROUND(v) (a sum rounded to the output's graph dtype
    ``dtype`` as the product's store rounds it: round_to_half for float16)."""
    d = storage_defines(F=freqs, IDX=index)
    d.update(flag_defines(ROTARY=True))
    d["ROTARY_ROUND(v)"] = "round_to_half(v)" if dtype == "float16" else "(v)"
    return d


def bindings(product: Bindings) -> Bindings:
    """The ROTARY form's bindings from the product's (``product``): rotary_cache.h's
    cache_data, cache2_data and error_flags after out_data (q'), cos_data, sin_data
    and index_data after the inputs, rotary_cache_block after the parameters."""
    return Bindings(outputs=product.outputs + ("cache_data", "cache2_data", "error_flags"),
                    inputs=product.inputs + ("cos_data", "sin_data", "index_data"),
                    params=product.params + (ROTARY_CACHE_PARAMS,), texels=product.texels)


@dataclass(frozen=True)
class ProductShape:
    """What the GEMVs' recorders read of the product's output when it is never stored
    (the ROTARY form): its sizes ([..., N], one row), its TensorMeta buffer and dtypes."""

    max_shape: tuple
    meta: object
    dtype: str
    device_dtype: str

    @property
    def max_numel(self) -> int:
        return math.prod(self.max_shape)


@dataclass(frozen=True)
class RotaryCache:
    """The ROTARY epilogue for the GEMVs' recorders (kernels/gemm_core.py's
    ``record_core``, ops/families/quantized_linear.py's): ``outputs`` [q', cache, cache2,
    the node's ErrorFlag] (in place of the product's output), ``inputs`` [cos, sin,
    index] (after the product's), ``params`` (the ROTARY_CACHE_PARAMS ParamBuffer),
    ``defines`` (``defines``)."""

    outputs: list
    inputs: list
    params: object
    defines: dict


def sizes_of(v) -> "tuple | None":
    """``v`` as sizes of rank 1-4, each >= 1, else None."""
    if not isinstance(v, (list, tuple)) or not 1 <= len(v) <= 4 or any(
            not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in v):
        return None
    return tuple(v)


def rule(at: int, weight: int, floats: tuple):
    """The load rule of a rotary_cache op's arguments besides its product's (the op
    adds its product's own rules): x (argument 0) one static row [1, .., 1, K];
    node.args[at:at + 7] = cos, sin, cache, cache2, indices, q_sizes, kv_sizes with
    q_sizes and kv_sizes of rank 1-4, one even last dim D, prod(q_sizes) + 2
    prod(kv_sizes) the rows of the weight (argument ``weight``); cos and sin
    broadcasting to both (rotary_half_pair's rule); x, the arguments at ``floats``
    (None skipped: the norm weight, a float weight or the scales, the bias), cos, sin
    and the caches of one dtype, float32 or float16; the caches and the indices as
    index_put_pair's with k and v of kv_sizes (one index tensor, the region
    prod(kv_sizes) elements); no dynamic sizes."""
    def check(node):
        x, w = node.args[0], node.args[weight]
        cos, sin, cache, cache2, indices, q_sizes, kv_sizes = node.args[at:at + 7]
        if not all(isinstance(t, TensorSpec) for t in (x, w, cos, sin, cache, cache2)):
            return "x, the weight, cos, sin and the caches must be tensors"
        if any(t.is_dynamic for t in node.tensors()):
            return "dynamic sizes"
        if x.rank < 1 or any(s != 1 for s in x.shape[:-1]):
            return f"input of sizes {list(x.shape)}: one row [1, .., 1, K] expected"
        qs, kvs = sizes_of(q_sizes), sizes_of(kv_sizes)
        if qs is None or kvs is None:
            return f"q_sizes {q_sizes!r} and kv_sizes {kv_sizes!r} must be sizes of rank 1-4"
        if w.rank < 1 or math.prod(qs) + 2 * math.prod(kvs) != w.shape[0]:
            return (f"q_sizes {list(qs)} and 2 x kv_sizes {list(kvs)} do not split the "
                    f"{w.shape[0] if w.rank else 0} rows of the weight")
        same = [x] + [node.args[i] for i in floats if node.args[i] is not None] \
            + [cos, sin, cache, cache2]
        if x.dtype not in DTYPES or any(getattr(t, "dtype", None) != x.dtype for t in same):
            return (f"dtypes {[getattr(t, 'dtype', None) for t in same]}: x, the product's "
                    f"float arguments, cos, sin and the caches need one dtype, float32 or "
                    f"float16")
        q, k = TensorSpec(x.dtype, qs), TensorSpec(x.dtype, kvs)
        return pair_reason(q, k, cos, sin) or index_put_pair_rule(NodeSpec(
            op="vkdelegate.index_put_pair.default", args=(cache, cache2, indices, k, k),
            outputs=node.outputs[1:]))
    return check


def shape(at: int):
    """The rotary_cache ops' shape function: (q_sizes, the caches' sizes), the
    arguments from cos at ``at`` (as ``rule``)."""
    return lambda args: [tuple(args[at + 5]), tuple(args[at + 2].shape),
                         tuple(args[at + 3].shape)]


class CacheWrite:
    """What a rotary_cache node writes besides its product: its arguments
    node.args[at:at + 7] (cos, sin, cache, cache2, indices, q_sizes, kv_sizes) and its
    three outputs (q', cache', cache2'), checked at load (b.error) against the
    product's input x (one row of K) and ``rows``, the merged weight's rows."""

    def __init__(self, b, node, at: int, x, rows: int):
        cos_id, sin_id, c_id, c2_id, indices_id, qs_id, kvs_id = node.args[at:at + 7]
        self.cos, self.sin, self.cache, self.cache2 = (
            b.tensor(i) for i in (cos_id, sin_id, c_id, c2_id))
        self.indices = b.value(indices_id)
        self.q_sizes, self.kv_sizes = tuple(b.int_list(qs_id)), tuple(b.int_list(kvs_id))
        outs = b.value(node.args[-1])
        if not isinstance(outs, list) or len(outs) != 3:
            raise b.error("a rotary_cache op has three outputs")
        self.out_q, self.out, self.out2 = (b.tensor(o) if isinstance(o, int) else o
                                           for o in outs)
        self.nq, self.nk = math.prod(self.q_sizes), math.prod(self.kv_sizes)
        self.n = self.nq + 2 * self.nk
        k = x.max_shape[-1]
        if rows != self.n or math.prod(x.max_shape) != k \
                or self.out_q.max_shape != self.q_sizes:
            raise b.error(f"weight of {rows} rows, input {list(x.max_shape)} and q' "
                          f"{list(self.out_q.max_shape)} for q {list(self.q_sizes)} and "
                          f"k/v {list(self.kv_sizes)}")
        self.row_shape = tuple(x.max_shape[:-1]) + (self.n,)  # the merged product's

    def _region(self, b) -> PairRegion:
        return PairRegion(b, self.cache, self.cache2, self.out, self.out2, self.indices)

    def fused(self, b) -> "tuple[ProductShape, RotaryCache]":
        """The ROTARY form: the caches' copies and the error flag recorded (before the
        GEMV, which writes into them), and (the product's ProductShape, the
        RotaryCache) for the GEMV's recorder."""
        region = self._region(b)
        out_q = self.out_q
        product = ProductShape(self.row_shape, b.params(meta_record(self.row_shape).tobytes()),
                               out_q.dtype, out_q.device_dtype)
        q_sizes, kv_sizes, cos = self.q_sizes, self.kv_sizes, self.cos
        params = b.params(ROTARY_CACHE_PARAMS.pack(
            rot=[self.nq, self.nk, q_sizes[-1] // 2, region.flag.slot],
            sizes=padded_sizes(q_sizes), fstrides=broadcast_strides(cos.shape, q_sizes),
            sizes2=padded_sizes(kv_sizes), fstrides2=broadcast_strides(cos.shape, kv_sizes),
            scatter=region.sizes()))
        return product, RotaryCache([out_q, self.out, self.out2, region.flag],
                                    [cos, self.sin, region.index], params,
                                    defines(cos, region.index, out_q.dtype))

    def product_row(self, b):
        """The unfused form's scratch for the merged product (x's sizes, N last)."""
        return b.temporary(self.row_shape, self.out_q.dtype)

    def unfused(self, b, y) -> None:
        """The unfused form after the product's dispatches into ``y``
        (``product_row``): rotary_index_put_pair's (the caches' copies, then
        rotary_scatter_pair.glsl reading q, k and v at their offsets in y)."""
        nq, nk = self.nq, self.nk
        rotary_scatter(b, self.out_q, self._region(b), (y, y, y), self.cos, self.sin,
                       lambda: (self.q_sizes, self.kv_sizes, nk), offsets=(0, nq, nq + nk))
