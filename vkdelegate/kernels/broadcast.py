"""Broadcast shapes and index plans for elementwise ops whose operands broadcast (binary_op, ternary_op).

An output element's flat index ``i`` maps to one offset per operand. Instead of
walking all 8 metadata dims with a ``%`` and a ``/`` each (llvmpipe scalarizes integer
division, so that cost a broadcasting add 5x a unary op's time), the host folds the
shapes into a *plan*: output dims of size 1 are dropped, and neighbouring dims that no
operand treats differently (each operand either follows both, contiguously, or
broadcasts both) merge into one. Each operand gets a stride per plan dim, 0 where it
broadcasts. Same-shape operands give a rank-1 plan (no division at all); a per-channel
bias on NCHW gives rank 2 or 3.

On CPU drivers an invocation computes up to 8 consecutive elements of the innermost
plan dim (``CHUNK``, id 4, ``chunk_for``), walking the plan once for them.

The plan's rank is a specialization constant (``NDIM``, id 3, see broadcast_plan.h),
fixed when the node is built from the upper-bound sizes; the sizes and strides live in
an op-owned uniform buffer rewritten after every resize. A resize only shrinks sizes,
which never adds plan dims for programs torch.export produces (an operand dim either
equals the output's or is the static size 1); a resize that would need more dims than
the node was built for raises VkDelegateError rather than computing wrong offsets.
"""
from __future__ import annotations

from dataclasses import dataclass

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.affine_copy import contiguous_strides
from vkdelegate.runtime.param_block import ParamBlock

MAX_PLAN_DIMS = 8
MAX_OPERANDS = 3


