"""GPU time of aten.mm.default: simple shader, tiled, tiled with register blocking.

For each size M x K x N, builds a one-node graph per variant (forcing the choices that
``vkdelegate.kernels.gemm.use_tiled`` and ``register_block`` make per device and
shape, with the GEMM core of benchmarks/gemm.py turned off), checks the result against
numpy, and prints the median GPU time from timestamp queries and the GFLOP/s.

    python benchmarks/matmul.py [--runs 10] [--device NAME]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from tabulate import tabulate

from vkdelegate.kernels import gemm
from vkdelegate.runtime import DelegateGraph, default_device
from vkdelegate.serialization import vkgraph as g

SIZES = [(37, 29, 11), (256, 512, 256), (1024, 1024, 1024), (4096, 4096, 4096)]


def run(device, m: int, k: int, n: int, tiled: bool, reg: int,
        runs: int) -> tuple[float, float]:
    f32 = g.VkDataType.FLOAT32
    graph = g.VkGraph(chain=[g.OperatorCall(0, "aten.mm.default", [0, 1, 2])],
                      values=[g.VkTensor(f32, [m, k]), g.VkTensor(f32, [k, n]),
                              g.VkTensor(f32, [m, n])],
                      input_ids=[0, 1], output_ids=[2])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    original = gemm.use_tiled, gemm.register_block, gemm.tiles_for
    gemm.use_tiled = lambda info, rows, cols, k=0: tiled
    gemm.register_block = lambda rows, cols: reg
    gemm.tiles_for = lambda device_type: None  # the legacy shaders, not the GEMM core
    try:
        dg = DelegateGraph(graph, lambda i: b"", device=device)
    finally:
        gemm.use_tiled, gemm.register_block, gemm.tiles_for = original
    with dg:
        out = dg.execute([a, b])[0]
        ref = a.astype(np.float64) @ b
        err = float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))
        times = []
        for _ in range(runs):
            dg.execute([a, b], profile=True)
            times.append(dg.last_profile.total_ns)
    return statistics.median(times) / 1e6, err


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-size", type=int, default=4096)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    device = default_device(args.device)
    rows = []
    for m, k, n in SIZES:
        if max(m, k, n) > args.max_size:
            continue
        line = [f"{m}x{k}x{n}"]
        for tiled, reg in ((False, 1), (True, 1), (True, gemm.REG)):
            ms, err = run(device, m, k, n, tiled, reg, args.runs)
            line += [f"{ms:.3f}", f"{2 * m * k * n / ms / 1e6:.1f}", f"{err:.1e}"]
        rows.append(line)
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}")
    print(f"default choice on this device: "
          f"{'tiled' if gemm.use_tiled(device.info, 1024, 1024) else 'simple'}\n")
    print(tabulate(rows, headers=["M x K x N", "simple ms", "GFLOP/s", "rel err",
                                  "tiled ms", "GFLOP/s", "rel err",
                                  f"tiled {gemm.REG}x{gemm.REG} ms", "GFLOP/s",
                                  "rel err"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
