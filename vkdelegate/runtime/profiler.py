"""Per-node GPU times from timestamp queries, as a table or a Chrome trace.

``DelegateGraph.execute(..., profile=True)`` replays a second command buffer (recorded
on first use) that writes a timestamp once the input uploads have completed (they are
not in any dispatch's time) and after each dispatch, with a barrier between all
dispatches so that every interval belongs to one dispatch. Its times therefore show
each node's own cost, without the overlap of the normal run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import vulkan as vk

from vkdelegate.runtime.vkcall import vk_call


@dataclass
class DispatchTime:
    """GPU time of one dispatch: node id, op name, shader name, start/duration in ns
    relative to the first timestamp."""

    node_id: int
    op: str
    shader: str
    start_ns: float
    duration_ns: float


@dataclass
class Profile:
    """The timings of one profiled execute."""

    dispatches: list[DispatchTime]

    @classmethod
    def from_queries(cls, device, pool, dispatches) -> "Profile":
        """Read the len(dispatches) + 1 timestamps of ``pool`` (waiting for them)."""
        n = len(dispatches) + 1
        data = vk.ffi.new("uint64_t[]", n)
        vk_call(vk.vkGetQueryPoolResults, device.device, pool, 0, n, 8 * n, data, 8,
                vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT,
                what="the profiling timestamps")
        bits = device.timestamp_bits
        mask = (1 << bits) - 1 if bits < 64 else (1 << 64) - 1
        period = device.info.timestamp_period_ns
        ticks = [int(data[i]) & mask for i in range(n)]
        times = [DispatchTime(d.node_id, d.op, d.pipeline.name,
                              (ticks[i] - ticks[0]) * period,
                              ((ticks[i + 1] - ticks[i]) & mask) * period)
                 for i, d in enumerate(dispatches)]
        return cls(times)

    @property
    def total_ns(self) -> float:
        """Sum of the dispatches' GPU times, in ns."""
        return sum(d.duration_ns for d in self.dispatches)

    def table(self) -> str:
        """A text table: node, op, shader, time in microseconds, share of the total."""
        from tabulate import tabulate

        total = self.total_ns or 1.0
        rows = [(d.node_id, d.op, d.shader, f"{d.duration_ns / 1e3:.1f}",
                 f"{100 * d.duration_ns / total:.1f}%") for d in self.dispatches]
        rows.append(("", "total", "", f"{self.total_ns / 1e3:.1f}", "100%"))
        return tabulate(rows, headers=["node", "op", "shader", "GPU us", "share"])

    def chrome_trace(self) -> dict:
        """Chrome trace-event JSON (open in Perfetto or chrome://tracing); times in us."""
        events = [{"name": d.op, "cat": d.shader, "ph": "X", "pid": 0, "tid": 0,
                   "ts": d.start_ns / 1e3, "dur": d.duration_ns / 1e3,
                   "args": {"node_id": d.node_id}} for d in self.dispatches]
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def write_chrome_trace(self, path) -> None:
        """Write ``chrome_trace()`` as JSON to ``path``."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
