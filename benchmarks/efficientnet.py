"""EfficientNet-Lite0 latency: vkdelegate on Vulkan vs eager PyTorch (CPU, and CUDA when
present, also replayed as a CUDA graph), batch 1 and 8, in one run.

Prints a table (median, p10-p90 spread, ratio to vkdelegate) and writes JSON; with
--profile also prints, per batch size, the slowest dispatches of the Vulkan program,
their GPU time per op and the host-side rest (host-to-host minus GPU time).

    python benchmarks/efficientnet.py [--batch 1 8] [--runs 20] [--json out.json]
        [--form MODULE.CONSTANT=VALUE ...]

--form sets a kernel-form constant before lowering (benchmarks/forms.py), e.g.
``--form conv_pointwise.SPLIT_K=false`` for the pointwise convolutions without their
cross-workgroup split.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch
from tabulate import tabulate

import forms as kernel_forms
import vkdelegate
from vkdelegate.examples import efficientnet_lite as model_zoo
from vkdelegate.runtime.device import default_device


def timed(fn, runs: int, warmup: int, sync=lambda: None, warmup_s: float = 1.0
          ) -> list[float]:
    """Wall-clock milliseconds of ``runs`` calls after at least ``warmup`` untimed ones
    and ``warmup_s`` seconds of them: an idle GPU needs time to raise its clocks (on
    the H200, after a 3-call warm-up, batch 1 measured 11.9 ms; the demo, run later in
    a warm state, 4.0 ms)."""
    start = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - start < warmup_s:
        fn()
        done += 1
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def stats(times: list[float]) -> dict:
    q = np.percentile(times, [10, 50, 90])
    return {"median_ms": float(q[1]), "p10_ms": float(q[0]), "p90_ms": float(q[2]),
            "runs": len(times)}


def report(title: str, first_column: str, rows: list, results: dict, path: str) -> None:
    """Print the latency table (``rows``: first column, backend, median, spread, ratio)
    under ``title`` and write ``results`` as JSON to ``path``."""
    print(f"\n{title}, torch {torch.__version__} ({torch.get_num_threads()} CPU threads)")
    print(tabulate(rows, headers=(first_column, "backend", "median ms", "p10-p90 ms",
                                  "vs vkdelegate")))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {path}")


def cuda_graph(model, x):
    """``model(x)`` captured once as a CUDA graph (static input ``x``); returns its
    replay (the "CUDA graphs" column: launch overhead gone)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x)
    return graph.replay


def profile(program, x, batch: int, device_name: str, rows: int) -> float:
    """One profiled call (timestamps around every dispatch, a barrier between each):
    prints the ``rows`` slowest dispatches and a per-op summary; returns the summed GPU
    time in ms (an upper bound on the normal run's, which overlaps independent
    dispatches)."""
    from vkdelegate.cli import run as cli_run

    program.set_profiling(True)
    program(x)
    program.set_profiling(False)
    cli_run.TOP_N = rows
    print(f"\nslowest dispatches, batch {batch}, {device_name}:")
    cli_run.print_profile(program, program.default_method(), None)
    per_op: dict = {}
    for _index, prof in program.last_profiles():
        for d in prof.dispatches:
            n, t = per_op.get(d.op, (0, 0.0))
            per_op[d.op] = (n + 1, t + d.duration_ns / 1e3)
    print(tabulate(sorted(((op, n, f"{t:.1f}") for op, (n, t) in per_op.items()),
                          key=lambda r: -float(r[2])),
                   headers=("op", "dispatches", "GPU us")))
    gpu_ms = sum(t for _n, t in per_op.values()) / 1e3
    host_split(program, x, batch)
    return gpu_ms


def host_split(program, x, batch: int, calls: int = 10) -> None:
    """Medians over ``calls`` calls of where one call's time goes: the delegate's
    execute (its host part, of which the input copies ("upload") and output reads
    ("download"); its fence wait: submit to done on the GPU, the staging copies
    included) and the rest of the call (torch <-> numpy, the program's Python). Then
    the input copy alone by each host path, into the delegate's mapped input view."""
    keys = ("total_s", "host_s", "fence_wait_s", "upload_s", "download_s")
    parts: dict = {k: [] for k in ("call",) + keys}
    for _ in range(calls):
        t0 = time.perf_counter()
        program(x)
        parts["call"].append(time.perf_counter() - t0)
        timings = [d.loaded.last_timing for d in program.runner(
            program.default_method()).delegates]
        for k in keys:
            parts[k].append(sum(t.get(k, 0.0) for t in timings))
    med = {k: 1e3 * statistics.median(v) for k, v in parts.items()}
    print(f"batch {batch}: call {med['call']:.3f} ms = execute {med['total_s']:.3f} "
          f"(host {med['host_s']:.3f}: upload {med['upload_s']:.3f}, download "
          f"{med['download_s']:.3f}; fence wait {med['fence_wait_s']:.3f}) + outside "
          f"execute {med['call'] - med['total_s']:.3f} ms")
    copy_paths(program, x, batch)


