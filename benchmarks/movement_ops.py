"""GPU time of the data-movement ops on realistic shapes (EfficientNet-Lite0, ResNet,
a small language model's embedding).

Builds a one-node graph per case, runs it a few times with timestamp queries and
prints the best GPU time with the effective bandwidth: bytes of tensor data read and
written (the memory-bound measure for copies). Correctness is the op tests' job
(tests/ops/test_{movement,concat,pad,indexing,creation,copy}.py). The last column is
the process CPU time of one plain execute, the stable measure on a CPU driver
(lavapipe) on a shared machine. Torch-free.

    python benchmarks/movement_ops.py [--runs 5] [--device NAME] [--filter pad]
"""
from __future__ import annotations

import argparse
import math
import resource

import numpy as np
from tabulate import tabulate

from vkdelegate.runtime import DelegateGraph, default_device
from vkdelegate.serialization import vkgraph as g

_DT = {name: dt for dt, name in g.DTYPE_NAMES.items()}


class Case:
    """A one-node VkGraph: inputs and scalars in schema order, outputs last."""

    def __init__(self, name: str):
        self.name = name
        self.values, self.inputs, self.arrays, self.args = [], [], [], []
        self.consts: list[bytes] = []
        self.moved = 0  # bytes read and written

    def _add(self, value) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def input(self, shape, dtype="float32", high=None, listed=False):
        rng = np.random.default_rng(len(self.values))
        data = (rng.integers(0, high, shape) if high else rng.standard_normal(shape))
        data = data.astype(dtype)
        vid = self._add(g.VkTensor(_DT[dtype], list(shape)))
        self.inputs.append(vid)
        self.arrays.append(data)
        self.moved += data.nbytes
        if not listed:
            self.args.append(vid)
        return vid

    def constant(self, shape, dtype="float32", high=None):
        """A constant tensor (a weight): stored in the blob, not uploaded per run."""
        rng = np.random.default_rng(len(self.values))
        data = (rng.integers(0, high, shape) if high else rng.standard_normal(shape))
        self.consts.append(data.astype(dtype).tobytes())
        self.args.append(self._add(g.VkTensor(_DT[dtype], list(shape),
                                              constant_id=len(self.consts) - 1)))
        return self

    def inputs_list(self, shapes):
        ids = [self.input(s, listed=True) for s in shapes]
        self.args.append(self._add(g.ValueList(ids)))
        return self

    def arg(self, value):
        if value is None:
            v = g.Null()
        elif isinstance(value, bool):
            v = g.Bool(value)
        elif isinstance(value, int):
            v = g.Int(value)
        elif isinstance(value, float):
            v = g.Double(value)
        else:
            v = g.IntList(list(value))
        self.args.append(self._add(v))
        return self

    def graph(self, op: str, out_shapes, dtype="float32") -> g.VkGraph:
        outs = [self._add(g.VkTensor(_DT[dtype], list(s))) for s in out_shapes]
        self.moved += sum(math.prod(s) for s in out_shapes) * np.dtype(dtype).itemsize
        out = outs[0] if len(outs) == 1 else self._add(g.ValueList(outs))
        offsets, pos = [], 0
        for c in self.consts:
            offsets.append(g.VkBytes(pos, len(c)))
            pos += len(c)
        return g.VkGraph(chain=[g.OperatorCall(0, op, self.args + [out])],
                         values=self.values, input_ids=self.inputs, output_ids=outs,
                         constants=offsets)

    def constant_bytes(self, i: int) -> bytes:
        return self.consts[i]


def _one(name, op, shape, args, out_shapes, dtype="float32"):
    c = Case(name)
    c.input(shape)
    for a in args:
        c.arg(a)
    return c, c.graph(op, out_shapes, dtype)


def _cat():
    c = Case("cat 2 x 64 channels @56")
    c.inputs_list([(1, 64, 56, 56), (1, 64, 56, 56)]).arg(1)
    return c, c.graph("aten.cat.default", [(1, 128, 56, 56)])


def _embedding():
    c = Case("embedding 32000x512 (constant), 128 tokens")
    c.constant((32000, 512))
    c.input((1, 128), "int64", high=32000)
    c.arg(-1).arg(False).arg(False)
    c.moved += 128 * 512 * 4  # the picked rows are read
    return c, c.graph("aten.embedding.default", [(1, 128, 512)])


def _gather():
    c = Case("gather dim 1 of 64x1000, 64x5")
    c.input((64, 1000))
    c.arg(1)
    c.input((64, 5), "int64", high=1000)
    c.arg(False)
    c.moved -= 64 * 1000 * 4 - 64 * 5 * 4
    return c, c.graph("aten.gather.default", [(64, 5)])


CASES = [
    lambda: _one("constant_pad_nd SAME 32 @112", "aten.constant_pad_nd.default",
                 (1, 32, 112, 112), [[0, 1, 0, 1], 0.0], [(1, 32, 113, 113)]),
    lambda: _one("permute NCHW->NHWC 96 @56", "aten.permute.default", (1, 96, 56, 56),
                 [[0, 2, 3, 1]], [(1, 56, 56, 96)]),
    lambda: _one("view (flat copy) 144 @56", "aten.view.default", (1, 144, 56, 56),
                 [[1, 144, 3136]], [(1, 144, 3136)]),
    lambda: _one("expand SE scale 1x1 -> 56x56 x144", "aten.expand.default",
                 (1, 144, 1, 1), [[1, 144, 56, 56], False], [(1, 144, 56, 56)]),
    lambda: _one("slice step 2 of 64 @112", "aten.slice.Tensor", (1, 64, 112, 112),
                 [3, 0, 112, 2], [(1, 64, 112, 56)]),
    lambda: _one("_to_copy fp32->fp16 64 @112", "aten._to_copy.default", (1, 64, 112, 112),
                 [None, None, None, None, False, None], [(1, 64, 112, 112)], "float16"),
    _cat,
    lambda: _one("split_with_sizes 128 -> 2 x 64 @56", "aten.split_with_sizes.default",
                 (1, 128, 56, 56), [[64, 64], 1], [(1, 64, 56, 56)] * 2),
    _embedding,
    _gather,
]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default=None)
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    device = default_device(args.device)
    rows = []
    for make in CASES:
        case, graph = make()
        if args.filter not in case.name:
            continue
        with DelegateGraph(graph, case.constant_bytes, device=device) as dg:
            dg.execute(case.arrays)
            times, cpu = [], []
            for _ in range(args.runs):
                dg.execute(case.arrays, profile=True)
                times.append(dg.last_profile.total_ns)
                start = _cpu_seconds()
                dg.execute(case.arrays)
                cpu.append(_cpu_seconds() - start)
        ms = min(times) / 1e6  # best of --runs: the machine may be shared
        rows.append([case.name, f"{ms:.3f}", f"{case.moved / ms / 1e6:.2f} GB/s",
                     f"{min(cpu) * 1e3:.2f}"])
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}\n")
    print(tabulate(rows, headers=["case", "GPU ms (best)", "bandwidth",
                                  "process CPU ms (best)"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
