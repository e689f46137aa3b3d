"""The k largest or smallest elements along a dim, with their indices: aten.topk.default.

Schema: topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True)
-> (values, indices int64). MoE routers pick their experts with it (``torch.topk(
routing_weights, top_k, dim=-1)`` over rows of 8..128 experts). One invocation per
line along ``dim`` (topk.glsl, any dim) walks it in order and keeps its best k in
registers, so k is at most ``K_MAX`` and a line at most ``N_MAX`` elements (a vocab-
sized top-k belongs to a cooperative kernel, not this one). Results are always sorted
(best first); ``sorted=False``, whose order ATen leaves unspecified, is accepted and
gets the same sorted result.

Order: NaN counts as larger than every number (ATen's rule: NaNs come first for
largest=True, last for largest=False), then by value, and equal values (-0.0 and 0.0
included) by lower index first, which is the order of
``torch.sort(x, dim, descending=largest, stable=True)``. ATen's CPU topk does not
document its order among ties (and does not always take the lower index), so where
a line has ties the indices may differ from eager's while both are valid results.
Values are compared in fp32 (fp16 data widens exactly). Float inputs only.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import loop_limit
from vkdelegate.kernels.dims import wrap_dim
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "topk"
DTYPES = frozenset({"float32", "float16"})
#: The most results per line (topk.glsl's TOPK_MAX slots).
K_MAX = 16
#: The longest line: one invocation walks it, one loop iteration per element
#: (within llvmpipe's loop budget, loop_limit.py, with room to spare).
N_MAX = 16384
TOPK_PARAMS = ParamBlock("topk_block", [("topk", "ivec4")])  # dim (innermost 0), k, largest


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data", "idx_data"), inputs=("in_data",),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            TOPK_PARAMS))


def _args(args) -> tuple:
    """(k, dim, largest, sorted) from the schema's arguments after self."""
    k, dim, largest, sort = (list(args) + [-1, True, True][len(args) - 1:])[:4]
    return int(k), int(dim), bool(largest), bool(sort)


def _shape(args):
    x = args[0]
    k, dim, _, _ = _args(args[1:])
    shape = list(x.shape)
    if shape:
        shape[wrap_dim(dim, len(shape), "topk dim")] = k
    return [tuple(shape), tuple(shape)]


def _rule(node: NodeSpec):
    x, outs = node.args[0], node.outputs
    if len(outs) != 2 or outs[0].dtype != x.dtype or outs[1].dtype != "int64":
        return f"outputs {[o.dtype for o in outs]}, expected [{x.dtype}, int64]"
    k, dim, _, _ = _args(node.args[1:])
    try:
        dim = wrap_dim(dim, x.rank, "topk dim")
    except VkDelegateError as exc:
        return str(exc)
    n = x.shape[dim] if x.rank else 1
    if x.rank and x.dynamic and x.dynamic[dim]:
        # Below k at run time ATen raises; the kernel would fill the rest with -1.
        return f"a dynamic size along dim {dim} (the line a topk selects from)"
    if not 0 <= k <= K_MAX:
        return f"k = {k} (supported: 0..{K_MAX}, one invocation per line keeps them)"
    if k > n:
        return f"k = {k} > {n} elements along dim {dim} (ATen raises)"
    if n > N_MAX:
        return f"lines of {n} elements (supported: up to {N_MAX})"
    return None


def _storage(t):
    """(graph dtype, device dtype): int64 indices are int32 on the device."""
    dtype, dev = (t.dtype, t.device_dtype) if hasattr(t, "device_dtype") else t
    return ("int32", dev) if dtype == "int64" else (dtype, dev)


def _defines(out, idx, x) -> dict:
    d = storage_defines(OUT=out, IN=x)
    d.update({k.replace("OUT", "IDX", 1): v
              for k, v in storage_defines(OUT=_storage(idx)).items()
              if k.startswith("OUT")})
    return d


def _impl(b, node):
    x_id, k_id, dim_id, largest_id, _sorted_id, out_id = node.args
    x, outs = b.tensor(x_id), b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 2:
        raise b.error("expected a (values, indices) output list")
    values, indices = outs
    # int32 indices: an ExecuTorch blob's int64 (see load_checks._widen).
    if values.dtype != x.dtype or indices.dtype not in ("int64", "int32"):
        raise b.error(f"outputs {values.dtype}, {indices.dtype} for a {x.dtype} input")
    k = b.scalar(k_id)
    dim = wrap_dim(b.scalar(dim_id), x.ndim, "topk dim")
    n = x.max_shape[dim] if x.ndim else 1
    if not 0 <= k <= min(K_MAX, n) or n > N_MAX:
        raise b.error(f"k = {k} of {n} elements (supported: k <= {K_MAX}, "
                      f"up to {N_MAX} elements)")
    if k == 0:
        return  # empty outputs
    loop_limit.check(b, n, f"a topk over {n} elements")
    meta_dim = x.ndim - 1 - dim if x.ndim else 0  # metadata counts from the innermost
    rows = values.max_numel // k
    params = [values.meta, x.meta, b.params(TOPK_PARAMS.pack(
        topk=[meta_dim, k, int(bool(b.scalar(largest_id)))]))]
    b.dispatch(SHADER, _defines(values, indices, x), outputs=[values, indices],
               inputs=[x], params=params, global_size=(max(rows, 1),),
               local_size=(64, 1, 1))


register(OpSpec(name="aten.topk.default", dtypes=DTYPES | {"int64"}, impl=_impl,
                shape_fn=_shape, rules=(_rule,), arg_dtypes={0: DTYPES},
                notes=f"(values, int64 indices), any dim, k <= {K_MAX}, lines up to "
                      f"{N_MAX}; NaN largest, ties lower index first"))


def _variant(profile, dtype: str) -> dict:
    return _defines((dtype, device_dtype(dtype, profile)),
                    ("int64", device_dtype("int64", profile)),
                    (dtype, device_dtype(dtype, profile)))


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=DTYPES)
