"""Normalisation over rows: layer norm, RMS norm, group norm, batch statistics.

Ops (ATen schemas; norm.glsl, one dispatch each):
- native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd),
  mean/rstd of sizes input.shape[:axis] + [1] * len(normalized_shape);
  layer_norm(..., eps, cudnn_enable) -> out (kept whole by to_backend when it runs here);
- rms_norm(input, normalized_shape, weight?, eps?) -> out; eps None is fp32's epsilon
  (ATen: numeric_limits<opmath_t>::epsilon()); et_vk.rms_norm(x, weight, eps) -> out
  over the last dim (ExecuTorch's custom op, backends/vulkan/custom_ops_lib.py; the
  lowering pass fuse_rms_norm makes it from the decomposed pattern);
- native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean, rstd),
  mean/rstd (N, group); group_norm(input, num_groups, weight?, bias?, eps, cudnn) -> out
  (kept whole: its schema has no symbolic sizes, so dynamic batches stay delegated);
- _native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps) ->
  (out, save_mean, save_invstd) of sizes (C,): batch statistics over every dim but 1,
  what nn.InstanceNorm exports to (a view to (1, N * C, *) first).
Statistics in fp32 (two-pass biased variance), one rounding to the output dtype. Every
tensor has the input's dtype (mixed-dtype affine parameters stay on the CPU). A
missing weight or bias (the other present) is uploaded as ones or zeros. Resizable in
every dim but the normalized (layer/RMS) or channel dims.
Forms (kernels/rows.py): one invocation or one workgroup per row (dispatch_rows), and
on GPUs for layer/RMS norm the vector row form (vector_rows: one workgroup per row, the
row read once into registers, 4-element accesses, subgroup sums), the form of a
decode step's one-token RMS norms.

- vkdelegate.rms_norm_linear(x [..., K], norm_weight [K], eps, weight [N, K], bias [N]?)
  -> [..., N] = aten.linear(et_vk.rms_norm(x, norm_weight, eps), weight, bias) and
  vkdelegate.rms_norm_linear_swiglu(x, norm_weight, eps, weight [2F, K], bias [2F]?,
  steps) -> [..., F] = linear_swiglu(et_vk.rms_norm(x, ...), weight, bias, steps)
  (backend/custom_ops.py; made by passes/fuse_rms_norm_linear and fuse_linear_swiglu):
  where the product takes the GEMV path (one row, GPUs; kernels/gemm.py), one
  dispatch, gemv.glsl's RMS_NORM form: x times the norm weight as it is loaded, its
  sum of squares reduced with the products, each sum scaled by 1 / rms (fp32
  throughout: the normalized row is not rounded to x's dtype, as norm.glsl's output
  is); otherwise (several rows, CPU drivers, compile option rms_norm_prologue off)
  the RMS norm's dispatch into a scratch row, then the product: as unfused.
  (The int4 / int8 weight-only forms, vkdelegate.rms_norm_linear_q4gsw and
  rms_norm_weight_int8pack_mm with their SwiGLU forms, are ops/families/
  quantized_linear.py's.)
norm.glsl's dispatch, defines and bindings, the fused ops' norm rule and their
fallback norm dispatch (``rms_prologue``) are kernels/norm_dispatch.py's, which the
quantized linears share.
"""
from __future__ import annotations

import math

import numpy as np

from vkdelegate.kernels import gemm, swiglu
from vkdelegate.kernels.norm_dispatch import (CHANNELS, DTYPES, GROUPS, ROWS, SHADER,
                                              dispatch, norm_defines, rms_input_rule,
                                              rms_prologue, vector_defines)
from vkdelegate.kernels.rows import row_forms
from vkdelegate.kernels.rules import same_dtype, static_channels
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype
from vkdelegate.shaders.variants import declare_grid

FP32_EPS = float(np.finfo(np.float32).eps)


def _optional(b, vid):
    v = b.value(vid)
    return None if v is None else b.tensor(vid)


