"""llvmpipe's shader loop budget, as op builders check it.

llvmpipe (lavapipe, the CI device) silently ends an invocation's loops after
LOOP_LIMIT iterations in all: one counter per invocation, decremented by every
iteration of every loop (sequential passes add up, nested loops multiply); results
past that point are simply missing. Shaders whose loops grow with the data do
UNROLL elements per iteration with an ``[[unroll]]``ed inner loop, or spread the work
over a workgroup (reduce.glsl, softmax.glsl); builders estimate the worst-case count
at the upper-bound sizes and call ``check`` so that a shape the shader cannot finish
fails at load with the op and the size named, instead of giving wrong numbers. Other
drivers have no such limit. Torch-free; registers no op. Read by every op family
whose shader loops grow with the data (reduce, convolution, GEMM, pooling).
"""
from __future__ import annotations

#: Loop iterations one invocation may run on llvmpipe (common.h LOOP_LIMIT).
LOOP_LIMIT = 65535
#: Elements per loop iteration of the unrolled shader loops.
UNROLL = 16
#: Iterations reserved for a shader's short fixed loops (remainders, output stores,
#: shared-memory trees) besides the long ones an estimate counts.
SLACK = 48


def is_llvmpipe(info) -> bool:
    """Whether the device (a DeviceInfo) is llvmpipe, which has the loop limit."""
    return info.name.startswith("llvmpipe")


def unrolled_iterations(elements: int) -> int:
    """Iterations of a loop over ``elements`` with UNROLL per iteration plus a
    remainder loop of fewer than UNROLL."""
    return elements // UNROLL + UNROLL - 1


def over_budget(iterations: int) -> bool:
    """Whether a shader form whose loops run ``iterations`` times per invocation (a
    worst-case estimate) would pass LOOP_LIMIT once SLACK is added: the point where an
    op switches to its unrolled long-loop variant (on every device, so that the
    variant chosen does not depend on the driver)."""
    return iterations + SLACK > LOOP_LIMIT


def check(b, iterations: int, what: str) -> None:
    """Raise DeviceLimitError (through NodeBuilder.error, naming the node) when
    ``iterations`` (a worst-case estimate per invocation at the upper-bound sizes)
    plus SLACK exceeds llvmpipe's loop budget on an llvmpipe device.

    what: the size that is too large, e.g. "K = 2000000" (goes into the message)."""
    if over_budget(iterations) and is_llvmpipe(b.device.info):
        raise b.error(f"{what} needs about {iterations} shader loop iterations per "
                      f"invocation, more than llvmpipe runs ({LOOP_LIMIT - SLACK})",
                      limit=True)
