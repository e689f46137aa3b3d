"""L2 prefetch: a graph's constants (weights) brought into the GPU's L2 cache while
earlier stages run.

An LLM decode step is a chain of dependent dispatches ("stages": the barrier-free runs
of ``commands.barriers_before``), many of them bound by latency rather than by memory
(the attention of one token, the small GEMVs): the memory system idles while they run,
and the next GEMV then waits for its weights from DRAM. With PREFETCH_MB > 0 the graph
gets, at the end of each stage, one l2_prefetch.glsl dispatch per constant buffer (of
MIN_BYTES or more) that the next stages read, as far ahead as keeps the running stage's
constants and the prefetched-but-unread ones within PREFETCH_MB (a stage whose
constants alone exceed it is never prefetched); the last stage prefetches the first
stage's constants, for the next run (``execute(repeat=)``, a decode loop). A prefetch
reads only constants and writes only a buffer of its own, so it adds no barrier: it
runs beside the stage it joins, and the barrier after that stage waits for it too (a
prefetch for two stages ahead is on the next stage's critical path). Results are
unchanged (the same dispatches read the same bytes).

Off (0) by default and on CPU drivers (no cache to fill): a tuning form until measured
on a GPU (benchmarks/gpu_suite.sh ``prefetch``; docs/PERF.md). Set it as the benchmarks
set kernel forms (``prefetch.PREFETCH_MB=24``).
"""
from __future__ import annotations

from vkdelegate.runtime.builder import Dispatch
from vkdelegate.runtime.commands import barriers_before
from vkdelegate.runtime.memory import STORAGE_USAGE
from vkdelegate.runtime.pipeline import STORAGE
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare

SHADER = "l2_prefetch"
#: MB of constants prefetched ahead of their readers at most (0: off). The L2 of an
#: H100 / H200 holds 50 MB; an int4 1B decode layer's weights are 32 MB (gate/up 17.8).
PREFETCH_MB = 0
#: Invocations per workgroup, sectors (32 bytes) per invocation per iteration, and the
#: most workgroups per prefetch dispatch (it shares the GPU with the stage it joins).
WG = 256
UNROLL = 8
MAX_GROUPS = 264
SECTOR = 32
#: Constants smaller than this are not prefetched (a norm weight, a bias: their
#: dispatches would cost the GPU's command processor more than their loads).
MIN_BYTES = 256 << 10

shader_bindings(SHADER)(lambda defines: Bindings(outputs=("sink",), inputs=("data",)))
declare(SHADER, {"UNROLL": str(UNROLL)})


def applies(info) -> bool:
    """Whether a device (``info``: its DeviceInfo) takes prefetches: GPUs, not CPU
    drivers."""
    return info.type != "cpu"


def stages(dispatches) -> list[range]:
    """The index ranges of ``dispatches`` between pipeline barriers, in order."""
    starts = [i for i, b in enumerate(barriers_before(dispatches)) if b or i == 0]
    return [range(a, b) for a, b in zip(starts, starts[1:] + [len(dispatches)])]


def plan(dispatches, budget: int) -> dict[int, list]:
    """Where to prefetch which constant buffers: {index of the stage's end (insert
    before it), [Buffer, ...]} for a budget of ``budget`` bytes. Each stage's constants
    (``Dispatch.constants``, distinct buffers of MIN_BYTES or more) are prefetched at
    the end of the earliest stage before theirs whose window allows: stages in order,
    as long as the running stage's constants and those prefetched for stages not yet
    run stay within the budget (a stage whose constants alone exceed it is never
    prefetched); the last stage prefetches the first's, within the same rule."""
    runs = stages(dispatches)
    wanted = []  # per stage: its distinct constant buffers
    for run in runs:
        seen = {}
        for i in run:
            for buf in dispatches[i].constants:
                if buf.size >= MIN_BYTES:
                    seen.setdefault(id(buf), buf)
        wanted.append(list(seen.values()))
    size = [sum(b.size for b in bufs) for bufs in wanted]
    out: dict[int, list] = {}
    ahead = [0] * len(runs)  # bytes prefetched for stage k, not yet read
    nxt = 1
    for s, run in enumerate(runs):
        ahead[s] = size[s]  # stage s reads its own meanwhile: they count too
        nxt = max(nxt, s + 1)
        while nxt < len(runs) and sum(ahead) + size[nxt] <= budget:
            if wanted[nxt]:
                out.setdefault(run.stop, []).extend(wanted[nxt])
                ahead[nxt] = size[nxt]
            nxt += 1
        ahead[s] = 0  # read once the stage ends
    if len(runs) > 1 and wanted[0] and size[-1] + size[0] <= budget:
        out.setdefault(runs[-1].stop, []).extend(wanted[0])  # for the next run
    return out


def add_prefetches(graph, budget_mb: "float | None" = None) -> int:
    """Insert ``plan``'s prefetch dispatches into ``graph.dispatches`` (a
    DelegateGraph's, before its descriptor sets are made); returns how many. Nothing
    on CPU drivers or with a budget of 0 (None: PREFETCH_MB)."""
    budget = int((PREFETCH_MB if budget_mb is None else budget_mb) * (1 << 20))
    device = graph.device
    if budget <= 0 or not applies(device.info) or not graph.dispatches:
        return 0
    where = plan(graph.dispatches, budget)
    if not where:
        return 0
    pipeline = device.pipelines.get(SHADER, {"UNROLL": str(UNROLL)}, (STORAGE, STORAGE),
                                    (WG, 1, 1))
    sink = graph.allocator.buffer(16, STORAGE_USAGE, False, "the L2 prefetch sink")
    added = []
    for at in sorted(where, reverse=True):  # inserting from the end keeps the indices
        made = []
        for buf in where[at]:
            sectors = max(1, buf.size // SECTOR)
            groups = max(1, min(MAX_GROUPS, -(-sectors // (WG * UNROLL))))
            made.append(Dispatch(node_id=-1, op=SHADER, pipeline=pipeline,
                                 buffers=[sink, buf], groups=(groups, 1, 1),
                                 reads={buf.region}))
        graph.dispatches[at:at] = made
        added += made
    return len(added)