# ---- layer norm and RMS norm: the trailing dims ------------------------------------------
def _trailing_rule(shape_at: int, weight_at: "tuple[int, ...]"):
    """Rule: normalized_shape (argument ``shape_at``, None: the last dim) is the input's
    trailing sizes, static, and each affine argument has those sizes."""
    def rule(node: NodeSpec):
        x = node.args[0]
        shape = [x.shape[-1]] if shape_at is None and x.rank else \
            list(node.args[shape_at]) if shape_at is not None else []
        k = len(shape)
        if k == 0 or k > x.rank or list(x.shape[x.rank - k:]) != shape:
            return f"normalized_shape {shape} is not the trailing sizes of an input " \
                   f"of sizes {list(x.shape)}"
        if any(x.dynamic[x.rank - k:]):
            return "dynamic normalized dims"
        for i in weight_at:
            t = node.args[i]
            if t is not None and list(t.shape) != shape:
                return f"affine argument {i} of sizes {list(t.shape)} for " \
                       f"normalized_shape {shape}"
        return None
    return rule


def _layer_shape(args):
    x, k = tuple(args[0].shape), len(args[1])
    stats = x[:len(x) - k] + (1,) * k
    return [x, stats, stats]


def _layer_impl(stats: bool):
    def impl(b, node):
        x_id, shape_id, w_id, b_id, eps_id = node.args[:5]
        x = b.tensor(x_id)
        k = len(b.int_list(shape_id))
        if stats:
            outs = b.value(node.args[-1])
            if not isinstance(outs, list) or len(outs) != 3:
                raise b.error("output is not a list of 3 tensors")
        else:
            out = b.tensor(node.args[-1])
            rows_shape = x.max_shape[:x.ndim - k] + (1,) * k
            # layer_norm has no statistics outputs: scratch buffers take them.
            outs = [out, b.temporary(rows_shape, x.dtype), b.temporary(rows_shape, x.dtype)]
        rows = math.prod(x.max_shape[:x.ndim - k])
        n = math.prod(x.max_shape[x.ndim - k:])
        dispatch(b, node, x, outs, _optional(b, w_id), _optional(b, b_id), ROWS, k,
                 float(b.scalar(eps_id)), rows, n, f"layer norm over {n} elements")
    return impl


def _rms_impl(custom: bool):
    def impl(b, node):
        x = b.tensor(node.args[0])
        if custom:  # et_vk.rms_norm(x, weight, eps): the last dim
            k, w_id, eps = 1, node.args[1], b.scalar(node.args[2])
        else:
            k, w_id, eps = len(b.int_list(node.args[1])), node.args[2], \
                b.scalar(node.args[3])
        eps = FP32_EPS if eps is None else float(eps)
        n = math.prod(x.max_shape[x.ndim - k:])
        dispatch(b, node, x, [b.tensor(node.args[-1])], _optional(b, w_id), None,
                 ROWS, k, eps, math.prod(x.max_shape[:x.ndim - k]), n,
                 f"RMS norm over {n} elements")
    return impl


def _same_shape(args):
    return tuple(args[0].shape)


_AFFINE = "(weight, bias optional)"
register(OpSpec(name="aten.native_layer_norm.default", dtypes=DTYPES,
                impl=_layer_impl(True), shape_fn=_layer_shape,
                rules=(_trailing_rule(1, (2, 3)), same_dtype),
                notes=f"any trailing normalized_shape {_AFFINE}; mean and rstd outputs"))
register(OpSpec(name="aten.layer_norm.default", dtypes=DTYPES, impl=_layer_impl(False),
                shape_fn=_same_shape, rules=(_trailing_rule(1, (2, 3)), same_dtype),
                notes=f"nn.LayerNorm kept whole {_AFFINE}"))
register(OpSpec(name="aten.rms_norm.default", dtypes=DTYPES, impl=_rms_impl(False),
                shape_fn=_same_shape, rules=(_trailing_rule(1, (2,)), same_dtype),
                notes="nn.RMSNorm; weight optional, eps None: fp32 epsilon"))
register(OpSpec(name="et_vk.rms_norm.default", dtypes=DTYPES, impl=_rms_impl(True),
                shape_fn=_same_shape, rules=(_trailing_rule(None, (1,)), same_dtype),
                notes="ET-VK's fused RMS norm over the last dim (fuse_rms_norm)"))


# ---- vkdelegate.rms_norm_linear: RMS norm in the GEMV's prologue -----------------------
RMS_NORM_LINEAR = "vkdelegate.rms_norm_linear.default"


