"""GPU time of the CNN op families on realistic shapes (EfficientNet-Lite0, ResNet).

Builds a one-node graph per case (constant weights, as after export), runs it a few
times with timestamp queries and prints the best GPU time with the throughput:
GFLOP/s (2 per multiply-add) for convolution and linear algebra, GB/s of tensor bytes
read and written for the memory-bound ops. Correctness is the op tests' job
(tests/ops/test_{convolution,batch_norm,linear,pool,upsample}.py). The last column is
the process CPU time of one plain execute (inputs written, outputs read back
included), the stable measure on a CPU driver on a shared machine. Torch-free.

    python benchmarks/cnn_ops.py [--runs 5] [--device NAME] [--filter conv]
"""
from __future__ import annotations

import argparse
import resource

import numpy as np
from tabulate import tabulate

from vkdelegate.runtime import DelegateGraph, default_device
from vkdelegate.serialization import vkgraph as g

F32 = g.VkDataType.FLOAT32


class OneNode:
    """A VkGraph with one node: inputs, constants and scalars added in schema order."""

    def __init__(self):
        self.values: list = []
        self.consts: list[bytes] = []
        self.inputs: list[int] = []
        self.arrays: list[np.ndarray] = []
        self.args: list[int] = []

    def _add(self, value) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def tensor(self, shape, const: bool = False, positive: bool = False):
        rng = np.random.default_rng(len(self.values))
        data = rng.standard_normal(shape).astype(np.float32)
        if positive:  # e.g. a batch norm's running variance
            data = np.abs(data) + 0.5
        if const:
            self.consts.append(data.tobytes())
            self.args.append(self._add(g.VkTensor(F32, list(shape),
                                                  constant_id=len(self.consts) - 1)))
        else:
            self.inputs.append(self._add(g.VkTensor(F32, list(shape))))
            self.arrays.append(data)
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
            v = g.IntList(list(value)) if all(isinstance(x, int) for x in value) \
                else g.DoubleList(list(value))
        self.args.append(self._add(v))
        return self

    def input(self, shape):
        self.tensor(shape)
        self.args.append(self.inputs[-1])
        return self

    def graph(self, op: str, out_shapes) -> tuple[g.VkGraph, list, bytes]:
        """(graph, input arrays, constants section) with outputs of ``out_shapes``:
        (shape, "f" for float32 or "i" for int64) pairs; several make a ValueList."""
        outs = [self._add(g.VkTensor(F32 if dt == "f" else g.VkDataType.INT64, list(s)))
                for s, dt in out_shapes]
        out = outs[0] if len(outs) == 1 else self._add(g.ValueList(outs))
        offsets, pos = [], 0
        for c in self.consts:
            offsets.append(g.VkBytes(pos, len(c)))
            pos += len(c)
        graph = g.VkGraph(chain=[g.OperatorCall(0, op, self.args + [out])],
                          values=self.values, input_ids=self.inputs, output_ids=outs[:1],
                          constants=offsets)
        return graph, self.arrays, b"".join(self.consts)


