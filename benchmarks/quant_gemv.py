"""GPU time of one decode-step linear (one row, LLM decode) by weight format: fp32 and
fp16 ``aten.linear`` against int8 per-channel (``aten._weight_int8pack_mm``), int4
group-wise (``et_vk.linear_q4gsw``) and 8da4w (``et_vk.linear_dq8ca_q4gsw``), on a
4096 x 4096 and a 4096 x 14336 (in x out) layer by default.

Each case is a one-node graph (benchmarks/one_node.py) whose weight is a constant in the
format the lowering stores (int4: uint8 [N, K/2] two per byte, scales [K/gs, N]); the
"weight GB/s" column is the weight bytes (plus scales) read per run over the GPU time
(the runtime profiler's timestamp total of one execute, best of --runs): a GEMV is
memory bound, so int4 should approach 4x (fp16: 2x) fewer bytes than fp32; "vs fp16"
is the fp16 linear's time (the engine's GEMV) over the case's. The int4 and int8
results are checked against numpy.

    python benchmarks/quant_gemv.py [--runs 10] [--rows 1] [--group 128] [--device NAME]
        [--shapes 4096x4096,4096x14336,14336x4096] [--gemv-everywhere]
        [--rows-per-workgroup 8] [--cases "linear float16,int4"] [--back-to-back]

--gemv-everywhere: the quantized GEMV forms on CPU drivers too (lavapipe gets the GEMM
form by default); --rows-per-workgroup: linear_qw_gemv.glsl's outputs per workgroup
(quantized_linear.VROWS, 1 to 16), for tuning; --cases: only the cases whose name
contains one of the comma-separated strings (the fp16 linear, the baseline, always);
--back-to-back: --runs profiled executes in a row (one_node.measure alternates them
with plain executes; on the H200 the two give different times, see docs/PERF.md).
"""
from __future__ import annotations

import argparse

import numpy as np
from tabulate import tabulate

from one_node import OneNode, measure
from vkdelegate.errors import DeviceLimitError
from vkdelegate.runtime import DelegateGraph, default_device


def _linear(m, k, n, dtype):
    node = OneNode(f"linear {dtype}").input((m, k), dtype).constant((n, k), dtype).arg(None)
    node.moved += n * k * np.dtype(dtype).itemsize
    return node.graph("aten.linear.default", [((m, n), dtype)])


def _int8(m, k, n, dtype):
    node = OneNode(f"int8 weights, {dtype} x").input((m, k), dtype)
    node.constant((n, k), "int8", high=127).constant((n,), dtype, positive=True)
    node.moved += n * k + n * np.dtype(dtype).itemsize
    return node.graph("aten._weight_int8pack_mm.default", [((m, n), dtype)])


