"""et_vk.apply_rotary_emb: ExecuTorch's rotary embedding of interleaved pairs.

Schema (ExecuTorch backends/vulkan/custom_ops_lib.py): ``apply_rotary_emb(Tensor xq,
Tensor xk, Tensor freqs_cos, Tensor freqs_sin) -> (Tensor, Tensor)``: xq [B, S, Hq, D],
xk [B, S, Hk, D], freqs_cos/freqs_sin [S, D/2] (the 2-D form of ExecuTorch's
``_reshape_for_broadcast``; its 3-D [S, H, D/2] form stays on the CPU). Pair
(x[2j], x[2j+1]) is rotated by (cos, sin)[s, j], computed in fp32 and stored in x's
dtype (rotary.glsl), one dispatch per output. S may be dynamic.
HF's rotate_half form (``x * cos + rotate_half(x) * sin``) is not fused: it lowers as
slice/neg/cat/mul/add with every node on Vulkan (tests/ops/test_rotary.py).
"""
from __future__ import annotations

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


def _variant(profile, dtype: str, freqs: str) -> dict:
    x = (dtype, device_dtype(dtype, profile))
    return storage_defines(OUT=x, IN=x, F=(freqs, device_dtype(freqs, profile)))


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=FLOATS, freqs=FLOATS)
