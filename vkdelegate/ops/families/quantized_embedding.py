"""int4 group-wise embedding: et_vk.embedding_q4gsw.default (ExecuTorch 1.5's schema,
backends/vulkan/custom_ops_lib.py; made by backend/passes/quantized_embedding.py from
torchao's int4 embedding).

embedding_q4gsw(weight uint8 [V, D/2], weight_scales [V, D / group_size], group_size,
indices (int32/int64, any rank), is_linear_weight) -> fp32 [*indices.shape, D]: the
rows of the int4 table, dequantized (two values per byte, + 8; k even in the high
nibble, or in the low one with is_linear_weight). One shader, embedding_q4gsw.glsl:
one invocation per 8 outputs, the packed constant read in place as 32-bit words on
devices with 8-bit storage (0.5 byte per table value on the device). Indices out of
0..V-1 raise after the run (the node's error flag), as ATen's embedding does.
"""
from __future__ import annotations

from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "embedding_q4gsw"
NAME = "et_vk.embedding_q4gsw.default"
INDEX_DTYPES = frozenset({"int32", "int64"})
SCALE_DTYPES = frozenset({"float32", "float16"})
PARAMS = ParamBlock("qembedding_block", [("info", "ivec4"), ("strides", "ivec4")])


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "error_flags"),
                    inputs=("w_data", "s_data", "index_data"), params=(PARAMS,))


def _defines(out, w, s, index, linear_packing: bool) -> dict:
    pair = (w.dtype, w.device_dtype) if hasattr(w, "device_dtype") else w
    words = pair[1] == "uint8"
    tensors = dict(OUT=out, S=s, IDX=index)
    if not words:
        tensors["W"] = w
    d = storage_defines(**tensors)
    d.update(flag_defines(W_WORDS=words, LINEAR_PACKING=linear_packing))
    return d


def _impl(b, node):
    w_id, s_id, gs_id, idx_id, linear_id, out_id = node.args
    w, s, index, out = (b.tensor(w_id), b.tensor(s_id), b.tensor(idx_id),
                        b.tensor(out_id))
    group = int(b.scalar(gs_id))
    v, half = w.max_shape
    d = out.max_shape[-1] if out.ndim else 0
    if d % 8 or group <= 0 or group % 8 or half * 2 < d or half % 4 \
            or tuple(s.max_shape) != (v, d // group):
        raise b.error(f"int4 table [{v}, {half}], scales {list(s.max_shape)}, group size "
                      f"{group} for rows of {d}")
    flag = b.error_flag(lambda: f"an index is out of range for an embedding table of "
                                f"{v} rows (valid indices: 0..{v - 1})")

    def info():
        return PARAMS.pack(info=[out.numel // 8, d // 8, v, flag.slot],
                           strides=[half // 4, d // group, group, 0])
    params = b.params(info())
    b.on_resize(lambda: params.write(info()))
    b.dispatch(SHADER, _defines(out, w, s, index, bool(b.scalar(linear_id))),
               outputs=[out, flag], inputs=[w, s, index], params=[params],
               global_size=(out.max_numel // 8,))


def _rule(node: NodeSpec):
    w, s, gs, index = node.args[:4]
    if w.rank != 2 or s.rank != 2 or not isinstance(gs, int) or gs <= 0 or gs % 8:
        return f"int4 table {list(w.shape)}, scales {list(s.shape)}, group size {gs}"
    d = s.shape[1] * gs
    if s.shape[0] != w.shape[0] or w.shape[1] * 2 != d or w.shape[1] % 4:
        return (f"int4 table {list(w.shape)} and scales {list(s.shape)} with group size "
                f"{gs}: rows of a multiple of 8 values expected")
    if node.outputs[0].dtype != "float32":
        return f"output {node.outputs[0].dtype} (ExecuTorch's op returns float32)"
    return None


def _shape(args):
    return tuple(args[3].shape) + (args[1].shape[1] * args[2],)


register(OpSpec(name=NAME, dtypes=frozenset({"float32"}), impl=_impl, shape_fn=_shape,
                rules=(_rule,), arg_dtypes={0: frozenset({"uint8"}), 1: SCALE_DTYPES,
                                            3: INDEX_DTYPES},
                notes="int4 group-wise table two values per byte (ET packing); fp32 rows"))


def _variants(profile, scale: str, index: str, linear_packing: bool):
    out = ("float32", "float32")
    w = ("uint8", device_dtype("uint8", profile))
    return _defines(out, w, (scale, device_dtype(scale, profile)),
                    (index, device_dtype(index, profile)), linear_packing)


declare_grid(SHADER, _variants, profile=STORAGE_PROFILES, scale=SCALE_DTYPES,
             index=INDEX_DTYPES, linear_packing=(False, True))