def _rms_linear_rule(node: NodeSpec):
    """x [..., K] with K static, norm_weight [K], weight [N, K], bias [N]? (what the
    kernels index: a crafted blob with other sizes is refused at load)."""
    x, nw, eps, w, bias = node.args[:5]
    if not hasattr(w, "shape"):
        return "x, norm_weight and weight must be tensors"
    why = rms_input_rule(node)
    if why is not None:
        return why
    k = x.shape[-1]
    if w.rank != 2 or w.shape[1] != k:
        return f"weight of sizes {list(w.shape)} for an input of sizes {list(x.shape)}: " \
               f"it must be [N, {k}]"
    if bias is not None and (not hasattr(bias, "shape") or tuple(bias.shape) != (w.shape[0],)):
        return f"bias of sizes {list(getattr(bias, 'shape', ()))} for {w.shape[0]} " \
               f"outputs: it must be [{w.shape[0]}]"
    return None


def _rms_linear_shape(args):
    return tuple(args[0].shape[:-1]) + (args[3].shape[0],)


def _rms_prologue(b, node, x, nw_id, eps_id, w) -> gemm.RmsPrologue:
    """``rms_prologue`` before a product with weight ``w`` [N, K]: fused into the GEMV
    where kernels/gemm.py can, else the norm's own dispatch first."""
    k = x.max_shape[-1]
    if w.ndim != 2 or w.max_shape[1] != k:
        raise b.error(f"weight {list(w.max_shape)} for an input {list(x.max_shape)}")
    return rms_prologue(b, node, x, nw_id, eps_id)


def _rms_linear_impl(b, node):
    x_id, nw_id, eps_id, w_id, bias_id, out_id = node.args
    x, w, out = b.tensor(x_id), b.tensor(w_id), b.tensor(out_id)
    norm = _rms_prologue(b, node, x, nw_id, eps_id, w)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.matmul(b, out, x, w, _optional(b, bias_id), layout, norm=norm)


register(OpSpec(name=RMS_NORM_LINEAR, dtypes=DTYPES, impl=_rms_linear_impl,
                shape_fn=_rms_linear_shape, rules=(_rms_linear_rule, same_dtype),
                notes="linear(et_vk.rms_norm(x, w, eps), weight, bias?): the norm in "
                      "the GEMV (one dispatch), else two dispatches; fused "
                      "from et_vk.rms_norm -> aten.linear"))


# ---- vkdelegate.rms_norm_linear_swiglu: the norm, a merged gate/up GEMV and SwiGLU ------
RMS_NORM_LINEAR_SWIGLU = "vkdelegate.rms_norm_linear_swiglu.default"


def _rms_swiglu_impl(b, node):
    x_id, nw_id, eps_id, w_id, bias_id, steps_id, out_id = node.args
    x, w, out = b.tensor(x_id), b.tensor(w_id), b.tensor(out_id)
    chain = swiglu.node_defines(b, steps_id, out.dtype)
    norm = _rms_prologue(b, node, x, nw_id, eps_id, w)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.swiglu(b, out, x, w, _optional(b, bias_id), layout, chain, norm=norm,
                steps=b.value(steps_id))


register(OpSpec(name=RMS_NORM_LINEAR_SWIGLU, dtypes=DTYPES, impl=_rms_swiglu_impl,
                shape_fn=swiglu.halves_shape(3),
                rules=(_rms_linear_rule, swiglu.halves_rule(3, 5, 4), same_dtype),
                notes="linear_swiglu(et_vk.rms_norm(x, w, eps), weight [2F, K], bias?, "
                      "steps) -> [..., F]: the norm, the merged gate/up GEMV and the "
                      "chain in one dispatch, else the norm's dispatch first; fused from "
                      "rms_norm_linear and a SwiGLU chain"))


# ---- group norm and batch statistics: (N, C, *) -----------------------------------------
#: Argument positions (weight, bias, group or None, eps) and whether the op has the
#: statistics outputs, per op.
_CHANNEL_ARGS = {
    "aten.native_group_norm.default": ((1, 2, 6, 7), True),
    "aten.group_norm.default": ((2, 3, 1, 4), False),
    "aten._native_batch_norm_legit.no_stats": ((1, 2, None, 5), True),
}


