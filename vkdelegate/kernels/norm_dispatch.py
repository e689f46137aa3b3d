"""The dispatch of norm.glsl, the shader of the normalisation ops (ops/families/norm.py):
its name, parameter block, defines and bindings, and ``dispatch``, which records it;
and the RMS norm of the ops that fold it into a product (vkdelegate.rms_norm_linear and
its SwiGLU form, ops/families/norm.py; the int4 / int8 weight-only forms,
ops/families/quantized_linear.py): their load rule for the norm's arguments
(``rms_input_rule``) and ``rms_prologue``, the norm (kernels/gemm.py's RmsPrologue)
whose ``unfused()`` records et_vk.rms_norm's own dispatch for the forms that do not fold
it in. Torch-free; registers no op.
"""
from __future__ import annotations

import math
import re

import numpy as np

from vkdelegate.kernels.gemm import RmsPrologue
from vkdelegate.kernels.rows import (ROW_WG, VEC_PER, dispatch_rows, vector_row_wg,
                                     vector_rows)
from vkdelegate.kernels.workgroup import has_subgroup_arithmetic
from vkdelegate.runtime.dtypes import storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings

SHADER = "norm"
DTYPES = frozenset({"float32", "float16"})
NORM_PARAMS = ParamBlock("norm_block", [("dims", "ivec4"),  # x: trailing dims / groups
                                        ("eps", "vec4")])   # x: eps
ROWS, GROUPS, CHANNELS = 0, 1, 2  # the shader's LAYOUTs


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    outputs = ("out_data", "mean_data", "rstd_data") if "STATS" in d else ("out_data",)
    affine = ("w_data",) if "WEIGHT" in d else ()
    affine += ("b_data",) if "BIAS" in d else ()
    return Bindings(outputs=outputs, inputs=("in_data", *affine),
                    params=(tensor_meta_block("in_meta"), NORM_PARAMS))


def norm_defines(t, layout: int, rms: bool, affine: bool) -> dict:
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


def vector_defines(d: dict, vec: int, subgroup: bool) -> dict:
    """``d`` (a LAYOUT 0 form of ``norm_defines``) as the vector row form: ``vec`` 4 (the
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


def dispatch(b, node, x, outs, weight, bias, layout: int, dims: int, eps: float,
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
    defines = norm_defines(out, layout, rms, bool(affine))
    params = [x.meta, b.params(NORM_PARAMS.pack(dims=[dims], eps=[eps]))]
    if layout == ROWS and vector_rows(b.device.info, n):
        # One workgroup per row (LLM decode: one token's row of the hidden size).
        wg = vector_row_wg(n)
        defines = vector_defines(defines, 4 if n % 4 == 0 else 1,
                                 has_subgroup_arithmetic(b.device.info))
        b.dispatch(SHADER, defines, outputs=list(outs), inputs=inputs, params=params,
                   global_size=(rows * wg,), local_size=(wg, 1, 1),
                   grid=lambda: (math.prod(x.shape[:len(x.shape) - dims]) * wg,))
        return
    dispatch_rows(b, SHADER, defines, out, x, params, rows, n, 2 if rms else 3, what,
                  outputs=list(outs), inputs=inputs,
                  rows_now=((lambda: math.prod(x.shape[:len(x.shape) - dims]))
                            if layout == ROWS else None))


def rms_input_rule(node):
    """The norm's arguments (x, norm_weight, eps) of an RMS norm fused into a product:
    x [..., K] with K static, norm_weight [K], eps a number (what the kernels index: a
    crafted blob with other sizes is refused at load)."""
    x, nw, eps = node.args[:3]
    if not all(hasattr(t, "shape") for t in (x, nw)):
        return "x and norm_weight must be tensors"
    if x.rank < 1:
        return "input of rank 0"
    k = x.shape[-1]
    if x.dynamic and x.dynamic[-1]:
        return "dynamic normalized dim"
    if tuple(nw.shape) != (k,):
        return f"norm_weight of sizes {list(nw.shape)} for an input of sizes " \
               f"{list(x.shape)}: it must be [{k}]"
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return f"eps {eps!r} is not a number"
    return None


def rms_prologue(b, node, x, nw_id, eps_id) -> RmsPrologue:
    """The RMS norm of ``node``'s input x [..., K] (norm weight value ``nw_id`` [K],
    eps ``eps_id``) before its product, for the product's recorder to fold in or not:
    its ``unfused()`` records et_vk.rms_norm's dispatch (``dispatch``) into a scratch
    tensor of x's sizes (which follows x's on resize) and returns that tensor, for the
    forms that do not fold the norm in (kernels/gemm.py's ``matmul`` and ``swiglu``,
    ops/families/quantized_linear.py's ``_record``)."""
    nw = b.tensor(nw_id)
    eps = float(b.scalar(eps_id))
    k = x.max_shape[-1]
    if nw.max_shape != (k,) or nw.dtype != x.dtype:
        raise b.error(f"norm_weight {list(nw.max_shape)} {nw.dtype} for an input "
                      f"{list(x.max_shape)} {x.dtype}")

    def unfused():
        y = b.temporary(x.max_shape, x.dtype)
        b.on_resize(lambda: y.set_shape(x.shape))
        dispatch(b, node, x, [y], nw, None, ROWS, 1, eps, math.prod(x.max_shape[:-1]),
                  k, f"RMS norm over {k} elements")
        return y

    return RmsPrologue(nw, eps, unfused)
