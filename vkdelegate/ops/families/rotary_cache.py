"""vkdelegate.rms_norm_linear_rotary_cache: a decode layer's input RMS norm, its merged
q/k/v GEMV, the rotary embedding of q and k and the K/V cache writes, in one dispatch.

``rms_norm_linear_rotary_cache(x, norm_weight, eps, weight, bias?, cos, sin, cache,
cache2, indices, q_sizes, kv_sizes) -> (q', cache', cache2')`` (backend/custom_ops.py):
y = rms_norm_linear(x, ...) of one row, q = y[:Nq] viewed to q_sizes, k and v the next
Nk elements each viewed to kv_sizes; then rotary_index_put_pair(q, k, cos, sin, cache,
cache2, indices, v). Made by backend/passes/fuse_linear_rotary_cache.py in a decode
step (where the layer had rms_norm_linear -> three narrow_last parts ->
rotary_index_put_pair).

Forms (kernels/gemm.py's ``select`` for a one-row product of [N, K]):
- the GEMV path (GPUs): gemv.glsl's ROTARY epilogue (kernels/rotary_cache.py), with the
  norm folded in (RMS_NORM) unless compile option ``rms_norm_prologue`` is off (then
  norm.glsl's dispatch first): one dispatch, y never stored;
- otherwise (CPU drivers: linear.glsl): the dispatches of the two ops it replaces, in
  their order: the norm and the product into a scratch row y (as rms_norm_linear
  records them), then rotary_scatter_pair.glsl reading q, k and v at their offsets in
  y (ops/families/cache_update.py's ``rotary_scatter``).
Both give every element the bits of the unfused pair (tests/ops/test_rotary_cache.py).
The caches' whole copies are recorded as index_put_pair's are (dropped where a cache is
the program's state updated in place); an index ATen rejects sets the node's error
flag and writes nothing of its element.
"""
from __future__ import annotations

import math

from vkdelegate.kernels import gemm
from vkdelegate.kernels.gemm_core import GEMV_SHADER, record_core
from vkdelegate.kernels.norm_dispatch import rms_input_rule, rms_prologue
from vkdelegate.kernels.rotary_cache import (INDEX_DTYPES, ROTARY_CACHE_PARAMS,
                                             ProductShape, RotaryCache, defines)
from vkdelegate.kernels.rotary_half import broadcast_strides, padded_sizes, pair_reason
from vkdelegate.ops.families.cache_update import (ROTARY_DTYPES, PairRegion,
                                                  index_put_pair_rule, rotary_scatter)
from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, register
from vkdelegate.runtime.params import meta_record

NAME = "vkdelegate.rms_norm_linear_rotary_cache.default"


def _sizes(v) -> "tuple | None":
    """``v`` as sizes of rank 1-4, each >= 1, else None."""
    if not isinstance(v, (list, tuple)) or not 1 <= len(v) <= 4 or any(
            not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in v):
        return None
    return tuple(v)


def _rule(node: NodeSpec):
    """What the kernels index: x one static row [1, .., 1, K]; rms_norm_linear's
    arguments (norm_weight [K], weight [N, K], bias [N]?); q_sizes and kv_sizes of rank
    1-4 with one even last dim D and N = prod(q_sizes) + 2 prod(kv_sizes); cos and sin
    broadcasting to both (rotary_half_pair's rule); every float tensor of x's dtype
    (float32 or float16); the caches and the
    indices as index_put_pair's with k and v of kv_sizes (one index tensor, the region
    prod(kv_sizes) elements); no dynamic sizes."""
    x, nw, eps, w, bias, cos, sin, cache, cache2, indices, q_sizes, kv_sizes = \
        node.args[:12]
    if not all(isinstance(t, TensorSpec) for t in (x, nw, w, cos, sin, cache, cache2)):
        return "x, norm_weight, weight, cos, sin and the caches must be tensors"
    if any(t.is_dynamic for t in node.tensors()):
        return "dynamic sizes"
    why = rms_input_rule(node)
    if why:
        return why
    if x.rank < 1 or any(s != 1 for s in x.shape[:-1]):
        return f"input of sizes {list(x.shape)}: one row [1, .., 1, K] expected"
    if w.rank != 2 or w.shape[1] != x.shape[-1]:
        return f"weight of sizes {list(w.shape)} for an input of sizes {list(x.shape)}"
    if bias is not None and (not isinstance(bias, TensorSpec)
                             or tuple(bias.shape) != (w.shape[0],)):
        return f"bias must be [{w.shape[0]}]"
    qs, kvs = _sizes(q_sizes), _sizes(kv_sizes)
    if qs is None or kvs is None:
        return f"q_sizes {q_sizes!r} and kv_sizes {kv_sizes!r} must be sizes of rank 1-4"
    if math.prod(qs) + 2 * math.prod(kvs) != w.shape[0]:
        return (f"q_sizes {list(qs)} and 2 x kv_sizes {list(kvs)} do not split the "
                f"{w.shape[0]} rows of the weight")
    floats = [t for t in (x, nw, w, bias, cos, sin, cache, cache2) if t is not None]
    if x.dtype not in ROTARY_DTYPES or any(t.dtype != x.dtype for t in floats):
        return (f"dtypes {[t.dtype for t in floats]}: x, the weights, cos, sin and the "
                f"caches need one dtype, float32 or float16")
    q, k = TensorSpec(x.dtype, qs), TensorSpec(x.dtype, kvs)
    return pair_reason(q, k, cos, sin) or index_put_pair_rule(NodeSpec(
        op="vkdelegate.index_put_pair.default", args=(cache, cache2, indices, k, k),
        outputs=node.outputs[1:]))


