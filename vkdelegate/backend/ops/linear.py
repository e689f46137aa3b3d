"""Linear algebra: aten.linear.default, aten.addmm.default, aten.bmm.default.

One shader, linear.glsl: a batched matrix multiply with broadcasting batch dims, an
optional bias broadcast against the output, and alpha/beta scaling; fp32 and fp16
(accumulated in fp32), 4 x 4 output tiles per invocation. A constant ``nn.Linear``
weight ([out, in]) is prepacked at load as fp32 [ceil(out/4), in, 4], so the 4
columns of a tile are one load; a weight computed at run time is read in place as its
transpose.

- linear(input [..., K], weight [N, K], bias [N]?) -> [..., N]: any input rank 1..6.
- addmm(self, mat1 [M, K], mat2 [K, N], beta=1, alpha=1) -> [M, N]: ``self`` is
  any tensor that broadcasts to [M, N]; ATen ignores it (NaN included) when beta is 0.
- bmm(self [B, M, K], mat2 [B, K, N]) -> [B, M, N].

aten.mm.default lives in ops/matmul.py. aten.matmul.default is not registered: export
decomposes it into mm/bmm with expand and view, which run here and in the
data-movement family.
"""
from __future__ import annotations

import math

import numpy as np

from vkdelegate.backend.ops import loop_limit
from vkdelegate.backend.ops.convolution import workgroup_for
from vkdelegate.backend.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare

SHADER = "linear"
DTYPES = frozenset({"float32", "float16"})
SCALAR_PARAMS = ParamBlock("scalars_block", [("scalars", "vec4")])  # alpha, beta


