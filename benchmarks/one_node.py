"""One-node graph benchmarks: the graph builder, the timing loop and the table that
the per-family scripts (cnn_ops.py, movement_ops.py, elementwise_ops.py) share.

A script lists its cases as functions returning a built :class:`OneNode` (a name, a
one-node VkGraph, its input arrays and constants, and its work: ``flops`` or bytes
``moved``) and calls :func:`main`. Torch-free: the data is seeded numpy.
"""
from __future__ import annotations

import argparse
import math
import resource
from typing import Callable, Sequence

import numpy as np
from tabulate import tabulate

from vkdelegate.runtime import DelegateGraph, default_device
from vkdelegate.serialization import vkgraph as g

_DT = {name: dt for dt, name in g.DTYPE_NAMES.items()}


class OneNode:
    """A VkGraph with one node: tensors and scalars added in the op schema's order,
    the output(s) last (see DESIGN.md section 3).

    dtypes are numpy names ("float32", "int64", "bool", ...). ``moved`` counts the
    bytes of every input tensor and every output written (constants are weights,
    uploaded once, so they are not counted); a case adjusts it when the op reads only
    part of an input. ``flops`` is set by cases whose throughput is arithmetic.
    """

    def __init__(self, name: str = ""):
        self.name = name
        self.values: list = []
        self.consts: list[bytes] = []
        self.inputs: list[int] = []
        self.arrays: list[np.ndarray] = []
        self.args: list[int] = []
        self.moved = 0
        self.flops: "int | None" = None
        self.built: "g.VkGraph | None" = None

    def _add(self, value) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def _data(self, shape, dtype, high, positive) -> np.ndarray:
        # Seeded by the value id: every run of a script builds the same data.
        rng = np.random.default_rng(len(self.values))
        if dtype == "bool":
            return rng.integers(0, 2, shape).astype(bool)
        data = rng.integers(0, high, shape) if high else rng.standard_normal(shape)
        if positive:  # e.g. a batch norm's running variance
            data = np.abs(data) + 0.5
        return data.astype(dtype)

    def _input_id(self, shape, dtype="float32", high=None, positive=False) -> int:
        data = self._data(shape, dtype, high, positive)
        vid = self._add(g.VkTensor(_DT[dtype], list(shape)))
        self.inputs.append(vid)
        self.arrays.append(data)
        self.moved += data.nbytes
        return vid

    def input(self, shape, dtype="float32", high=None, positive=False) -> "OneNode":
        """An input tensor argument: standard normal data, integers in [0, high) when
        ``high`` is given, |x| + 0.5 when ``positive``, random 0/1 for bool."""
        self.args.append(self._input_id(shape, dtype, high, positive))
        return self

    def inputs_list(self, shapes, dtype="float32") -> "OneNode":
        """A list-of-tensors argument (cat's tensors): one ValueList of new inputs."""
        ids = [self._input_id(s, dtype) for s in shapes]
        self.args.append(self._add(g.ValueList(ids)))
        return self

    def constant(self, shape, dtype="float32", high=None, positive=False) -> "OneNode":
        """A constant tensor argument (a weight): stored in the constants section,
        uploaded once when the graph is built, not per run."""
        data = self._data(shape, dtype, high, positive)
        self.consts.append(data.tobytes())
        self.args.append(self._add(g.VkTensor(_DT[dtype], list(shape),
                                              constant_id=len(self.consts) - 1)))
        return self

    def arg(self, value) -> "OneNode":
        """A scalar argument: None, bool, int, float, str, or a list of ints/floats."""
        if value is None:
            v = g.Null()
        elif isinstance(value, bool):  # before int: True == 1
            v = g.Bool(value)
        elif isinstance(value, int):
            v = g.Int(value)
        elif isinstance(value, float):
            v = g.Double(value)
        elif isinstance(value, str):
            v = g.String(value)
        elif all(isinstance(x, int) for x in value):
            v = g.IntList(list(value))
        else:
            v = g.DoubleList([float(x) for x in value])
        self.args.append(self._add(v))
        return self

    def graph(self, op: str, outs: Sequence, graph_outputs: "int | None" = None) -> "OneNode":
        """Add the node ``op`` writing ``outs``: (shape, dtype) pairs, several make a
        ValueList (a multi-output op). The first ``graph_outputs`` of them (all when
        None) are read back after each run. Returns self with ``built`` set."""
        ids = [self._add(g.VkTensor(_DT[dt], list(s))) for s, dt in outs]
        self.moved += sum(math.prod(s) * np.dtype(dt).itemsize for s, dt in outs)
        out = ids[0] if len(ids) == 1 else self._add(g.ValueList(ids))
        offsets, pos = [], 0
        for c in self.consts:
            offsets.append(g.VkBytes(pos, len(c)))
            pos += len(c)
        self.built = g.VkGraph(chain=[g.OperatorCall(0, op, self.args + [out])],
                               values=self.values, input_ids=self.inputs,
                               output_ids=ids[:graph_outputs], constants=offsets)
        return self

    def constant_bytes(self, i: int) -> bytes:
        return self.consts[i]


def cpu_seconds() -> float:
    """CPU time of this process, all threads: on a CPU driver (lavapipe) it counts the
    shader work too and, unlike wall-clock GPU time, barely moves when other jobs
    share the cores."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(node: OneNode, device, runs: int) -> tuple[float, float]:
    """(best GPU ms, best process CPU ms) of ``node.built`` over ``runs`` runs.

    GPU time: the timestamp-query total of one profiled execute. CPU time: one plain
    execute, inputs written and outputs read back included. Best, not mean: the
    machine may be shared. One warm-up execute first (first-touch of memory)."""
    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        dg.execute(node.arrays)
        times, cpu = [], []
        for _ in range(runs):
            dg.execute(node.arrays, profile=True)
            times.append(dg.last_profile.total_ns)
            start = cpu_seconds()
            dg.execute(node.arrays)
            cpu.append(cpu_seconds() - start)
    return min(times) / 1e6, min(cpu) * 1e3


def throughput(node: OneNode, ms: float) -> str:
    """GFLOP/s when the case counts flops, else GB/s of the bytes it moves."""
    if node.flops:
        return f"{node.flops / ms / 1e6:.2f} GFLOP/s"
    return f"{node.moved / ms / 1e6:.2f} GB/s"


def main(cases: Sequence[Callable[[], OneNode]], description: str, argv=None,
         rate_header: str = "throughput") -> int:
    """Command line shared by the scripts: ``[--runs 5] [--device NAME] [--filter S]``.
    Builds each case, runs those whose name contains S and prints one table row each:
    case, GPU ms (best), throughput (column ``rate_header``), process CPU ms (best)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default=None)
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    device = default_device(args.device)
    rows = []
    for make in cases:
        node = make()
        if args.filter not in node.name:
            continue
        ms, cpu_ms = measure(node, device, args.runs)
        rows.append([node.name, f"{ms:.3f}", throughput(node, ms), f"{cpu_ms:.2f}"])
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}\n")
    print(tabulate(rows, headers=["case", "GPU ms (best)", rate_header,
                                  "process CPU ms (best)"]))
    return 0
