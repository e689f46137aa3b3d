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
  this family's RMS norm dispatch into a scratch row, then the product: as unfused.
"""
from __future__ import annotations

import math
import re

import numpy as np

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import gemm, swiglu
from vkdelegate.kernels.rows import (ROW_WG, VEC_PER, dispatch_rows, row_forms,
                                     vector_row_wg, vector_rows)
from vkdelegate.kernels.workgroup import has_subgroup_arithmetic
from vkdelegate.kernels.rules import same_dtype, static_channels
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "norm"
DTYPES = frozenset({"float32", "float16"})
NORM_PARAMS = ParamBlock("norm_block", [("dims", "ivec4"),  # x: trailing dims / groups
                                        ("eps", "vec4")])   # x: eps
ROWS, GROUPS, CHANNELS = 0, 1, 2  # the shader's LAYOUTs
FP32_EPS = float(np.finfo(np.float32).eps)


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    outputs = ("out_data", "mean_data", "rstd_data") if "STATS" in d else ("out_data",)
    affine = ("w_data",) if "WEIGHT" in d else ()
    affine += ("b_data",) if "BIAS" in d else ()
    return Bindings(outputs=outputs, inputs=("in_data", *affine),
                    params=(tensor_meta_block("in_meta"), NORM_PARAMS))


def _defines(t, layout: int, rms: bool, affine: bool) -> dict:
    """``t``: the (graph, device) dtype pair of every tensor of the node."""
    names = dict(OUT=t, IN=t) if rms else dict(OUT=t, IN=t, MEAN=t, RSTD=t)
    if affine:
        names.update(W=t) if rms else names.update(W=t, B=t)
    d = storage_defines(**names)
    d["LAYOUT"] = str(layout)
    if rms:
        d["RMS"] = "1"
    else:
        d["STATS"] = "1"
    if affine:
        d["WEIGHT"] = "1"
        if not rms:
            d["BIAS"] = "1"
    return d


def _vector_defines(d: dict, vec: int, subgroup: bool) -> dict:
    """``d`` (a LAYOUT 0 form of ``_defines``) as the vector row form: ``vec`` 4 (the
    row length a multiple of 4: 4-element accesses) or 1 (scalar accesses); subgroup:
    the device has subgroup arithmetic."""
    d = dict(d, ROW_VEC=str(vec), ROW_WG=str(ROW_WG), VEC_PER=str(VEC_PER))
    if vec == 4:
        for name in ("OUT", "IN", "W", "B"):
            if f"{name}_T" in d:
                d[f"{name}4_T"] = "f16vec4" if d[f"{name}_T"] == "float16_t" else "vec4"
        # A vec4 converted for storing as OUT_STORE converts each element.
        d["OUT4_STORE(v)"] = "f16vec4(v)" if d["OUT_T"] == "float16_t" else \
            "vec4(" + ", ".join(re.sub(r"\bv\b", f"v.{c}", d["OUT_STORE(v)"])
                                for c in "xyzw") + ")"
    if subgroup:
        d["SUBGROUP"] = "1"
    return d


def _dispatch(b, node, x, outs, weight, bias, layout: int, dims: int, eps: float,
              rows: int, n: int, what: str) -> None:
    """Record the norm.glsl dispatch: ``outs`` [out] (RMS) or [out, mean, rstd]
    (Tensors), ``rows`` rows of ``n`` elements (upper bounds)."""
    rms = len(outs) == 1
    out = outs[0]
    if any(t.dtype != x.dtype for t in outs) or x.dtype not in DTYPES:
        raise b.error(f"dtypes {x.dtype} -> {[t.dtype for t in outs]}: every tensor "
                      f"must have the input's float dtype")
    affine = [t for t in (weight, bias) if t is not None]
    if affine:
        size = (affine[0].max_numel,)
        weight = weight if weight is not None else \
            b.prepacked(np.ones(size, dtype=x.dtype), x.dtype)
        bias = bias if bias is not None or rms else \
            b.prepacked(np.zeros(size, dtype=x.dtype), x.dtype)
    inputs = [x] + ([weight] if affine else []) + ([bias] if affine and not rms else [])
    defines = _defines(out, layout, rms, bool(affine))
    params = [x.meta, b.params(NORM_PARAMS.pack(dims=[dims], eps=[eps]))]
    if layout == ROWS and vector_rows(b.device.info, n):
        # One workgroup per row (LLM decode: one token's row of the hidden size).
        wg = vector_row_wg(n)
        defines = _vector_defines(defines, 4 if n % 4 == 0 else 1,
                                  has_subgroup_arithmetic(b.device.info))
        b.dispatch(SHADER, defines, outputs=list(outs), inputs=inputs, params=params,
                   global_size=(rows * wg,), local_size=(wg, 1, 1))
        return
    dispatch_rows(b, SHADER, defines, out, x, params, rows, n, 2 if rms else 3, what,
                  outputs=list(outs), inputs=inputs)


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
        _dispatch(b, node, x, outs, _optional(b, w_id), _optional(b, b_id), ROWS, k,
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
        _dispatch(b, node, x, [b.tensor(node.args[-1])], _optional(b, w_id), None,
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
    if not all(hasattr(t, "shape") for t in (x, nw, w)):
        return "x, norm_weight and weight must be tensors"
    if x.rank < 1:
        return "input of rank 0"
    k = x.shape[-1]
    if x.dynamic and x.dynamic[-1]:
        return "dynamic normalized dim"
    if tuple(nw.shape) != (k,):
        return f"norm_weight of sizes {list(nw.shape)} for an input of sizes " \
               f"{list(x.shape)}: it must be [{k}]"
    if w.rank != 2 or w.shape[1] != k:
        return f"weight of sizes {list(w.shape)} for an input of sizes {list(x.shape)}: " \
               f"it must be [N, {k}]"
    if bias is not None and (not hasattr(bias, "shape") or tuple(bias.shape) != (w.shape[0],)):
        return f"bias of sizes {list(getattr(bias, 'shape', ()))} for {w.shape[0]} " \
               f"outputs: it must be [{w.shape[0]}]"
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return f"eps {eps!r} is not a number"
    return None


def _rms_linear_shape(args):
    return tuple(args[0].shape[:-1]) + (args[3].shape[0],)


def _rms_prologue(b, node, x, nw_id, eps_id, w) -> gemm.RmsPrologue:
    """The norm of ``node`` (norm weight value ``nw_id``, eps ``eps_id``) before its
    product with weight ``w``: fused into the GEMV where kernels/gemm.py can, else
    this family's RMS norm dispatch into a scratch tensor of x's sizes (which follows
    x's on resize)."""
    nw = b.tensor(nw_id)
    eps = float(b.scalar(eps_id))
    k = x.max_shape[-1]
    if nw.max_shape != (k,) or w.ndim != 2 or w.max_shape[1] != k:
        raise b.error(f"norm_weight {list(nw.max_shape)} and weight {list(w.max_shape)} "
                      f"for an input {list(x.max_shape)}")

    def unfused():
        y = b.temporary(x.max_shape, x.dtype)
        b.on_resize(lambda: y.set_shape(x.shape))
        _dispatch(b, node, x, [y], nw, None, ROWS, 1, eps, math.prod(x.max_shape[:-1]),
                  k, f"RMS norm over {k} elements")
        return y

    return gemm.RmsPrologue(nw, eps, unfused)


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


def _rms_swiglu_shape(args):
    return tuple(args[0].shape[:-1]) + (args[3].shape[0] // 2,)


def _rms_swiglu_impl(b, node):
    x_id, nw_id, eps_id, w_id, bias_id, steps_id, out_id = node.args
    x, w, out = b.tensor(x_id), b.tensor(w_id), b.tensor(out_id)
    try:
        chain = swiglu.defines(b.value(steps_id), out.dtype)
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    norm = _rms_prologue(b, node, x, nw_id, eps_id, w)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    gemm.swiglu(b, out, x, w, _optional(b, bias_id), layout, chain, norm=norm)


register(OpSpec(name=RMS_NORM_LINEAR_SWIGLU, dtypes=DTYPES, impl=_rms_swiglu_impl,
                shape_fn=_rms_swiglu_shape, rules=(_rms_linear_rule, swiglu.halves_rule(3, 5, 4), same_dtype),
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
        _dispatch(b, node, x, outs, _optional(b, node.args[w_at]),
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
    forms = [_defines(pair, ROWS, True, affine)]
    forms += [_defines(pair, layout, False, affine) for layout in (ROWS, GROUPS, CHANNELS)]
    vector = [_vector_defines(d, vec, subgroup) for d in forms[:2] for vec in (4, 1)
              for subgroup in (True, False)]
    return [v for d in forms for v in row_forms(d)] + vector


declare_grid(SHADER, _variants, profile=STORAGE_PROFILES, dtype=DTYPES,
             affine=(False, True))
