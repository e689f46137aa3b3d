"""Fused attention: aten.scaled_dot_product_attention.default and ET-VK's et_vk.sdpa.

Schemas: ``scaled_dot_product_attention(query, key, value, attn_mask=None,
dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False)`` (ATen) and
``sdpa(q, k, v, attn_mask=None, scale=None)`` (ExecuTorch's backends/vulkan/
custom_ops_lib.py since 1.4: matmul, additive mask, softmax, matmul).

query [..., Hq, L, E], key [..., Hk, S, E], value [..., Hk, S, Ev] (rank 3 or 4), out
[..., Hq, L, Ev]. One flash-attention dispatch (sdpa.glsl): online softmax over key
tiles of BLOCK_N, fp32 accumulation, the L x S scores never stored. Supported:
is_causal (ATen's top-left aligned tril when L != S), a boolean mask (True = attend) or
an additive float mask of the query's dtype broadcasting to [..., Hq, L, S], custom
``scale`` (default 1 / sqrt(E)), grouped-query attention (``enable_gqa`` and Hq % Hk
== 0; without it Hk is Hq or 1, ATen's matmul broadcast), E and Ev up to 256, fp32 and
fp16. dropout_p > 0 stays on the CPU (the partitioner then lets torch decompose the
node). A fully masked row is 0 for ATen (its math decomposition and CPU flash kernel)
and NaN for et_vk.sdpa (its reference softmax of all -inf).
"""
from __future__ import annotations

import math

from vkdelegate.kernels import loop_limit
from vkdelegate.ops.registry import FLOAT_DTYPES, NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "sdpa"
ATEN = "aten.scaled_dot_product_attention.default"
ET_VK = "et_vk.sdpa.default"
DTYPES = FLOAT_DTYPES
MASK_DTYPES = frozenset({"bool"}) | FLOAT_DTYPES
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
#: Whether the causal variant ends the tile loop after the workgroup's last query row
#: (exact: a skipped tile is a multiply by 1 and an add of 0, see sdpa.glsl).
SKIP_MASKED_TILES = True
SDPA_PARAMS = ParamBlock("sdpa_block", [("scale", "vec4")])  # x: the score scale


