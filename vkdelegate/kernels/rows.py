"""Row reductions: one output per row of ``n`` elements, in one of two forms.

A shader with both forms (reduce_sum.glsl, reduce.glsl, softmax.glsl) runs either one
invocation per output or, with ``WG_REDUCE`` defined, one workgroup of WG_REDUCE
invocations per output with a tree in shared memory. ``cooperative`` picks the form
from the device and the row length; ``dispatch_rows`` records the dispatch and
``row_forms`` gives both variants to declare; ``row_bindings`` is the bindings all three
shaders share. Torch-free; registers no op.
"""
from __future__ import annotations

from vkdelegate.kernels import loop_limit
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings

WG_REDUCE = 64  # invocations per output in the cooperative form (a power of two)

#: Longest pass (elements per output times passes over them) each form can walk on
#: llvmpipe, within its loop budget (loop_limit.py: every loop of an invocation counts,
#: and SLACK covers sum's remainder, the trees and each pass's partial block); both
#: forms load UNROLL (16) elements per loop iteration.
THREAD_MAX = (loop_limit.LOOP_LIMIT - loop_limit.SLACK) * loop_limit.UNROLL
COOPERATIVE_MAX = THREAD_MAX * WG_REDUCE


def cooperative(info, reduced: int) -> bool:
    """The cooperative form (one workgroup per output) on GPUs once an output sums at
    least 4 elements per invocation: loads coalesce and the tree is more accurate.
    On CPU drivers workgroup barriers are dear (llvmpipe: 6x slower at 1024 x 1024),
    so they use it only for sums longer than the per-invocation form can do there.
    ``reduced``: elements per output times the passes the shader makes over them
    (var: 2, softmax: 3), which is what llvmpipe's loop limit counts."""
    if reduced > THREAD_MAX:
        return True
    return info.type != "cpu" and reduced >= 4 * WG_REDUCE


def dispatch_rows(b, shader: str, defines: dict, out, x, params, rows: int, n: int,
                  passes: int, what: str, local_size=(64, 1, 1), outputs=None,
                  inputs=None, rows_now=None) -> None:
    """One dispatch of a shader with both forms (reduce_sum.glsl, reduce.glsl,
    softmax.glsl): ``rows`` outputs (upper bound) of ``n`` elements each, walked
    ``passes`` times; the cooperative form (``cooperative``) is one workgroup of
    WG_REDUCE per row, the other one invocation per row in workgroups of
    ``local_size``. Raises DeviceLimitError (b.error) on llvmpipe when even the
    cooperative form would pass its shader loop limit; the message starts with
    ``what`` (e.g. "a sum of 7 elements per output"). ``outputs``/``inputs``: the
    buffers in binding order when the shader has more than ``out`` and ``x`` (norm.glsl:
    mean and rstd, weight and bias). ``rows_now``: () -> the rows of the current
    sizes (NodeBuilder.dispatch's ``grid``), or None: the grid stays at ``rows``."""
    outputs = [out] if outputs is None else outputs
    inputs = [x] if inputs is None else inputs
    if n * passes > COOPERATIVE_MAX and loop_limit.is_llvmpipe(b.device.info):
        raise b.error(f"{what} exceeds llvmpipe's shader loop limit "
                      f"({COOPERATIVE_MAX // passes})", limit=True)
    if cooperative(b.device.info, n * passes):
        b.dispatch(shader, dict(defines, WG_REDUCE=str(WG_REDUCE)), outputs=outputs,
                   inputs=inputs, params=params, global_size=(rows * WG_REDUCE,),
                   local_size=(WG_REDUCE, 1, 1),
                   grid=None if rows_now is None else lambda: (rows_now() * WG_REDUCE,))
        return
    b.dispatch(shader, defines, outputs=outputs, inputs=inputs, params=params,
               global_size=(rows,), local_size=local_size,
               grid=None if rows_now is None else lambda: (rows_now(),))


def row_forms(defines: dict) -> list[dict]:
    """Both variants ``dispatch_rows`` may pick for ``defines`` (for ``declare_grid``)."""
    return [defines, dict(defines, WG_REDUCE=str(WG_REDUCE))]


def row_bindings(block: ParamBlock) -> Bindings:
    """The bindings of a row shader (reduce_sum, reduce, softmax): output, input, their
    metadata, then the op's ``block``."""
    return Bindings(outputs=("out_data",), inputs=("in_data",),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            block))


#: The vector row form (norm.glsl's ROW_VEC; GPUs): workgroups of up to ROW_WG
#: invocations (a power of two), VEC_PER vec4s of the row in each invocation's
#: registers, so rows up to ROW_VEC_MAX elements.
ROW_WG = 256
VEC_PER = 8
ROW_VEC_MAX = 4 * VEC_PER * ROW_WG


def vector_rows(info, n: int) -> bool:
    """The vector row form for rows of ``n`` elements (an upper bound) on device
    ``info``: GPUs only (on CPU drivers the barriers of a workgroup per row cost more
    than they save for the few long rows of LLM decode; llvmpipe keeps the forms
    above), rows of at most ROW_VEC_MAX elements."""
    return info.type != "cpu" and n <= ROW_VEC_MAX


def vector_row_wg(n: int) -> int:
    """Invocations per row of the vector row form for rows of ``n`` elements: about
    two vec4s each, a power of two from 32 (one NVIDIA subgroup) to ROW_WG."""
    wg = 32
    while wg < ROW_WG and 2 * 4 * wg < n:
        wg *= 2
    return wg
