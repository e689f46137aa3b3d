"""Chained elementwise ops: fused (one dispatch, passes/fuse_elementwise) vs one
dispatch per op (``fuse_elementwise=False``), on device-resident data, against the
bandwidth of a one-op read+write pass (``neg``) measured in the same run, and against
eager PyTorch CUDA when CUDA is present.

GPU time is the sum of the profiled dispatches of one call (the inputs' upload and the
output's download are not in it: the data is on the device); bandwidth counts the
chain's tensor inputs read once and its output written once, the traffic a fused
chain needs. Median of ``--runs`` profiled calls.

    python benchmarks/elementwise_chain.py [--numel 16777216] [--runs 20] [--dtype float32]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from tabulate import tabulate

import vkdelegate
from vkdelegate.runtime.device import default_device


def _silu_gate(x, y, z):
    return x * torch.sigmoid(x) * y


def _gelu_bias_residual(x, y, z):
    return F.gelu(x + y, approximate="tanh") * 0.5 + z


def _six_ops(x, y, z):
    return torch.clamp(torch.tanh(x * 1.5 + 0.25) * y - z, min=-0.5).relu()


def _neg(x, y, z):
    return -x


CASES = [("x * sigmoid(x) * y (SiLU gate)", _silu_gate, 2),
         ("gelu(x + b) * 0.5 + r", _gelu_bias_residual, 3),
         ("relu(clamp(tanh(1.5x + .25) * y - z))", _six_ops, 3)]


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y, z):
        return self.fn(x, y, z)


def gpu_us(program, inputs, runs: int) -> float:
    """Median over ``runs`` profiled calls of the summed dispatch time, microseconds."""
    program.set_profiling(True)
    program(*inputs)  # build, compile, warm
    times = []
    for _ in range(runs):
        program(*inputs)
        times.append(sum(d.duration_ns for _, p in program.last_profiles()
                         for d in p.dispatches) / 1e3)
    program.set_profiling(False)
    return statistics.median(times)


def lowered(fn, inputs, fuse: bool):
    ep = torch.export.export(_Fn(fn), inputs)
    return vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner({"fuse_elementwise": fuse}))


def cuda_us(fn, inputs, runs: int) -> "float | None":
    if not torch.cuda.is_available():
        return None
    dev = [t.cuda() for t in inputs]
    for _ in range(3):
        fn(*dev)
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*dev)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=1 << 24)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    inputs = tuple(torch.randn(args.numel // 1024, 1024, dtype=dtype) for _ in range(3))
    size = inputs[0].element_size() * args.numel
    device = default_device()
    print(f"device: {device.info.name}; {args.numel} elements of {args.dtype} "
          f"({size / 2**20:.0f} MiB per tensor)")
    copy_us = gpu_us(lowered(_neg, inputs, True), inputs, args.runs)
    copy_gbs = 2 * size / copy_us / 1e3
    rows = [("-x (one read + one write)", 1, f"{copy_us:.1f}", "", f"{copy_gbs:.3g}",
             "100%", "", "")]
    for name, fn, reads in CASES:
        fused_us = gpu_us(lowered(fn, inputs, True), inputs, args.runs)
        unfused_us = gpu_us(lowered(fn, inputs, False), inputs, args.runs)
        gbs = (reads + 1) * size / fused_us / 1e3
        torch_us = cuda_us(fn, inputs, args.runs)
        rows.append((name, reads, f"{fused_us:.1f}", f"{unfused_us:.1f}", f"{gbs:.3g}",
                     f"{100 * gbs / copy_gbs:.0f}%", f"{unfused_us / fused_us:.2f}x",
                     "" if torch_us is None else f"{torch_us:.1f}"))
    print(tabulate(rows, headers=["chain", "tensor reads", "fused GPU us",
                                  "unfused GPU us", "fused GB/s", "of one-op pass",
                                  "unfused / fused", "torch CUDA eager us"]))


if __name__ == "__main__":
    main()