def _channel_rule(op: str):
    (w_at, b_at, group_at, _), _ = _CHANNEL_ARGS[op]

    def rule(node: NodeSpec):
        x = node.args[0]
        if x.rank < 2:
            return f"input of rank {x.rank}: needs (N, C, ...)"
        c = x.shape[1]
        for i, name in ((w_at, "weight"), (b_at, "bias")):
            t = node.args[i]
            if t is not None and tuple(t.shape) != (c,):
                return f"{name} of sizes {list(t.shape)} for {c} channels"
        if group_at is not None:
            group = node.args[group_at]
            if not isinstance(group, int) or group <= 0 or c % group:
                return f"{c} channels in {group} groups"
        elif 0 in x.shape:
            return "batch statistics of an empty input (ATen raises)"
        return None
    return rule


def _channel_shape(op: str):
    group_at = _CHANNEL_ARGS[op][0][2]
    stats = _CHANNEL_ARGS[op][1]

    def shape(args):
        x = tuple(args[0].shape)
        if not stats:
            return x
        rows = (x[1],) if group_at is None else (x[0], args[group_at])
        return [x, rows, rows]
    return shape


def _channel_impl(op: str):
    (w_at, b_at, group_at, eps_at), stats = _CHANNEL_ARGS[op]
    layout = CHANNELS if group_at is None else GROUPS

    def impl(b, node):
        x = b.tensor(node.args[0])
        if x.ndim < 2:
            raise b.error(f"input of rank {x.ndim}: needs (N, C, ...)")
        mx = x.max_shape
        hw = math.prod(mx[2:])
        if layout == GROUPS:
            group = int(b.scalar(node.args[group_at]))
            rows, n, dims, rows_shape = mx[0] * group, mx[1] // group * hw, group, \
                (mx[0], group)
        else:
            rows, n, dims, rows_shape = mx[1], mx[0] * hw, 0, (mx[1],)
        if stats:
            outs = b.value(node.args[-1])
            if not isinstance(outs, list) or len(outs) != 3:
                raise b.error("output is not a list of 3 tensors")
        else:  # group_norm: scratch buffers take the statistics
            outs = [b.tensor(node.args[-1]), b.temporary(rows_shape, x.dtype),
                    b.temporary(rows_shape, x.dtype)]
        dispatch(b, node, x, outs, _optional(b, node.args[w_at]),
                 _optional(b, node.args[b_at]), layout, dims,
                 float(b.scalar(node.args[eps_at])), rows, n,
                 f"{'group' if layout == GROUPS else 'batch'} norm over {n} elements")
    return impl


_NOTES = {
    "aten.native_group_norm.default": f"any group count dividing C {_AFFINE}; "
                                      f"mean/rstd (N, group)",
    "aten.group_norm.default": f"nn.GroupNorm kept whole {_AFFINE}",
    "aten._native_batch_norm_legit.no_stats": "batch statistics over all dims but 1 "
                                              "(nn.InstanceNorm's export); "
                                              "save_mean/save_invstd (C,)",
}
for _name in _CHANNEL_ARGS:
    register(OpSpec(name=_name, dtypes=DTYPES, impl=_channel_impl(_name),
                    shape_fn=_channel_shape(_name),
                    rules=(_channel_rule(_name), static_channels, same_dtype),
                    notes=_NOTES[_name]))

def _variants(profile, dtype: str, affine: bool) -> list[dict]:
    """Both row forms of every layout at one point of the grid (the ROWS layout with and
    without its mean/rstd outputs)."""
    pair = (dtype, device_dtype(dtype, profile))
    forms = [norm_defines(pair, ROWS, True, affine)]
    forms += [norm_defines(pair, layout, False, affine) for layout in (ROWS, GROUPS, CHANNELS)]
    vector = [vector_defines(d, vec, subgroup) for d in forms[:2] for vec in (4, 1)
              for subgroup in (True, False)]
    return [v for d in forms for v in row_forms(d)] + vector


declare_grid(SHADER, _variants, profile=STORAGE_PROFILES, dtype=DTYPES,
             affine=(False, True))