def block_n(d_max: int) -> int:
    """Keys per tile for head-dim bucket ``d_max``: 2 x BLOCK_N x d_max floats of
    shared memory, at most 32 keys (a tile's scores are a register array)."""
    return min(32, SHARED_FLOATS // (2 * d_max))


def d_step(d_max: int, cpu: bool) -> int:
    """vec4s of a head dim per iteration of the shader's head-dim loops: all of them
    (unrolled, in registers) up to UNROLLED_D, else 4 (see sdpa.glsl). cpu: the device
    is a CPU driver (DeviceInfo.type "cpu")."""
    return d_max // 4 if d_max <= UNROLLED_D["cpu" if cpu else "gpu"] else 4


def iterations(s_max: int, d_max: int) -> int:
    """Loop iterations one invocation runs for ``s_max`` keys on llvmpipe: per
    tile the tile loop and two loops over its keys, each key's loops over the head
    dims when those are not unrolled (two per loop over the keys)."""
    bn, d4, step = block_n(d_max), d_max // 4, d_step(d_max, cpu=True)
    per_key = 1 if step == d4 else 1 + d4 // step
    return -(-s_max // bn) * (2 * bn * per_key + 1)


def d_bucket(e: int, ev: int) -> int:
    """The smallest D_BUCKETS entry >= both head dims."""
    return next(d for d in D_BUCKETS if d >= max(e, ev))


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    mask = "MASK_BOOL" in d or "MASK_FLOAT" in d
    metas = ("out_meta", "q_meta", "k_meta", "v_meta") + (("mask_meta",) if mask else ())
    return Bindings(outputs=("out_data",),
                    inputs=("q_data", "k_data", "v_data") + (("mask_data",) if mask else ()),
                    params=tuple(map(tensor_meta_block, metas)) + (SDPA_PARAMS,))


def _args(op: str, args) -> tuple:
    """(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) of either schema."""
    if op == ET_VK:
        q, k, v, mask, scale = args[:5]
        return q, k, v, mask, 0.0, False, scale, False
    return tuple(args[:8])


def _broadcast_reason(q, k, v, enable_gqa: bool, et_vk: bool):
    """Why k/v's batch and head dims cannot serve q's (None if they can)."""
    if k.shape[:-1] != v.shape[:-1]:
        return f"key {list(k.shape)} and value {list(v.shape)} differ before the last dim"
    for dim in range(q.rank - 2):
        qs, ks = q.shape[dim], k.shape[dim]
        heads = dim == q.rank - 3
        if ks == qs or ks == 1:
            continue
        if heads and enable_gqa and not et_vk and ks and qs % ks == 0:
            continue
        what = "heads" if heads else f"dim {dim}"
        gqa = " (grouped-query attention needs enable_gqa=True)" if heads and not \
            enable_gqa and not et_vk and ks and qs % ks == 0 else ""
        return f"query {what} {qs} cannot use key/value {what} {ks}{gqa}"
    return None


def _mask_reason(mask, q, k):
    if mask.dtype != "bool" and mask.dtype != q.dtype:
        return f"attn_mask dtype {mask.dtype} is neither bool nor the query's {q.dtype}"
    target = tuple(q.shape[:-1]) + (k.shape[-2],)
    if mask.rank > len(target):
        return f"attn_mask rank {mask.rank} > {len(target)}"
    for ms, ts in zip(reversed(mask.shape), reversed(target)):
        if ms not in (1, ts):
            return f"attn_mask {list(mask.shape)} does not broadcast to {list(target)}"
    return None


def _rule(node: NodeSpec):
    et_vk = node.op == ET_VK
    q, k, v, mask, dropout_p, is_causal, _scale, enable_gqa = _args(node.op, node.args)
    if not all(hasattr(t, "rank") for t in (q, k, v)):
        return "query, key and value must be tensors"
    if not (q.rank == k.rank == v.rank and q.rank in (3, 4)):
        return f"query/key/value ranks {q.rank}/{k.rank}/{v.rank}: 3 or 4, all alike"
    if dropout_p:
        return f"dropout_p={dropout_p} (training) is not supported"
    if is_causal and mask is not None:
        return "is_causal with an attn_mask (ATen refuses it)"
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        return f"mixed dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] != k.shape[-1]:
        return f"query head dim {q.shape[-1]} != key head dim {k.shape[-1]}"
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return f"head dims {q.shape[-1]}, {v.shape[-1]}: at most {MAX_HEAD_DIM}"
    if any(t.dynamic and t.dynamic[-1] for t in (q, k, v)):
        return "dynamic head dim"
    if mask is not None:
        if et_vk and mask.dtype == "bool":
            return "a boolean attn_mask for et_vk.sdpa (its mask is additive)"
        reason = _mask_reason(mask, q, k)
        if reason:
            return reason
    return _broadcast_reason(q, k, v, bool(enable_gqa), et_vk)


def _shape(args) -> tuple:
    q, v = args[0], args[2]
    return tuple(q.shape[:-1]) + (v.shape[-1],)


def _defines(out, q, k, v, mask, causal: bool, d_max: int, et_vk: bool, cpu: bool,
             skip: "bool | None" = None) -> dict:
    tensors = dict(OUT=out, Q=q, K=k, V=v)
    if mask is not None:
        tensors["MASK"] = mask
    d = storage_defines(**tensors)
    d.update(D_MAX=str(d_max), D_STEP=str(d_step(d_max, cpu)), BLOCK_M=str(BLOCK_M),
             BLOCK_N=str(block_n(d_max)),
             FULLY_MASKED="NAN_F" if et_vk else "0.0")
    if causal:
        d["CAUSAL"] = "1"
        if SKIP_MASKED_TILES if skip is None else skip:
            d["SKIP_MASKED_TILES"] = "1"
    if mask is not None:
        d["MASK_BOOL" if _dtype(mask) == "bool" else "MASK_FLOAT"] = "1"
    return d


def _dtype(t) -> str:
    return t.dtype if hasattr(t, "dtype") else t[0]


def _make_impl(op: str):
    et_vk = op == ET_VK

    def impl(b, node):
        *arg_ids, out_id = node.args
        if et_vk:
            q_id, k_id, v_id, mask_id, scale_id = arg_ids[:5]
            drop_id = causal_id = None
        else:
            q_id, k_id, v_id, mask_id, drop_id, causal_id, scale_id = arg_ids[:7]
        q, k, v, out = (b.tensor(i) for i in (q_id, k_id, v_id, out_id))
        mask = b.value(mask_id)
        mask = b.tensor(mask_id) if mask is not None else None
        if drop_id is not None and b.scalar(drop_id):
            raise b.error("dropout_p > 0 is not supported")
        causal = bool(b.scalar(causal_id)) if causal_id is not None else False
        if len({q.dtype, k.dtype, v.dtype, out.dtype}) != 1:
            raise b.error(f"mixed dtypes {q.dtype}, {k.dtype}, {v.dtype}, {out.dtype}")
        if not (q.ndim == k.ndim == v.ndim and q.ndim in (3, 4)):
            raise b.error(f"query/key/value ranks {q.ndim}/{k.ndim}/{v.ndim}: 3 or 4")
        e, ev = q.max_shape[-1], v.max_shape[-1]
        if max(e, ev) > MAX_HEAD_DIM:
            raise b.error(f"head dims {e}, {ev}: at most {MAX_HEAD_DIM}")
        scale = b.scalar(scale_id)
        scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
        d_max = d_bucket(e, ev)
        s_max, l_max = k.max_shape[-2], q.max_shape[-2]
        loop_limit.check(b, iterations(s_max, d_max), f"{s_max} keys of head dim {d_max}")
        heads = q.max_shape[-3] if q.ndim == 4 else q.max_shape[0]
        batch = q.max_shape[0] if q.ndim == 4 else 1
        params = [out.meta, q.meta, k.meta, v.meta] + ([mask.meta] if mask else [])
        params.append(b.params(SDPA_PARAMS.pack(scale=[scale, 0.0, 0.0, 0.0])))
        cpu = b.device.info.type == "cpu"
        b.dispatch(SHADER, _defines(out, q, k, v, mask, causal, d_max, et_vk, cpu),
                   outputs=[out], inputs=[q, k, v] + ([mask] if mask else []),
                   params=params,
                   global_size=(-(-l_max // BLOCK_M) * BLOCK_M, heads, batch),
                   local_size=(BLOCK_M, 1, 1))
    return impl


register(OpSpec(name=ATEN, dtypes=DTYPES, impl=_make_impl(ATEN), shape_fn=_shape,
                rules=(_rule,), max_rank=4, arg_dtypes={3: MASK_DTYPES},
                notes="fused flash attention: causal, bool/float masks, scale, GQA, "
                      "E, Ev <= 256; dropout_p > 0 on the CPU"))
register(OpSpec(name=ET_VK, dtypes=DTYPES, impl=_make_impl(ET_VK), shape_fn=_shape,
                rules=(_rule,), max_rank=4, arg_dtypes={3: FLOAT_DTYPES},
                notes="ExecuTorch's fused SDPA: additive mask, scale; NaN rows "
                      "where fully masked"))


def _variants(profile, dtype: str, cpu: bool, d_max: int) -> list[dict]:
    """Every variant an impl may dispatch at one grid point: each mask kind (none, bool,
    additive) non-causal, the additive ones also as ET's NaN-row form, and causal with
    and without the early exit (a compile option). ``cpu``: CPU drivers unroll less."""
    t = (dtype, device_dtype(dtype, profile))
    found = []
    for mdt in (None, "bool", dtype):
        m = None if mdt is None else (mdt, device_dtype(mdt, profile))
        found.append(_defines(t, t, t, t, m, False, d_max, False, cpu))
        if mdt != "bool":
            found.append(_defines(t, t, t, t, m, False, d_max, True, cpu))
    found += [_defines(t, t, t, t, None, True, d_max, False, cpu, skip)
              for skip in (True, False)]
    return found


declare_grid(SHADER, _variants, profile=STORAGE_PROFILES, dtype=DTYPES, cpu=(True, False),
             d_max=D_BUCKETS)