def broadcast_shape(a, b) -> tuple:
    """numpy/ATen broadcast of two size tuples (VkDelegateError if incompatible)."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise VkDelegateError(f"sizes {list(a)} and {list(b)} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


@dataclass(frozen=True)
class BroadcastPlan:
    """sizes: plan dim sizes, innermost first (at least one dim).
    strides: per operand, its element stride per plan dim (0: broadcast).
    numel: output elements."""

    sizes: tuple
    strides: tuple
    numel: int

    @property
    def ndim(self) -> int:
        return len(self.sizes)


def broadcast_plan(out_shape, operand_shapes) -> BroadcastPlan:
    """The plan mapping an output of ``out_shape`` to contiguous operands of
    ``operand_shapes`` (each broadcasts to out_shape: right-aligned, every dim equal to
    the output's or 1). Raises VkDelegateError if an operand does not broadcast."""
    out_shape = tuple(int(s) for s in out_shape)
    n = len(out_shape)
    per_operand = []
    for shape in operand_shapes:
        shape = tuple(int(s) for s in shape)
        if len(shape) > n:
            raise VkDelegateError(f"operand sizes {list(shape)} have more dims than the "
                                  f"output {list(out_shape)}")
        padded = (1,) * (n - len(shape)) + shape
        strides = [0] * (n - len(shape)) + contiguous_strides(shape)
        row = []
        for size, out_size, stride in zip(padded, out_shape, strides):
            if size == out_size:
                row.append(stride)
            elif size == 1:
                row.append(0)
            else:
                raise VkDelegateError(f"operand sizes {list(shape)} do not broadcast to "
                                      f"the output sizes {list(out_shape)}")
        per_operand.append(row)
    # Walk from the innermost dim outwards, merging a dim into the current plan dim
    # when every operand's stride continues it (outer stride = inner stride x size).
    sizes: list = []
    strides: list = [[] for _ in per_operand]
    for d in reversed(range(n)):
        if out_shape[d] == 1:
            continue
        if sizes and all(row[d] == s[-1] * sizes[-1] for row, s in zip(per_operand, strides)):
            sizes[-1] *= out_shape[d]
            continue
        sizes.append(out_shape[d])
        for row, s in zip(per_operand, strides):
            s.append(row[d])
    if not sizes:  # every dim has size 1 (or the output is 0-d): one element
        sizes = [1]
        strides = [[0] for _ in per_operand]
    numel = 1
    for s in out_shape:
        numel *= s
    return BroadcastPlan(tuple(sizes), tuple(tuple(s) for s in strides), numel)


PLAN_PARAMS = ParamBlock("broadcast_plan_block", [
    ("bp_size", f"ivec4[{MAX_PLAN_DIMS // 4}]"),  # plan dim sizes, innermost first
    ("bp_stride", f"ivec4[{MAX_OPERANDS * MAX_PLAN_DIMS // 4}]"),  # per operand
    ("bp_info", "ivec4")])  # x: output numel; CHUNK > 1: y invocations, z per row


#: broadcast_plan.h's largest CHUNK on CPU drivers: output elements per invocation.
CPU_CHUNK = 8


def chunk_for(plan: BroadcastPlan, cpu: bool) -> int:
    """broadcast_plan.h's CHUNK (a specialization constant, fixed per node) for the
    load-time ``plan``: on CPU drivers CPU_CHUNK, or the power of two that covers a
    shorter innermost plan dim (the shader runs every slot of a chunk, used or not);
    1 on GPUs, which keep one element per invocation (coalesced)."""
    inner = plan.sizes[0]
    if not cpu or inner <= 1:
        return 1
    return min(CPU_CHUNK, 1 << (inner - 1).bit_length())


def invocations(plan: BroadcastPlan, chunk: int) -> tuple[int, int]:
    """(invocations, invocations per row of the innermost plan dim) of ``plan`` at
    ``chunk`` elements per invocation (chunk 1: one per element, per row unused)."""
    if chunk == 1:
        return plan.numel, 0
    inner = plan.sizes[0]
    per_row = -(-inner // chunk)
    return (plan.numel // inner * per_row if inner else 0), per_row


def plan_record(plan: BroadcastPlan, ndim: int, chunk: int = 1) -> bytes:
    """The std140 bytes of ``broadcast_plan_block`` (broadcast_plan.h) for a shader
    specialized to ``ndim`` plan dims and ``chunk`` (CHUNK): ``plan`` padded with
    outer dims of size 1. Raises VkDelegateError if the plan needs more than ``ndim``
    dims."""
    if plan.ndim > ndim:
        raise VkDelegateError(f"the operand sizes need a {plan.ndim}-dim broadcast plan; "
                              f"the node was built for {ndim} (an operand shrank where "
                              f"the output did not)")
    if ndim > MAX_PLAN_DIMS or len(plan.strides) > MAX_OPERANDS:
        raise VkDelegateError(f"broadcast plan of {ndim} dims and {len(plan.strides)} "
                              f"operands exceeds {MAX_PLAN_DIMS} dims / {MAX_OPERANDS}")
    pad = MAX_PLAN_DIMS - plan.ndim
    strides = []
    for s in plan.strides:  # operand k's strides at rows 2k, 2k + 1 (0: broadcast)
        strides += list(s) + [0] * pad
    count, per_row = invocations(plan, chunk)
    return PLAN_PARAMS.pack(bp_size=list(plan.sizes) + [1] * pad, bp_stride=strides,
                            bp_info=[plan.numel, count, per_row])


def plan_dispatch(b, shader: str, defines: dict, out, operands: list,
                  extra_params: tuple = (), extra_outputs: tuple = ()) -> None:
    """Record an elementwise dispatch of ``shader`` over ``out`` (then
    ``extra_outputs``, e.g. an ErrorFlag) reading ``operands`` (Tensors, bindings after
    the outputs), then the plan uniform, then ``extra_params`` (ParamBuffers). The plan's rank at the upper-bound sizes becomes
    the specialization constant NDIM; the plan is rewritten after every resize."""
    def current() -> BroadcastPlan:
        return broadcast_plan(out.shape, [t.shape for t in operands])

    largest = broadcast_plan(out.max_shape, [t.max_shape for t in operands])
    ndim = max(1, largest.ndim)
    if ndim > MAX_PLAN_DIMS:
        raise b.error(f"broadcast over {ndim} unmergeable dims (at most {MAX_PLAN_DIMS})")
    chunk = chunk_for(largest, b.device.info.type == "cpu")
    grid = invocations(largest, chunk)[0]
    params = b.params(plan_record(current(), ndim, chunk))

    def replan() -> None:
        plan = current()
        if invocations(plan, chunk)[0] > grid:  # sizes only shrink: not expected
            raise VkDelegateError(f"the operand sizes need {invocations(plan, chunk)[0]} "
                                  f"invocations; the node was built for {grid}")
        params.write(plan_record(plan, ndim, chunk))
    b.on_resize(replan)
    b.dispatch(shader, defines, outputs=[out, *extra_outputs], inputs=list(operands),
               params=[params, *extra_params], global_size=(grid,),
               local_size=b.local_size_1d(grid), spec_constants=(ndim, chunk),
               grid=lambda: (invocations(current(), chunk)[0],))