def copy_paths(program, x, batch: int, reps: int = 30) -> None:
    """Median ms of copying ``x`` into the first delegate's mapped input view by each
    host path: numpy slice assignment, one memmove (runtime/host_copy.py without a
    parallel copier), copy_bytes with torch's copy_ registered (the runtime's path:
    torch's threads from host_copy.PARALLEL_MIN_BYTES on), torch's copy_ at any
    size."""
    import ctypes

    from vkdelegate.backend.interpreter import _torch_copy
    from vkdelegate.runtime.host_copy import copy_bytes, set_parallel_copy

    graph = program.runner(program.default_method()).delegates[0].loaded
    view = graph._in_views[0]
    src = x.contiguous().numpy().reshape(-1)
    if view.dtype != src.dtype or view.size < src.size:
        return
    paths = {"numpy assign": lambda: view.__setitem__(slice(0, src.size), src),
             "ctypes.memmove": lambda: ctypes.memmove(view.ctypes.data, src.ctypes.data,
                                                      src.nbytes),
             "copy_bytes memmove": lambda: (set_parallel_copy(None), copy_bytes(view, src)),
             "copy_bytes torch": lambda: (set_parallel_copy(_torch_copy),
                                          copy_bytes(view, src)),
             "torch copy_ (any size)": lambda: _torch_copy(
                 view.reshape(-1).view(np.uint8)[:src.nbytes], src.view(np.uint8))}
    row = []
    for name, fn in paths.items():
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        row.append(f"{name} {1e3 * statistics.median(ts):.3f}")
    set_parallel_copy(_torch_copy)
    print(f"batch {batch}: input copy ({src.nbytes / 1e6:.2f} MB) ms: " + ", ".join(row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="out/efficientnet_bench.json")
    ap.add_argument("--profile", action="store_true",
                    help="profile one call per batch size: slowest dispatches, per-op "
                         "GPU time, host time (host-to-host minus profiled GPU time)")
    ap.add_argument("--profile-rows", type=int, default=15)
    ap.add_argument("--warmup-s", type=float, default=1.0,
                    help="seconds of untimed calls before each backend's timed ones")
    ap.add_argument("--no-cpu", action="store_true", help="skip eager PyTorch on the CPU")
    ap.add_argument("--form", action="append", metavar="MODULE.CONSTANT=VALUE",
                    help="set a kernel form before lowering (repeatable; VALUE is JSON), "
                         "e.g. conv_pointwise.SPLIT_K=false")
    args = ap.parse_args()
    forms = kernel_forms.parse(args.form, ap.error)
    kernel_forms.apply(forms, ap.error)

    model = model_zoo.load_model()
    image = torch.from_numpy(model_zoo.preprocess(model_zoo.load_image()))
    device = default_device()
    results = {"machine": platform.node(), "cpu_threads": torch.get_num_threads(),
               "vulkan_device": device.info.name, "torch": torch.__version__, "forms": forms,
               "rows": []}
    rows = []
    for batch in args.batch:
        x = image.repeat(batch, 1, 1, 1)
        ep = torch.export.export(model, (x,))
        program = vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner())
        assert not program.report.cpu_nodes, str(program.report)
        with torch.no_grad():
            eager = model(x)
        ours = program(x)
        diff = float((ours - eager).abs().max())
        warm = dict(warmup_s=args.warmup_s)
        measured = {"vkdelegate (Vulkan)": timed(lambda: program(x), args.runs, args.warmup,
                                                 **warm)}
        with torch.no_grad():
            if not args.no_cpu:
                measured["eager PyTorch CPU"] = timed(lambda: model(x), args.runs,
                                                      args.warmup, **warm)
            if torch.cuda.is_available():
                cuda_model, cx = model.to("cuda"), x.to("cuda")
                measured["eager PyTorch CUDA"] = timed(
                    lambda: cuda_model(cx), args.runs, args.warmup, torch.cuda.synchronize,
                    **warm)
                measured["PyTorch CUDA graph"] = timed(
                    cuda_graph(cuda_model, cx), args.runs, args.warmup,
                    torch.cuda.synchronize, **warm)
                model.to("cpu")
        base = statistics.median(measured["vkdelegate (Vulkan)"])
        for name, times in measured.items():
            s = stats(times)
            results["rows"].append({"batch": batch, "backend": name, **s,
                                    "max_abs_logit_diff": diff})
            rows.append((batch, name, f"{s['median_ms']:.2f}",
                         f"{s['p10_ms']:.2f}-{s['p90_ms']:.2f}",
                         f"{s['median_ms'] / base:.2f}x"))
        if args.profile:
            gpu_ms = profile(program, x, batch, device.info.name, args.profile_rows)
            results["rows"][-len(measured)]["profiled_gpu_ms"] = gpu_ms
            print(f"host-to-host {base:.3f} ms - profiled GPU {gpu_ms:.3f} ms = "
                  f"{base - gpu_ms:.3f} ms host side and gaps (batch {batch})")
        program.close()
    title = f"EfficientNet-Lite0, Vulkan device: {device.info.name}"
    if forms:
        title += ", forms " + " ".join(f"{k}={v}" for k, v in forms.items())
    report(title, "batch", rows, results, args.json)


if __name__ == "__main__":
    main()