def conv(name, n, cin, cout, hw, k, s, groups=1, transposed=False):
    pad = k // 2
    if transposed:
        oh = (hw - 1) * s - 2 * pad + k
        w_shape = (cin, cout // groups, k, k)
    else:
        oh = (hw + 2 * pad - k) // s + 1
        w_shape = (cout, cin // groups, k, k)
    b = OneNode().input((n, cin, hw, hw)).tensor(w_shape, const=True).tensor((cout,), True)
    b.arg([s, s]).arg([pad, pad]).arg([1, 1]).arg(transposed).arg([0, 0]).arg(groups)
    flops = 2 * n * cout * (cin // groups) * k * k * (hw * hw if transposed else oh * oh)
    return name, b.graph("aten.convolution.default", [((n, cout, oh, oh), "f")]), flops, None


def linear(name, m, k, n):
    b = OneNode().input((m, k)).tensor((n, k), const=True).tensor((n,), const=True)
    return name, b.graph("aten.linear.default", [((m, n), "f")]), 2 * m * k * n, None


def bmm(name, batch, m, k, n):
    b = OneNode().input((batch, m, k)).input((batch, k, n))
    return name, b.graph("aten.bmm.default", [((batch, m, n), "f")]), 2 * batch * m * k * n, None


def max_pool(name, n, c, hw):
    oh = (hw + 2 - 3) // 2 + 1
    b = OneNode().input((n, c, hw, hw)).arg([3, 3]).arg([2, 2]).arg([1, 1]).arg([1, 1])
    b.arg(False)
    moved = 4 * n * c * (hw * hw + 3 * oh * oh)  # input, output, int32 indices
    return name, b.graph("aten.max_pool2d_with_indices.default",
                         [((n, c, oh, oh), "f"), ((n, c, oh, oh), "i")]), None, moved


def avg_pool(name, n, c, hw):
    oh = hw // 2
    b = OneNode().input((n, c, hw, hw)).arg([2, 2]).arg([2, 2]).arg([0, 0]).arg(False)
    b.arg(True).arg(None)
    return name, b.graph("aten.avg_pool2d.default", [((n, c, oh, oh), "f")]), None, \
        4 * n * c * (hw * hw + oh * oh)


def batch_norm(name, n, c, hw):
    b = OneNode().input((n, c, hw, hw))
    for i in range(4):  # weight, bias, running mean, running variance
        b.tensor((c,), const=True, positive=i == 3)
    b.arg(0.1).arg(1e-5)
    return name, b.graph("aten._native_batch_norm_legit_no_training.default",
                         [((n, c, hw, hw), "f"), ((0,), "f"), ((0,), "f")]), None, \
        8 * n * c * hw * hw


def upsample(name, n, c, hw, mode):
    b = OneNode().input((n, c, hw, hw))
    if mode == "nearest":
        b.arg(None).arg([2.0, 2.0])
        op = "aten.upsample_nearest2d.vec"
    else:
        b.arg([2 * hw, 2 * hw]).arg(False).arg(None)
        op = "aten.upsample_bilinear2d.vec"
    return name, b.graph(op, [((n, c, 2 * hw, 2 * hw), "f")]), None, 4 * n * c * hw * hw * 5


CASES = [
    lambda: conv("conv stem 3->32 k3 s2 @224", 1, 3, 32, 224, 3, 2),
    lambda: conv("conv depthwise 96 k3 s2 @112", 1, 96, 96, 112, 3, 2, groups=96),
    lambda: conv("conv depthwise 144 k5 @56", 1, 144, 144, 56, 5, 1, groups=144),
    lambda: conv("conv pointwise 16->96 @112", 1, 16, 96, 112, 1, 1),
    lambda: conv("conv pointwise 144->24 @56", 1, 144, 24, 56, 1, 1),
    lambda: conv("conv pointwise 1152->192 @7", 1, 1152, 192, 7, 1, 1),
    lambda: conv("conv resnet 64->64 k3 @56", 1, 64, 64, 56, 3, 1),
    lambda: conv("conv transposed 64->32 k3 s2 @28", 1, 64, 32, 28, 3, 2, transposed=True),
    lambda: linear("linear 1x1280 -> 1000", 1, 1280, 1000),
    lambda: linear("linear 256x512 -> 256", 256, 512, 256),
    lambda: bmm("bmm 8 x 128x64x128", 8, 128, 64, 128),
    lambda: max_pool("max_pool2d k3 s2 64 @112", 1, 64, 112),
    lambda: avg_pool("avg_pool2d k2 64 @112", 1, 64, 112),
    lambda: batch_norm("batch_norm 64 @112", 1, 64, 112),
    lambda: upsample("upsample nearest x2 64 @56", 1, 64, 56, "nearest"),
    lambda: upsample("upsample bilinear x2 64 @56", 1, 64, 56, "bilinear"),
]


def _cpu_seconds() -> float:
    """CPU time of this process, all threads: on a CPU driver (lavapipe) it counts the
    shader work too and, unlike wall-clock GPU time, barely moves when other jobs
    share the cores."""
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
        name, (graph, arrays, blob), flops, moved = make()
        if args.filter not in name:
            continue

        def constant(i, graph=graph, blob=blob):
            c = graph.constants[i]
            return blob[c.offset:c.offset + c.length]
        with DelegateGraph(graph, constant, device=device) as dg:
            dg.execute(arrays)
            times, cpu = [], []
            for _ in range(args.runs):
                dg.execute(arrays, profile=True)
                times.append(dg.last_profile.total_ns)
                start = _cpu_seconds()
                dg.execute(arrays)
                cpu.append(_cpu_seconds() - start)
        ms = min(times) / 1e6  # best of --runs: the machine may be shared
        rate = f"{flops / ms / 1e6:.2f} GFLOP/s" if flops else f"{moved / ms / 1e6:.2f} GB/s"
        rows.append([name, f"{ms:.3f}", rate, f"{min(cpu) * 1e3:.2f}"])
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}\n")
    print(tabulate(rows, headers=["case", "GPU ms (best)", "throughput",
                                  "process CPU ms (best)"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