def _defines(out, a, b, bias, layout: str, m_tile: int, long_k: bool = False) -> dict:
    """layout: "kn" (b is [..., K, N]), "nk" (a [N, K] weight read in place) or
    "packed" (a constant [N, K] weight prepacked as fp32 vec4 [ceil(N/4), K])."""
    tensors = dict(OUT=out, A=a, B=b)
    if bias is not None:
        tensors["C"] = bias
    d = storage_defines(**tensors)
    d["M_TILE"] = str(m_tile)
    if long_k:
        d["LONG_K"] = "1"
    if bias is not None:
        d["HAS_BIAS"] = "1"
    if layout == "nk":
        d["B_NK"] = "1"
    elif layout == "packed":
        d["B_PACKED"] = "1"
        # The packed buffer is always fp32 vec4: one variant whatever b's dtype.
        d.pop("B_T")
        d.pop("B_STORE(v)", None)
    return d


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    bias = "HAS_BIAS" in d
    metas = ("out_meta", "a_meta", "b_meta") + (("c_meta",) if bias else ())
    return Bindings(outputs=("out_data",),
                    inputs=("a_data", "b_data") + (("c_data",) if bias else ()),
                    params=tuple(map(tensor_meta_block, metas)) + (SCALAR_PARAMS,))


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """[N, K] weight -> fp32 [ceil(N/4), K, 4], zero-padded: the shader's vec4 rows."""
    n, k = weight.shape
    padded = np.zeros((-(-n // 4) * 4, k), np.float32)
    padded[:n] = weight
    return np.ascontiguousarray(padded.reshape(-1, 4, k).transpose(0, 2, 1))


def _matmul(b, out, a, mat, bias, layout: str, alpha: float = 1.0, beta: float = 1.0):
    if len({t.dtype for t in (out, a, mat) + ((bias,) if bias is not None else ())}) != 1:
        raise b.error("mixed dtypes")
    params = [out.meta, a.meta, mat.meta] + ([bias.meta] if bias is not None else [])
    params.append(b.params(SCALAR_PARAMS.pack(scalars=[alpha, beta])))
    if layout == "packed":
        mat = b.prepacked(pack_weight(b.constant_array(mat)), "float32")
    shape = (1, 1) + tuple(out.max_shape)
    k = a.max_shape[-1] if a.ndim else 1
    # The plain k loop runs K iterations; past llvmpipe's budget, LONG_K does 16 a time.
    long_k = k + loop_limit.SLACK > loop_limit.LOOP_LIMIT
    if long_k:
        loop_limit.check(b, loop_limit.unrolled_iterations(k), f"K = {k}")
    # Rows per invocation: 4 share each b load; a single row (a classifier's batch of
    # one) would waste 3 of them.
    m_tile = 4 if shape[-2] >= 4 else 1
    grid = (-(-shape[-1] // 4), -(-shape[-2] // m_tile), math.prod(shape[:-2]))
    b.dispatch(SHADER, _defines(out, a, mat, bias, layout, m_tile, long_k), outputs=[out],
               inputs=[a, mat] + ([bias] if bias is not None else []), params=params,
               global_size=grid, local_size=workgroup_for(grid))


def _same_dtype(node: NodeSpec):
    dtypes = {t.dtype for t in node.tensors()}
    return None if len(dtypes) == 1 else f"mixed dtypes {sorted(dtypes)}"


def _broadcasts(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


# ---- linear -------------------------------------------------------------------------
def _linear_shape(args):
    return tuple(args[0].shape[:-1]) + (args[1].shape[0],)


def _linear_rule(node: NodeSpec):
    x, w, bias = node.args[0], node.args[1], node.args[2]
    if x.rank < 1 or w.rank != 2 or x.shape[-1] != w.shape[1]:
        return f"input {list(x.shape)} and weight {list(w.shape)} do not match"
    if x.dynamic and x.dynamic[-1]:
        return "dynamic input features"
    if bias is not None and not _broadcasts(bias.shape, (w.shape[0],)):
        return f"bias of sizes {list(bias.shape)} for {w.shape[0]} outputs"
    return None


def _linear_impl(b, node):
    x_id, w_id, bias_id, out_id = node.args
    bias, w = b.value(bias_id), b.tensor(w_id)
    layout = "packed" if b.constant_array(w) is not None else "nk"
    _matmul(b, b.tensor(out_id), b.tensor(x_id), w, bias, layout)


# ---- addmm --------------------------------------------------------------------------
def _addmm_shape(args):
    return (args[1].shape[0], args[2].shape[1])


def _addmm_rule(node: NodeSpec):
    bias, m1, m2 = node.args[0], node.args[1], node.args[2]
    if m1.rank != 2 or m2.rank != 2 or m1.shape[1] != m2.shape[0]:
        return f"cannot multiply {list(m1.shape)} by {list(m2.shape)}"
    if not _broadcasts(bias.shape, (m1.shape[0], m2.shape[1])):
        return f"self of sizes {list(bias.shape)} does not broadcast to the product"
    for name, v in (("beta", node.args[3]), ("alpha", node.args[4])):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return f"{name} {v!r} is not a real number"
    return None


def _addmm_impl(b, node):
    bias_id, m1_id, m2_id, beta_id, alpha_id, out_id = node.args
    beta, alpha = b.scalar(beta_id), b.scalar(alpha_id)
    _matmul(b, b.tensor(out_id), b.tensor(m1_id), b.tensor(m2_id), b.tensor(bias_id),
            "kn", alpha=1.0 if alpha is None else float(alpha),
            beta=1.0 if beta is None else float(beta))


# ---- bmm ----------------------------------------------------------------------------
def _bmm_shape(args):
    a, m = args[0].shape, args[1].shape
    return (a[0], a[1], m[2])


def _bmm_rule(node: NodeSpec):
    a, m = node.args[0], node.args[1]
    if a.rank != 3 or m.rank != 3 or a.shape[0] != m.shape[0] or a.shape[2] != m.shape[1]:
        return f"bmm of {list(a.shape)} and {list(m.shape)}"
    return None


def _bmm_impl(b, node):
    a_id, m_id, out_id = node.args
    _matmul(b, b.tensor(out_id), b.tensor(a_id), b.tensor(m_id), None, "kn")


register(OpSpec(name="aten.linear.default", dtypes=DTYPES, impl=_linear_impl,
                shape_fn=_linear_shape, rules=(_linear_rule, _same_dtype),
                notes="input of any rank, weight read in place, optional bias"))
register(OpSpec(name="aten.addmm.default", dtypes=DTYPES, impl=_addmm_impl,
                shape_fn=_addmm_shape, rules=(_addmm_rule, _same_dtype), max_rank=2,
                notes="broadcast self, beta and alpha"))
register(OpSpec(name="aten.bmm.default", dtypes=DTYPES, impl=_bmm_impl,
                shape_fn=_bmm_shape, rules=(_bmm_rule, _same_dtype), max_rank=3,
                notes="fp32 accumulation"))
for _profile in STORAGE_PROFILES:
    for _dt in DTYPES:
        _ddt = (_dt, device_dtype(_dt, _profile))
        for _layout in ("kn", "nk", "packed"):
            for _bias in (None, _ddt):
                for _m_tile in (1, 4):
                    for _long in (False, True):
                        declare(SHADER, _defines(_ddt, _ddt, _ddt, _bias, _layout, _m_tile,
                                                 _long))