def _shape(args):
    return [tuple(args[10]), tuple(args[7].shape), tuple(args[8].shape)]


def _impl(b, node):
    (x_id, nw_id, eps_id, w_id, bias_id, cos_id, sin_id, c_id, c2_id, indices_id,
     qs_id, kvs_id, out_id) = node.args
    x, w, cos, sin, cache, cache2 = (b.tensor(i) for i in (x_id, w_id, cos_id, sin_id,
                                                           c_id, c2_id))
    bias = None if b.value(bias_id) is None else b.tensor(bias_id)
    q_sizes, kv_sizes = tuple(b.int_list(qs_id)), tuple(b.int_list(kvs_id))
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 3:
        raise b.error("rms_norm_linear_rotary_cache has three outputs")
    out_q, out, out2 = (b.tensor(o) if isinstance(o, int) else o for o in outs)
    nq, nk = math.prod(q_sizes), math.prod(kv_sizes)
    n, k = nq + 2 * nk, x.max_shape[-1]
    if w.max_shape != (n, k) or math.prod(x.max_shape) != k \
            or out_q.max_shape != q_sizes:
        raise b.error(f"weight {list(w.max_shape)}, input {list(x.max_shape)} and q' "
                      f"{list(out_q.max_shape)} for q {list(q_sizes)} and k/v "
                      f"{list(kv_sizes)}")
    norm = rms_prologue(b, node, x, nw_id, eps_id)
    form = gemm.checked_select(b, 1, n, k, plain=False, dtype=out_q.dtype, nk=True)
    if form.shader == GEMV_SHADER:
        region = PairRegion(b, cache, cache2, out, out2, b.value(indices_id))
        a, fold = gemm.norm_input(b, norm, x, True)
        shape = tuple(x.max_shape[:-1]) + (n,)
        product = ProductShape(shape, b.params(meta_record(shape).tobytes()), out_q.dtype,
                               out_q.device_dtype)
        params = b.params(ROTARY_CACHE_PARAMS.pack(
            rot=[nq, nk, q_sizes[-1] // 2, region.flag.slot], sizes=padded_sizes(q_sizes),
            fstrides=broadcast_strides(cos.shape, q_sizes), sizes2=padded_sizes(kv_sizes),
            fstrides2=broadcast_strides(cos.shape, kv_sizes), scatter=region.sizes()))
        rotary = RotaryCache([out_q, out, out2, region.flag], [cos, sin, region.index],
                             params, defines(cos, region.index, out_q.dtype))
        record_core(b, form, product, a, w, bias, "nk",
                    norm=None if fold is None else (fold.weight, fold.eps), rotary=rotary)
        return
    # The unfused pair's dispatches: rms_norm_linear into y, then rotary_index_put_pair.
    y = b.temporary(tuple(x.max_shape[:-1]) + (n,), out_q.dtype)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.matmul(b, y, x, w, bias, layout, norm=norm)
    region = PairRegion(b, cache, cache2, out, out2, b.value(indices_id))
    rotary_scatter(b, out_q, region, (y, y, y), cos, sin, lambda: (q_sizes, kv_sizes, nk),
                   offsets=(0, nq, nq + nk))


register(OpSpec(name=NAME, dtypes=ROTARY_DTYPES, impl=_impl, shape_fn=_shape,
                rules=(_rule,), arg_dtypes={9: frozenset(INDEX_DTYPES)}, max_rank=4,
                notes="rotary_index_put_pair of the q/k/v parts of a one-row "
                      "rms_norm_linear (a decode layer's norm, q/k/v GEMV, rotary and "
                      "K/V cache writes): one dispatch on the GEMV path (the rotary "
                      "pairs and cache writes in its epilogue), else the unfused "
                      "pair's; bitwise the pair's"))
