"""et_vk.apply_rotary_emb: ExecuTorch's rotary embedding of interleaved pairs.

Schema (ExecuTorch backends/vulkan/custom_ops_lib.py): ``apply_rotary_emb(Tensor xq,
Tensor xk, Tensor freqs_cos, Tensor freqs_sin) -> (Tensor, Tensor)``: xq [B, S, Hq, D],
xk [B, S, Hk, D], freqs_cos/freqs_sin [S, D/2] (the 2-D form of ExecuTorch's
``_reshape_for_broadcast``; its 3-D [S, H, D/2] form stays on the CPU). Pair
(x[2j], x[2j+1]) is rotated by (cos, sin)[s, j], computed in fp32 and stored in x's
dtype (rotary.glsl), one dispatch per output. S may be dynamic.

vkdelegate.rotary_half: HF transformers' form, ``rotary_half(Tensor x, Tensor cos,
Tensor sin) -> Tensor`` = ``x * cos + rotate_half(x) * sin`` (cos/sin broadcast to x,
rank <= 4, even last dim), made by ``passes/fuse_rotary`` from the 8 nodes it exports
as (two slices, neg, cat, two muls, add): one dispatch (rotary_half.glsl) where they
took 8 plus their intermediates (a decode-sized q and k: 18 dispatches, 7.2 ms on
lavapipe, against 2 dispatches, 0.14 ms, for the fused forms).
"""
from __future__ import annotations

from vkdelegate.kernels.rotary_half import broadcast_strides, padded_sizes, pair_reason
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "rotary"
FLOATS = frozenset({"float32", "float16"})
ROTARY_PARAMS = ParamBlock("rotary_block", [("info", "ivec4")])  # pairs, D/2, H, S


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("in_data", "cos_data", "sin_data"),
                    params=(ROTARY_PARAMS,))


