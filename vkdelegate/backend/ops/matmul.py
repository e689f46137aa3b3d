"""Matrix multiply: aten.mm.default (self [M, K] @ mat2 [K, N] -> [M, N]).

Two shaders: matmul.glsl (one invocation per output, for CPU drivers and tiny
outputs) and matmul_tiled.glsl (TILE x TILE workgroups staging blocks of both operands
in shared memory, for GPUs); ``use_tiled`` chooses.

When ``mat2`` is a constant (a weight), it is prepacked at load as its transpose
[N, K] so that the shader's inner loop reads both operands contiguously; otherwise the
shader reads it as stored. Accumulation is fp32 for fp16 data. Resizable in M (and K
when mat2 is not a constant).
"""
from __future__ import annotations

import numpy as np

from vkdelegate.backend.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import (STORAGE_PROFILES, acc_type, device_dtype,
                                       storage_defines)
from vkdelegate.runtime.param_block import tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare

SHADER = "matmul"
TILED_SHADER = "matmul_tiled"
TILE = 16
REG = 4  # outputs per invocation per dim in the register-blocked tiled shader
DTYPES = frozenset({"float32", "float16"})


#: llvmpipe ends a shader loop after 65535 iterations (common.h LOOP_LIMIT); the simple
#: shader loops K times, the tiled one K / TILE times.
LOOP_LIMIT = 65535


def use_tiled(info, m: int, n: int, k: int = 0) -> bool:
    """Shared-memory tiles pay off on GPUs (each loaded element is used TILE times).
    On CPU drivers (llvmpipe) a workgroup barrier costs more than the reuse saves: the
    tiled shader measured 2.6x slower there at 256x512x256, so they get the simple one
    unless K is longer than its loop may run. Outputs smaller than a tile gain
    nothing."""
    if k > LOOP_LIMIT:
        return True
    return info.type != "cpu" and m * n >= TILE * TILE


def register_block(m: int, n: int) -> int:
    """Outputs per invocation per dim in the tiled shader: 4 (a 64 x 64 block per
    workgroup) once the output has enough such blocks to fill a large GPU (H200:
    slower at 256 x 256 with 16 blocks, 1.7x faster at 1024 x 1024), else 1."""
    return REG if m * n >= 512 * 512 else 1


def _shape(args):
    a, b = args
    return (a.shape[0], b.shape[1])


def _ranks(node: NodeSpec):
    a, b = node.args[0], node.args[1]
    if a.rank != 2 or b.rank != 2:
        return f"mm needs two matrices, got ranks {a.rank} and {b.rank}"
    return None


def _same_dtype(node: NodeSpec):
    dtypes = {t.dtype for t in node.tensors()}
    return None if len(dtypes) == 1 else f"mixed dtypes {sorted(dtypes)}"


def _defines(out, a, b, dtype: str, transposed: bool) -> dict:
    d = storage_defines(OUT=out, A=a, B=b)
    d["ACC_T"] = acc_type(dtype)
    if transposed:
        d["B_TRANSPOSED"] = "1"
    return d


@shader_bindings(SHADER)
@shader_bindings(TILED_SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("a_data", "b_data"),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("a_meta")))


def _impl(b, node):
    a_id, w_id, out_id = node.args
    a, w, out = b.tensor(a_id), b.tensor(w_id), b.tensor(out_id)
    if len({a.dtype, w.dtype, out.dtype}) != 1:
        raise b.error(f"mixed dtypes {a.dtype}, {w.dtype}, {out.dtype}")
    if a.ndim != 2 or w.ndim != 2 or a.max_shape[1] != w.max_shape[0]:
        raise b.error(f"cannot multiply {list(a.max_shape)} by {list(w.max_shape)}")
    weight = b.constant_array(w)
    transposed = weight is not None
    if transposed:
        w = b.prepacked(np.ascontiguousarray(weight.T), w.dtype)
    defines = _defines(out, a, w, out.dtype, transposed)
    m, n = out.max_shape
    k = a.max_shape[1]
    if k > LOOP_LIMIT * TILE and b.device.info.name.startswith("llvmpipe"):
        raise b.error(f"K = {k} exceeds llvmpipe's shader loop limit", limit=True)
    if use_tiled(b.device.info, m, n, k):
        reg = register_block(m, n)
        b.dispatch(TILED_SHADER, dict(defines, TILE=str(TILE), REG=str(reg)),
                   outputs=[out], inputs=[a, w], params=[out.meta, a.meta],
                   global_size=(-(-n // reg), -(-m // reg)), local_size=(TILE, TILE, 1))
        return
    b.dispatch(SHADER, defines, outputs=[out],
               inputs=[a, w], params=[out.meta, a.meta], global_size=(out.max_numel,),
               local_size=b.local_size_1d(out.max_numel))


register(OpSpec(name="aten.mm.default", dtypes=DTYPES, impl=_impl, shape_fn=_shape,
                rules=(_ranks, _same_dtype), max_rank=2,
                notes="constant mat2 prepacked transposed"))
for _profile in STORAGE_PROFILES:
    for _dt in DTYPES:
        _ddt = (_dt, device_dtype(_dt, _profile))
        for _t in (False, True):
            declare(SHADER, _defines(_ddt, _ddt, _ddt, _dt, _t))
            for _reg in (1, REG):
                declare(TILED_SHADER, dict(_defines(_ddt, _ddt, _ddt, _dt, _t),
                                           TILE=str(TILE), REG=str(_reg)))
