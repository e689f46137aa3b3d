"""Inference batch norm: aten._native_batch_norm_legit_no_training.default.

Schema: (input, weight?, bias?, running_mean, running_var, momentum, eps) ->
(out, save_mean, save_invstd). Normalizes dim 1 of an (N, C, ...) input of rank 2..6
with the running statistics; ``momentum`` plays no part at inference. As in ATen's
kernel, the two saved-statistics outputs are empty tensors of size [0] (nothing is
computed for them). Used when the lowering pass cannot fold the batch norm into a
preceding convolution or linear layer.

When the weight, bias and statistics are constants (the usual case: parameters and
buffers), scale = weight / sqrt(var + eps) and shift = bias - mean * scale are
folded at load in float64 and uploaded as fp32, so the shader does one multiply-add
per element; otherwise the shader reads them as stored. Resizable in every dim but
the channel dim.
"""
from __future__ import annotations

import math

import numpy as np

from vkdelegate.kernels.rules import same_dtype, static_channels
from vkdelegate.kernels.workgroup import workgroup_for
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "batch_norm"
NAME = "aten._native_batch_norm_legit_no_training.default"
DTYPES = frozenset({"float32", "float16"})
BN_PARAMS = ParamBlock("bn_block", [("eps", "vec4")])  # x: eps


def _shape(args):
    return [tuple(args[0].shape), (0,), (0,)]


def _channels(node: NodeSpec):
    x = node.args[0]
    if x.rank < 2:
        return f"input of rank {x.rank}: batch norm needs (N, C, ...)"
    for i, name in ((1, "weight"), (2, "bias"), (3, "running_mean"), (4, "running_var")):
        t = node.args[i]
        if t is not None and tuple(t.shape) != (x.shape[1],):
            return f"{name} of sizes {list(t.shape)} for {x.shape[1]} channels"
    return None


def _defines(out, x, p, prepacked: bool, plane_loop: bool = False) -> dict:
    return dict(storage_defines(OUT=out, IN=x, P=p),
                **flag_defines(PREPACKED=prepacked, PLANE_LOOP=plane_loop))


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    stats = ("scale_data", "shift_data") if "PREPACKED" in d else \
        ("w_data", "b_data", "mean_data", "var_data")
    return Bindings(outputs=("out_data",), inputs=("in_data", *stats),
                    params=(tensor_meta_block("out_meta"), BN_PARAMS))


def _impl(b, node):
    x_id, w_id, b_id, mean_id, var_id, _momentum_id, eps_id, out_id = node.args
    x = b.tensor(x_id)
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 3:
        raise b.error("output is not a list of 3 tensors")
    out = outs[0]
    if x.dtype != out.dtype or x.ndim < 2:
        raise b.error(f"input {x.dtype} {list(x.max_shape)}, output {out.dtype}")
    channels = x.max_shape[1]
    eps = float(b.scalar(eps_id))
    stats = [b.value(i) for i in (w_id, b_id, mean_id, var_id)]
    arrays = [b.constant_array(t) if t is not None else None for t in stats]
    if all(a is not None or t is None for a, t in zip(arrays, stats)):
        weight = arrays[0] if arrays[0] is not None else np.ones(channels)
        bias = arrays[1] if arrays[1] is not None else np.zeros(channels)
        mean, var = arrays[2], arrays[3]
        scale = weight.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        shift = bias.astype(np.float64) - mean.astype(np.float64) * scale
        inputs = [x, b.prepacked(scale.astype(np.float32), "float32"),
                  b.prepacked(shift.astype(np.float32), "float32")]
        prepacked = True
    else:
        fill = {0: np.ones(channels), 1: np.zeros(channels)}
        inputs = [x] + [t if t is not None else
                        b.prepacked(fill[i].astype(x.dtype), x.dtype)
                        for i, t in enumerate(stats)]
        prepacked = False
    mx = out.max_shape
    plane = math.prod(mx[2:])
    local = workgroup_for((plane, mx[1], mx[0]))
    # Cap x at the device limit; the shader then strides over longer planes.
    limit = b.device.info.max_workgroup_count[0] * local[0]
    grid = (min(plane, limit), mx[1], mx[0])
    b.dispatch(SHADER, _defines(out, x, inputs[1], prepacked, plane > limit),
               outputs=[out], inputs=inputs,
               params=[out.meta, b.params(BN_PARAMS.pack(eps=[eps]))],
               global_size=grid, local_size=local)


register(OpSpec(name=NAME, dtypes=DTYPES, impl=_impl, shape_fn=_shape,
                rules=(_channels, static_channels, same_dtype), max_rank=6,
                notes="inference statistics over dim 1; saved statistics are empty"))
def _variant(profile, dtype: str, prepacked: bool, loop: bool) -> dict:
    """Constant statistics prepack fp32 scale/shift; run-time ones keep the dtype."""
    ddt = (dtype, device_dtype(dtype, profile))
    return _defines(ddt, ddt, ("float32", "float32") if prepacked else ddt, prepacked, loop)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=DTYPES,
             prepacked=(True, False), loop=(False, True))
