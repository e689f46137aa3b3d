"""GEMM and GEMV: on-device time of one-node graphs against torch, side by side.

Cases (sizes scale with --size, default 4096, and --mlp-rows, default 256):
aten.mm with both operands at run time (b [K, N]), aten.linear with a constant
[N, K] weight (M x K x N = S^3, fp32 and fp16), an MLP layer (linear, 256 x S x S)
a decode GEMV (linear, 1 x S x S, fp16 and fp32 weights; TB/s counts the weight
read) and a long reduction with few outputs (mm, 256 x 4S x 256: split-K). Each case runs per --forms: "table" (what kernels/gemm.py picks on this
device), "legacy" (the simple shaders: matmul_tiled/matmul.glsl, linear.glsl),
"small"/"large" (the GEMM core's 64 x 64 / 128 x 128 block forced), "novec" (no vec4
global loads), "nosplit" (the GPU row without split-K), "gemv2"/"gemv8"
(2 or 8 outputs per GEMV workgroup instead of 4), "nocoop" (the GPU row without the
cooperative-matrix forms), "nowg" (the GPU row without the workgroup-scope form), "TMxTNxBK" (that core block always) or
"cBMxBNxBKxWMxWNxSTAGES" (that gemm_coopmat.glsl block always; "+NAME=VALUE" parts
after it add defines to its variant, e.g. "c128x256x32x64x64x1+PROBE=2": the
shader's probes and ACC16, see gemm_coopmat.glsl), "wBMxBNxBKxUNROLL[tTHREADS]"
(gemm_coopmat_wg.glsl's workgroup-scope block always, VK_NV_cooperative_matrix2; with
"t" that workgroup size instead of the largest the device lists for the block); "TMxTNxBKn": the core block without
vec4 loads. The "kernel" column names the shader and block recorded; the header lists
the device's cooperative-matrix shapes (M x N x K A B C result).
Our time: median of --runs profiled executes (GPU timestamp queries, all dispatches of
the node), after one plain execute and --hold-s seconds of keeping the GPU busy
(benchmarks/gpu_clock.py: its clock idles down while a form's shaders compile). torch:
CUDA when available (median of CUDA-event timings), else CPU (median wall time). Relative errors (ours and torch's) are against fp64 products of
up to 64 sampled rows.

    python benchmarks/gemm.py [--runs 10] [--size 4096] [--forms table legacy]
        [--only "linear S^3"] [--dtypes float16] [--hold-s S]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import numpy as np
import torch
from tabulate import tabulate

import gpu_clock

from vkdelegate.kernels import gemm, gemm_core, gemm_tiles
from vkdelegate.runtime import DelegateGraph, default_device
from vkdelegate.serialization import vkgraph as g

_DT = {"float32": g.VkDataType.FLOAT32, "float16": g.VkDataType.FLOAT16}
FORMS = {"table": None, "legacy": "legacy",
         "small": gemm_tiles.GemmTiles(large_min_groups=1 << 30),
         "large": gemm_tiles.GemmTiles(large_min_groups=0),
         "novec": gemm_tiles.GemmTiles(vec_load=False),
         "nosplit": gemm_tiles.GemmTiles(vec_load=gemm_tiles.DEFAULT.vec_load),
         "gemv2": gemm_tiles.GemmTiles(gemv_rows=2),
         "gemv8": gemm_tiles.GemmTiles(gemv_rows=8),
         "nocoop": dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False),
         "nowg": dataclasses.replace(gemm_tiles.DEFAULT, coop_wg=(), coop_wg_small=())}


def form_tiles(form: str):
    """FORMS' entry, for "TMxTNxBK" (e.g. 8x8x32) that core block always (with a
    trailing "n" without vec4 loads), for "cBMxBNxBKxWMxWNxSTAGES[+NAME=VALUE...]"
    that cooperative-matrix block always."""
    if form in FORMS:
        return FORMS[form]
    if form.startswith("c"):
        block = tuple(int(v) for v in form[1:].split("+")[0].split("x"))
        return dataclasses.replace(gemm_tiles.DEFAULT, coop_large=block,
                                   coop_large_min_groups=0)
    if form.startswith("w"):
        body, sep, threads = form[1:].partition("t")
        try:
            block = tuple(int(v) for v in body.split("x"))
            ok = len(block) == 4 and min(block) > 0 and (not sep or int(threads) > 0)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"form {form!r}: expected wBMxBNxBKxUNROLL[tTHREADS] with "
                             f"positive integers, e.g. w128x256x32x32 or w128x128x64x16t128")
        return dataclasses.replace(gemm_tiles.DEFAULT, coop_wg=block, coop_wg_small=block,
                                   coop_wg_min_macs=0)
    vec = not form.endswith("n")
    tm, tn, bk = (int(v) for v in form.rstrip("n").split("x"))
    return gemm_tiles.GemmTiles(large=(tm, tn, bk), large_min_groups=0, vec_load=vec)


def extra_defines(form: str) -> dict:
    """The "+NAME=VALUE" defines of a cooperative-matrix form (empty for others)."""
    if not form.startswith("c"):
        return {}
    return dict(part.split("=", 1) for part in form.split("+")[1:])


def cases(s: int, mlp: int):
    """(name, op, M, K, N, dtype)."""
    return [("mm S^3", "mm", s, s, s, "float32"), ("mm S^3", "mm", s, s, s, "float16"),
            ("linear S^3", "linear", s, s, s, "float32"),
            ("linear S^3", "linear", s, s, s, "float16"),
            ("MLP linear", "linear", mlp, s, s, "float32"),
            ("MLP linear", "linear", mlp, s, s, "float16"),
            ("GEMV linear", "linear", 1, s, s, "float16"),
            ("GEMV linear", "linear", 1, s, s, "float32"),
            ("long-K mm", "mm", mlp, 4 * s, mlp, "float32")]


def build(device, op, m, k, n, dtype, weight):
    dt = _DT[dtype]
    if op == "mm":
        graph = g.VkGraph(chain=[g.OperatorCall(0, "aten.mm.default", [0, 1, 2])],
                          values=[g.VkTensor(dt, [m, k]), g.VkTensor(dt, [k, n]),
                                  g.VkTensor(dt, [m, n])], input_ids=[0, 1], output_ids=[2])
        return DelegateGraph(graph, lambda i: b"", device=device)
    graph = g.VkGraph(chain=[g.OperatorCall(0, "aten.linear.default", [0, 1, 2, 3])],
                      values=[g.VkTensor(dt, [m, k]), g.VkTensor(dt, [n, k], constant_id=0),
                              g.Null(), g.VkTensor(dt, [m, n])],
                      constants=[g.VkBytes(0, weight.nbytes)], input_ids=[0], output_ids=[3])
    data = np.ascontiguousarray(weight).tobytes()
    return DelegateGraph(graph, lambda i: data, device=device)


def ours(device, form, op, m, k, n, dtype, arrays, runs):
    saved, chosen = dict(gemm_tiles.TABLE), []
    select = gemm.select

    def spy(*args, **kwargs):
        chosen.append(select(*args, **kwargs))
        return chosen[-1]

    gemm.select = spy
    wg_threads = gemm_core.coopmat_wg_threads
    if form.startswith("w") and "t" in form:
        gemm_core.coopmat_wg_threads = lambda caps, block: int(form.split("t")[1])
    coop_defines = gemm_core.coopmat_defines
    extra = extra_defines(form)
    gemm_core.coopmat_defines = lambda *a, **kw: dict(coop_defines(*a, **kw), **extra)
    if form == "legacy":
        gemm_tiles.TABLE[device.info.type] = None
    elif form_tiles(form) is not None:
        gemm_tiles.TABLE[device.info.type] = form_tiles(form)
    try:
        dg = build(device, op, m, k, n, dtype, arrays[1])
    finally:
        gemm.select = select
        gemm_core.coopmat_wg_threads = wg_threads
        gemm_core.coopmat_defines = coop_defines
        gemm_tiles.TABLE.clear()
        gemm_tiles.TABLE.update(saved)
    inputs = arrays if op == "mm" else arrays[:1]
    with dg:
        out = dg.execute(inputs)[0]
        gpu_clock.hold(gpu_clock.HOLD_S, lambda: dg.execute(inputs))
        times = []
        for _ in range(runs):
            dg.execute(inputs, profile=True)
            times.append(dg.last_profile.total_ns)
    kernel = " ".join(f"{f.shader}{'x'.join(map(str, f.block))}"
                      + (f"t{f.threads}" if f.shader == gemm_core.COOPMAT_WG_SHADER else "")
                      for f in chosen)
    kernel += "".join(f"+{k}={v}" for k, v in extra.items())
    return statistics.median(times) / 1e6, out, kernel


def reference(op, arrays, runs):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a, w = (torch.from_numpy(x).to(dev) for x in arrays)
    fn = (lambda: a @ w) if op == "mm" else (lambda: torch.nn.functional.linear(a, w))
    out = fn()
    times = []
    for _ in range(runs):
        if dev == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out.float().cpu().numpy(), dev


def rel_err(got, exact) -> float:
    """max |got - exact| / max(1, max |exact|)."""
    return float(np.abs(got.astype(np.float64) - exact).max()
                 / max(1.0, float(np.abs(exact).max())))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--mlp-rows", type=int, default=256)
    parser.add_argument("--forms", nargs="+", default=["table", "legacy"],
                        help=f"of {', '.join(FORMS)}, a core block TMxTNxBK[n], a "
                             f"cooperative-matrix block cBMxBNxBKxWMxWNxSTAGES[+NAME=VALUE] "
                             f"or a workgroup-scope block wBMxBNxBKxUNROLL[tTHREADS]")
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    parser.add_argument("--dtypes", nargs="*", default=None, help="dtypes to run")
    parser.add_argument("--device", default=None)
    parser.add_argument("--hold-s", type=float, default=gpu_clock.HOLD_S,
                        help="seconds the GPU is kept busy before each form's timed runs "
                             "(default: 1 with CUDA, else 0)")
    args = parser.parse_args(argv)
    gpu_clock.HOLD_S = args.hold_s
    for form in args.forms:
        try:
            form_tiles(form)
        except ValueError as e:
            parser.error(f"--forms: {e}")
    device = default_device(args.device)
    rng = np.random.default_rng(0)
    rows = []
    for name, op, m, k, n, dtype in cases(args.size, args.mlp_rows):
        if (args.only and name not in args.only) or (args.dtypes and dtype not in args.dtypes):
            continue
        a = rng.standard_normal((m, k)).astype(dtype)
        w = rng.standard_normal((k, n) if op == "mm" else (n, k)).astype(dtype)
        ref_ms, ref, dev = reference(op, (a, w), args.runs)
        # Errors against fp64 on up to 64 sampled rows (all of them for small M).
        rows_ = np.unique(rng.integers(0, m, 64)) if m > 64 else np.arange(m)
        wt = w.astype(np.float64) if op == "mm" else w.astype(np.float64).T
        exact = a[rows_].astype(np.float64) @ wt
        torch_err = rel_err(ref[rows_], exact)
        flop = 2.0 * m * k * n
        for form in args.forms:
            try:
                ms, out, kernel = ours(device, form, op, m, k, n, dtype, (a, w), args.runs)
            except Exception as e:  # one failing form must not hide the others' numbers
                rows.append([f"{name} {m}x{k}x{n}", dtype, form, f"failed: {e}"])
                print(rows[-1], file=sys.stderr, flush=True)
                continue
            err = rel_err(out[rows_], exact)
            rows.append([f"{name} {m}x{k}x{n}", dtype, form, kernel, f"{ms:.3f}",
                         f"{flop / ms / 1e9:.3g}", f"{w.nbytes / ms / 1e9:.3g}" if m == 1 else "",
                         f"{err:.1e}", f"{ref_ms:.3f}", f"{flop / ref_ms / 1e9:.3g}",
                         f"{torch_err:.1e}"])
            print(rows[-1], file=sys.stderr, flush=True)  # progress, should a run be cut
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}; "
          f"torch on {dev}; median of {args.runs} runs")
    shapes = device.info.capabilities.cooperative_matrix_shapes
    print(f"maxComputeSharedMemorySize: {device.info.max_shared_memory} bytes")
    print("cooperative-matrix shapes: " + ("; ".join(
        f"{s.m}x{s.n}x{s.k} {s.a} {s.b} {s.c} {s.result}" for s in shapes) or "none"))
    caps = device.info.capabilities
    print("flexible shapes (VK_NV_cooperative_matrix2, up to "
          f"{caps.cooperative_matrix_max_dimension}): " + ("; ".join(
              f"{s.m}x{s.n}x{s.k} {s.a} {s.b} {s.c} {s.result} {s.scope} "
              f"{s.workgroup_invocations}" for s in caps.flexible_matrix_shapes) or "none")
          + "\n")
    print(tabulate(rows, headers=["case M x K x N", "dtype", "form", "kernel", "ours ms", "TFLOP/s",
                                  "weight TB/s", "rel err", f"torch {dev} ms", "TFLOP/s",
                                  "torch rel err"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
