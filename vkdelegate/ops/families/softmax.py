"""softmax and log_softmax along any dim: aten._softmax.default, aten._log_softmax.default.

Schema: _softmax(self, dim: int, half_to_float: bool). One invocation per row, or one
workgroup per row for long rows (softmax.glsl; the same rule as sum's cooperative
form, kernels/rows.py's ``dispatch_rows``), max-shifted, fp32 accumulation for fp16
data. ``half_to_float=True`` (an fp16 input with an fp32 result) stays on the CPU;
torch.export on the CPU does not produce it.
"""
from __future__ import annotations

import math

from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.dims import wrap_dim
from vkdelegate.kernels.rows import dispatch_rows, row_bindings, row_forms
from vkdelegate.kernels.rules import same_shape
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "softmax"
DTYPES = frozenset({"float32", "float16"})
SOFTMAX_PARAMS = ParamBlock("softmax_block", [("dim", "ivec4")])  # x: dim, innermost 0
shader_bindings(SHADER)(lambda _defines: row_bindings(SOFTMAX_PARAMS))


def _rule(node: NodeSpec):
    x, dim, half_to_float = node.args[:3]
    if half_to_float:
        return "half_to_float=True (fp32 result of fp16 input) is not supported"
    try:
        wrap_dim(dim, x.rank, "softmax dim")
    except VkDelegateError as exc:
        return str(exc)
    return None


def _defines(out, x, log: bool) -> dict:
    d = storage_defines(OUT=out, IN=x)
    if log:
        d["LOG_SOFTMAX"] = "1"
    return d


def _make_impl(log: bool):
    def impl(b, node):
        x_id, dim_id, half_id, out_id = node.args
        x, out = b.tensor(x_id), b.tensor(out_id)
        if b.scalar(half_id) or out.dtype != x.dtype:
            raise b.error("half_to_float=True is not supported")
        dim = wrap_dim(b.scalar(dim_id), x.ndim, "softmax dim")
        meta_dim = x.ndim - 1 - dim if x.ndim else 0  # metadata counts from the innermost
        rows = math.prod(s for d, s in enumerate(x.max_shape) if d != dim)
        n = x.max_shape[dim] if x.ndim else 1
        params = [out.meta, x.meta, b.params(SOFTMAX_PARAMS.pack(dim=[meta_dim]))]
        defines = _defines(out, x, log)
        # Three passes over a row (max, sum, write) count against llvmpipe's limit.
        dispatch_rows(b, SHADER, defines, out, x, params, rows, n, 3,
                      f"softmax over {n} elements",
                      rows_now=lambda: math.prod(s for d, s in enumerate(x.shape)
                                                 if d != dim))
    return impl


def _variants(profile, dtype: str, log: bool) -> list[dict]:
    """The variants ``impl`` may ask for on storage ``profile`` for ``dtype``."""
    pair = (dtype, device_dtype(dtype, profile))
    return row_forms(_defines(pair, pair, log))


for _name, _log in (("aten._softmax.default", False), ("aten._log_softmax.default", True)):
    register(OpSpec(name=_name, dtypes=DTYPES, impl=_make_impl(_log), shape_fn=same_shape,
                    rules=(_rule,), notes="any dim, max-shifted, fp32 accumulation"))
declare_grid(SHADER, _variants, profile=STORAGE_PROFILES, dtype=DTYPES, log=(False, True))
