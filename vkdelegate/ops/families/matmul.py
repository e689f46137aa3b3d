"""Matrix multiply: aten.mm.default (self [M, K] @ mat2 [K, N] -> [M, N]).

kernels/gemm.py's ``select`` chooses the shader and records it: the GEMM core
(gemm.glsl; on GPUs, and on CPU drivers for more than one row), the GEMV path
(gemv.glsl; one row on GPUs), else matmul.glsl (one invocation per output) or
matmul_tiled.glsl (one row whose K is past llvmpipe's loop budget).

When ``mat2`` is a constant (a weight), it is prepacked at load as its transpose
[N, K] so that the shader's inner loop reads both operands contiguously; otherwise the
shader reads it as stored. Accumulation is fp32 for fp16 data. Resizable in M (and K
when mat2 is not a constant).
"""
from __future__ import annotations

import numpy as np

from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.kernels import gemm
from vkdelegate.kernels.rules import same_dtype


def _shape(args):
    a, b = args
    return (a.shape[0], b.shape[1])


def _ranks(node: NodeSpec):
    a, b = node.args[0], node.args[1]
    if a.rank != 2 or b.rank != 2:
        return f"mm needs two matrices, got ranks {a.rank} and {b.rank}"
    return None


def _transposed(weight: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(weight.T)


def _impl(b, node):
    a_id, w_id, out_id = node.args
    a, w, out = b.tensor(a_id), b.tensor(w_id), b.tensor(out_id)
    if len({a.dtype, w.dtype, out.dtype}) != 1:
        raise b.error(f"mixed dtypes {a.dtype}, {w.dtype}, {out.dtype}")
    if a.ndim != 2 or w.ndim != 2 or a.max_shape[1] != w.max_shape[0]:
        raise b.error(f"cannot multiply {list(a.max_shape)} by {list(w.max_shape)}")
    transposed = b.constant_array(w) is not None
    if transposed:
        w = b.packed_constant(w, _transposed, w.dtype)
    gemm.mm(b, out, a, w, transposed)


register(OpSpec(name="aten.mm.default", dtypes=gemm.DTYPES, impl=_impl, shape_fn=_shape,
                rules=(_ranks, same_dtype), max_rank=2,
                notes="constant mat2 prepacked transposed"))
