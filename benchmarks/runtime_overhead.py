"""Host time per execute: a 200-node chain vs a 2-node graph (the issue-3 benchmark).

Build once, run many means an inference costs one submit and one fence wait however
many nodes there are. This script builds a chain of N small elementwise nodes
(alternating add and relu on a float32 tensor of --numel elements) for N = 2 and 200,
runs each --runs times after --warmup runs, and prints the median per execute of:
total wall time, time blocked in the fence wait (the device working), and host time
(the rest: input writes, submit, output reads). Host time should not grow with N.

Two more columns separate our host work from the machine's state:
- "Python calls": function calls (Python and C) the host thread makes in one execute,
  counted with sys.setprofile; equal counts mean no per-node host work.
- "settled host us": host time when each run starts after --settle-ms of idle time.
  On a CPU driver (lavapipe) the "device" is the same CPU: back to back, a 200-node
  run leaves the caches full of the driver's data, and the next run's host code is
  slower although it does the same work. On a GPU both columns agree.

    python benchmarks/runtime_overhead.py [--runs 200] [--numel 64] [--device NAME]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from tabulate import tabulate

from vkdelegate.runtime import DelegateGraph, default_device
from vkdelegate.runtime.host_calls import count_calls
from vkdelegate.serialization import vkgraph as g


def chain_graph(nodes: int, numel: int) -> g.VkGraph:
    """x -> add(x, x) -> relu -> add(., x) -> relu ... with ``nodes`` nodes."""
    f32 = g.VkDataType.FLOAT32
    values = [g.VkTensor(f32, [numel]), g.Int(1)]
    chain, prev = [], 0
    for i in range(nodes):
        values.append(g.VkTensor(f32, [numel]))
        out = len(values) - 1
        if i % 2 == 0:
            chain.append(g.OperatorCall(i, "aten.add.Tensor", [prev, 0, 1, out]))
        else:
            chain.append(g.OperatorCall(i, "aten.relu.default", [prev, out]))
        prev = out
    return g.VkGraph(chain=chain, values=values, input_ids=[0], output_ids=[prev])


def measure(device, nodes: int, numel: int, runs: int, warmup: int,
            settle_s: float, staging=None) -> dict:
    x = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
    with DelegateGraph(chain_graph(nodes, numel), lambda i: b"", device=device,
                       staging=staging) as graph:
        for _ in range(warmup):
            graph.execute([x])
        samples = []
        for _ in range(runs):
            graph.execute([x])
            samples.append(dict(graph.last_timing))
        settled = []
        for _ in range(max(1, runs // 4)):
            time.sleep(settle_s)
            graph.execute([x])
            settled.append(graph.last_timing["host_s"])
        calls = count_calls(lambda: graph.execute([x]))
        assert graph.recordings == 1
    out = {k: statistics.median(s[k] for s in samples) * 1e6
           for k in ("total_s", "fence_wait_s", "host_s")}
    out["settled_host_s"] = statistics.median(settled) * 1e6
    out["calls"] = calls
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--numel", type=int, default=64)
    parser.add_argument("--settle-ms", type=float, default=20.0,
                        help="idle time before each settled run")
    parser.add_argument("--device", default=None, help="index or name substring")
    parser.add_argument("--staging", choices=["auto", "on", "off"], default="auto",
                        help="inputs/outputs through staging buffers, or mapped memory")
    args = parser.parse_args(argv)
    device = default_device(args.device)
    rows, results = [], {}
    for nodes in (2, 200):
        staging = {"auto": None, "on": True, "off": False}[args.staging]
        r = results[nodes] = measure(device, nodes, args.numel, args.runs, args.warmup,
                                     args.settle_ms / 1e3, staging)
        rows.append([nodes, f"{r['total_s']:.0f}", f"{r['fence_wait_s']:.0f}",
                     f"{r['host_s']:.0f}", f"{r['settled_host_s']:.0f}", r["calls"]])
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}")
    print(f"median of {args.runs} runs, {args.numel} float32 elements per tensor, "
          f"staging {args.staging}\n")
    print(tabulate(rows, headers=["nodes", "total us", "fence wait us", "host us",
                                  "settled host us", "Python calls"]))
    for key, label in (("host_s", "back to back"), ("settled_host_s", "settled")):
        ratio = results[200][key] / results[2][key]
        print(f"host time ratio 200 / 2 nodes, {label}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