def _rotate(b, out, x, cos, sin) -> None:
    def pack():
        *_, s, h, d = x.shape
        return ROTARY_PARAMS.pack(info=[x.numel // 2, d // 2, h, s])
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    pairs = x.max_numel // 2
    b.dispatch(SHADER, storage_defines(OUT=out, IN=x, F=cos), outputs=[out],
               inputs=[x, cos, sin], params=[params], global_size=(max(pairs, 1),),
               local_size=b.local_size_1d(pairs))


def _impl(b, node):
    xq_id, xk_id, cos_id, sin_id, out_id = node.args
    xq, xk, cos, sin = (b.tensor(i) for i in (xq_id, xk_id, cos_id, sin_id))
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 2:
        raise b.error("apply_rotary_emb has two outputs")
    for x, out in zip((xq, xk), outs):
        _rotate(b, out, x, cos, sin)


def _rule(node: NodeSpec):
    xq, xk, cos, sin = node.args[:4]
    if xq.rank != 4 or xk.rank != 4:
        return "xq and xk must be 4-D [B, S, H, D]"
    s, d = xq.shape[1], xq.shape[3]
    if d % 2 or xk.shape[1] != s or xk.shape[3] != d:
        return f"xq {list(xq.shape)} and xk {list(xk.shape)}: same S and an even D needed"
    for f in (cos, sin):
        if tuple(f.shape) != (s, d // 2):
            return f"freqs of sizes {list(f.shape)} (expected [S, D/2] = [{s}, {d // 2}])"
    if len({xq.dtype, xk.dtype}) != 1 or cos.dtype != sin.dtype:
        return "xq/xk and freqs_cos/freqs_sin must share dtypes"
    return None


def _shape(args):
    return [tuple(args[0].shape), tuple(args[1].shape)]


register(OpSpec(name="et_vk.apply_rotary_emb.default", dtypes=FLOATS, impl=_impl,
                shape_fn=_shape, rules=(_rule,), max_rank=4,
                notes="ExecuTorch's interleaved-pair RoPE; freqs [S, D/2]; fp32 math"))


HALF_SHADER = "rotary_half"
HALF_PARAMS = ParamBlock("rotary_half_block", [("info", "ivec4"), ("sizes", "ivec4"),
                                               ("fstrides", "ivec4")])


@shader_bindings(HALF_SHADER)
def _half_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("in_data", "cos_data", "sin_data"),
                    params=(HALF_PARAMS,))


def _half_impl(b, node):
    x_id, cos_id, sin_id, out_id = node.args
    x, cos, sin, out = (b.tensor(i) for i in (x_id, cos_id, sin_id, out_id))

    def pack():
        sizes = (1,) * (4 - x.ndim) + tuple(x.shape)
        return HALF_PARAMS.pack(info=[x.numel, x.shape[-1] // 2], sizes=list(sizes),
                                fstrides=broadcast_strides(cos.shape, x.shape))
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    b.dispatch(HALF_SHADER, storage_defines(OUT=out, IN=x, F=cos), outputs=[out],
               inputs=[x, cos, sin], params=[params], global_size=(max(x.max_numel, 1),),
               local_size=b.local_size_1d(x.max_numel))


def _half_rule(node: NodeSpec):
    x, cos, sin = node.args[:3]
    if not 1 <= x.rank <= 4 or x.shape[-1] % 2:
        return f"x of sizes {list(x.shape)} (rank 1-4, even last dim)"
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.rank > x.rank:
        return "cos and sin must have one dtype and sizes of at most x's rank"
    padded = (1,) * (x.rank - cos.rank) + tuple(cos.shape)
    if any(c not in (1, s) for c, s in zip(padded, x.shape)) or padded[-1] != x.shape[-1]:
        return f"cos/sin of sizes {list(cos.shape)} do not broadcast to {list(x.shape)}"
    return None


register(OpSpec(name="vkdelegate.rotary_half.default", dtypes=FLOATS, impl=_half_impl,
                shape_fn=lambda args: tuple(args[0].shape), rules=(_half_rule,),
                max_rank=4, notes="HF rotate_half RoPE (fused by passes/fuse_rotary); "
                                  "fp32 math"))


PAIR_SHADER = "rotary_half_pair"
PAIR_PARAMS = ParamBlock("rotary_half_pair_block", [
    ("info", "ivec4"), ("sizes", "ivec4"), ("fstrides", "ivec4"), ("sizes2", "ivec4"),
    ("fstrides2", "ivec4")])


@shader_bindings(PAIR_SHADER)
def _pair_bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "out2_data"),
                    inputs=("in_data", "in2_data", "cos_data", "sin_data"),
                    params=(PAIR_PARAMS,))


def _pair_impl(b, node):
    q_id, k_id, cos_id, sin_id, out_id = node.args
    q, k, cos, sin = (b.tensor(i) for i in (q_id, k_id, cos_id, sin_id))
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 2:
        raise b.error("rotary_half_pair has two outputs")
    out_q, out_k = (b.tensor(o) if isinstance(o, int) else o for o in outs)

    def pack():
        return PAIR_PARAMS.pack(info=[q.numel, q.shape[-1] // 2, k.numel, 0],
                                sizes=padded_sizes(q.shape),
                                fstrides=broadcast_strides(cos.shape, q.shape),
                                sizes2=padded_sizes(k.shape),
                                fstrides2=broadcast_strides(cos.shape, k.shape))
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    total = q.max_numel + k.max_numel
    b.dispatch(PAIR_SHADER, storage_defines(OUT=out_q, IN=q, F=cos), outputs=[out_q, out_k],
               inputs=[q, k, cos, sin], params=[params], global_size=(max(total, 1),),
               local_size=b.local_size_1d(total))


def _pair_rule(node: NodeSpec):
    return pair_reason(*node.args[:4])


register(OpSpec(name="vkdelegate.rotary_half_pair.default", dtypes=FLOATS, impl=_pair_impl,
                shape_fn=lambda args: [tuple(args[0].shape), tuple(args[1].shape)],
                rules=(_pair_rule,), max_rank=4,
                notes="rotary_half of q and k sharing cos/sin in one dispatch (paired by "
                      "passes/fuse_rotary); bitwise rotary_half's"))


def _variant(profile, dtype: str, freqs: str) -> dict:
    x = (dtype, device_dtype(dtype, profile))
    return storage_defines(OUT=x, IN=x, F=(freqs, device_dtype(freqs, profile)))


declare_grid((SHADER, HALF_SHADER, PAIR_SHADER), _variant, profile=STORAGE_PROFILES, dtype=FLOATS, freqs=FLOATS)