def _int4(m, k, n, dtype, group):
    node = OneNode(f"int4 g{group} weights, {dtype} x").input((m, k), dtype)
    node.constant((n, k // 2), "uint8", high=256)
    node.constant((k // group, n), dtype, positive=True).arg(group).arg(None)
    node.moved += n * k // 2 + (k // group) * n * np.dtype(dtype).itemsize
    return node.graph("et_vk.linear_q4gsw.default", [((m, n), dtype)])


def _8da4w(m, k, n, group):
    node = OneNode(f"8da4w g{group}").input((m, k)).input((m,), positive=True)
    node.input((m,), "int8", high=1)  # zero points 0
    node.constant((n, k // 2), "uint8", high=256)
    node.constant((k // group, -(-n // 8) * 8), "int32", high=1)
    node.constant((k // group, n), positive=True).arg(group).arg(None)
    node.moved += n * k // 2 + (k // group) * n * 8
    return node.graph("et_vk.linear_dq8ca_q4gsw.default", [((m, n), "float32")])


def _check(node, device) -> str:
    """Max relative error of an int4 / int8 case against numpy ('' for the others)."""
    op = node.built.chain[0].name
    if op not in ("et_vk.linear_q4gsw.default", "aten._weight_int8pack_mm.default"):
        return ""
    x = node.arrays[0].astype(np.float64)
    w = np.frombuffer(node.consts[0], np.uint8 if "q4gsw" in op else np.int8)
    s = np.frombuffer(node.consts[1], node.arrays[0].dtype).astype(np.float64)
    n = node.built.values[node.built.chain[0].args[-1]].dims[-1]
    if "q4gsw" in op:
        w = w.reshape(n, -1).astype(np.int64)
        q = np.stack([w & 15, w >> 4], -1).reshape(n, -1) - 8
        groups = s.reshape(-1, n).shape[0]
        ref = x @ (q.reshape(n, groups, -1) * s.reshape(groups, n).T[..., None]).reshape(n, -1).T
    else:
        ref = (x @ w.reshape(n, -1).astype(np.float64).T) * s
    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        out = dg.execute(node.arrays)[0].astype(np.float64)
    return f"{np.abs(out - ref).max() / max(1.0, np.abs(ref).max()):.1e}"


def back_to_back(node, device, runs: int) -> float:
    """Best GPU ms of ``runs`` profiled executes of ``node`` in a row (one warm-up)."""
    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        dg.execute(node.arrays)
        times = []
        for _ in range(runs):
            dg.execute(node.arrays, profile=True)
            times.append(dg.last_profile.total_ns)
    return min(times) / 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1, help="rows of x (1: decode)")
    parser.add_argument("--group", type=int, default=128, choices=(32, 64, 128, 256))
    parser.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096",
                        help="comma-separated KxN (in x out) layers")
    parser.add_argument("--device", default=None)
    parser.add_argument("--gemv-everywhere", action="store_true")
    parser.add_argument("--rows-per-workgroup", type=int, default=None, choices=range(1, 17))
    parser.add_argument("--cases", default="", help="comma-separated name filters")
    parser.add_argument("--back-to-back", action="store_true")
    args = parser.parse_args(argv)
    from vkdelegate.ops.families import quantized_linear as family

    if args.gemv_everywhere:
        family.use_gemv = lambda info, m: m <= family.GEMV_ROWS
    if args.rows_per_workgroup:
        family.VROWS = args.rows_per_workgroup
    device = default_device(args.device)
    rows = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        m, gs = args.rows, args.group
        cases = [_linear(m, k, n, "float32"), _linear(m, k, n, "float16"),
                 _int8(m, k, n, "float32"), _int8(m, k, n, "float16"),
                 _int4(m, k, n, "float32", gs), _int4(m, k, n, "float16", gs),
                 _8da4w(m, k, n, gs)]
        keep = [c for c in args.cases.split(",") if c]
        cases = [c for i, c in enumerate(cases)
                 if i == 1 or not keep or any(f in c.name for f in keep)]
        timed = []  # (node, GPU ms, or the device limit's message)
        for node in cases:
            try:
                timed.append((node, back_to_back(node, device, args.runs) if args.back_to_back
                              else measure(node, device, args.runs)[0]))
            except DeviceLimitError as exc:  # lavapipe: 128 MiB storage buffers at most
                timed.append((node, str(exc).split(',')[0]))
        fp16 = next(ms for node, ms in timed if node.name == "linear float16")
        base = fp16 if isinstance(fp16, float) else None
        for node, ms in timed:
            if isinstance(ms, str):
                rows.append([f"{k}x{n}", node.name, "-", "-", "-",
                             f"over a device limit ({ms})"])
            else:
                rows.append([f"{k}x{n}", node.name, f"{ms:.3f}",
                             f"{node.moved / ms / 1e6:.1f}",
                             f"{base / ms:.2f}x" if base and node.name != "linear float16" else "-",
                             _check(node, device)])
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}; "
          f"{args.rows} row(s), group {args.group}\n")
    print(tabulate(rows, headers=["K x N", "case", "GPU ms (best)", "weight GB/s",
                                  "vs fp16", "rel err"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
