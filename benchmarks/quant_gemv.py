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
        [--stream-mb 128] [--sweep] [--probe] [--pipeline-stats] [--reverse] [--hold-s 1]
        [--form quantized_linear.VHALF=true+quantized_linear.VHWORDS=2 ...]

--gemv-everywhere: the quantized GEMV forms on CPU drivers too (lavapipe gets the GEMM
form by default); --rows-per-workgroup: linear_qw_gemv.glsl's outputs per workgroup
(quantized_linear.VROWS, 1 to 16), for tuning; --cases: only the cases whose name
contains one of the comma-separated strings (the fp16 linear, the baseline, always);
--back-to-back: --runs profiled executes in a row (one_node.measure alternates them
with plain executes; on the H200 the two give different times, see docs/PERF.md).
--stream-mb: each case's graph applies its op to the one input with ceil(MB / the
layer's weight MB) distinct weight sets (a decode streams its layers' weights: a
weight set larger than the GPU's L2 cache, H200: 50 MB, is read from memory, not
from L2); the times are per layer (the execute's GPU time over the layers), median
of --runs back-to-back profiled executes after a warm-up, and "best" the fastest.
--sweep: also the GEMV forms under tuning: the fp16 linear's gemv.glsl with
(rows per workgroup, UNROLL) of FP16_SWEEP and the int8 / int4 cases'
linear_qw_gemv.glsl forms of QUANT_SWEEP (the case name says which: staged, direct
or sg_rows, invocations, rows (sg_rows: units) per workgroup, unroll).
--probe: the int8 / int4 cases also in linear_qw_gemv.glsl's PROBE forms (wrong results,
timing only): "probe loads" loads as the default form and skips the unpacking, "probe
math" computes as the default form on weights made from indices (no weight loads),
"probe empty" runs no block loop (the workgroups' launch, reduction and stores alone).
--form: the int8 / int4 cases also in that form, one row each (``MODULE.CONSTANT=VALUE``
of benchmarks/forms.py, several joined by "+"; e.g. quantized_linear.VHALF=true, the
int4 products with fp16 x in packed fp16 arithmetic).
--reverse: each shape's cases in reverse order (is a case's time its place in the run?).
--pipeline-stats: after the table, the driver's compiler statistics of every pipeline
the run created (VK_KHR_pipeline_executable_properties, runtime/pipeline_stats.py;
e.g. NVIDIA's register count), one row per shader variant.
"""
from __future__ import annotations

import argparse
import re
import sys

import numpy as np
from tabulate import tabulate

import dataclasses
import math
import statistics

import forms
from one_node import _DT, OneNode, measure
from vkdelegate.errors import DeviceLimitError, VkDelegateError
from vkdelegate.kernels import gemm_core, gemm_tiles
from vkdelegate.runtime import DelegateGraph, default_device
from vkdelegate.serialization import vkgraph as g

#: gemv.glsl forms of --sweep: (outputs per workgroup, UNROLL).
FP16_SWEEP = ((4, 1), (4, 2), (4, 8), (2, 4), (2, 8), (8, 2), (8, 4))
#: linear_qw_gemv.glsl forms of --sweep (int8 and int4 cases): (DIRECT, VWG invocations
#: per workgroup, VROWS outputs per workgroup, VUNROLL blocks per row per iteration,
#: VSG_ROWS). At K = 2048 (the 1B decode) a row is 64 int4 blocks: with 128 invocations
#: half of them idle, hence the 64- and 32-wide forms with more rows, and the SG_ROWS
#: forms (a subgroup per output over its whole K, no barrier; VROWS units per
#: workgroup, DIRECT implied; where the device has subgroup arithmetic, else DIRECT).
QUANT_SWEEP = ((False, 128, 8, 1, False), (False, 64, 16, 1, False), (True, 128, 8, 1, False),
               (True, 128, 4, 1, False), (True, 64, 8, 1, False), (True, 32, 4, 4, False),
               (True, 32, 8, 2, False), (True, 64, 16, 1, False), (True, 128, 16, 1, False),
               (True, 32, 16, 2, False),
               (True, 128, 8, 1, True), (True, 128, 8, 2, True), (True, 128, 16, 1, True),
               (True, 128, 16, 2, True), (True, 128, 32, 1, True), (True, 256, 16, 1, True),
               (True, 256, 32, 1, True), (True, 256, 32, 2, True))


class Layers(OneNode):
    """A OneNode whose op is applied ``layers`` times to the same inputs, each time
    with its own constants (a decode streaming distinct layers' weights): a case adds
    its inputs, then per ``each()`` iteration its constants, scalars and ``op``;
    ``finish()`` builds the graph (outputs: every layer's). Layer 0's constants come
    first, so its node is chain[0] and its weights consts[0], consts[1]."""

    def __init__(self, name: str, layers: int):
        super().__init__(name)
        self.layers, self.chain, self.outs = layers, [], []

    def each(self):
        shared = list(self.args)
        for _ in range(self.layers):
            self.args = list(shared)
            yield
        self.args = shared

    def op(self, op: str, outs) -> None:
        ids = [self._add(g.VkTensor(_DT[dt], list(shape))) for shape, dt in outs]
        self.chain.append(g.OperatorCall(len(self.chain), op, self.args + ids))
        self.outs += ids

    def finish(self) -> "Layers":
        offsets, pos = [], 0
        for c in self.consts:
            offsets.append(g.VkBytes(pos, len(c)))
            pos += len(c)
        self.built = g.VkGraph(chain=self.chain, values=self.values, input_ids=self.inputs,
                               output_ids=self.outs, constants=offsets)
        return self


def _layers(weight_bytes: int, stream_mb: float) -> int:
    """Weight sets a case streams: enough for ``stream_mb`` MB (1 when 0)."""
    return max(1, math.ceil(stream_mb * 1e6 / weight_bytes)) if stream_mb else 1


def _linear(m, k, n, dtype, mb=0.0):
    size = np.dtype(dtype).itemsize
    node = Layers(f"linear {dtype}", _layers(n * k * size, mb)).input((m, k), dtype)
    for _ in node.each():
        node.constant((n, k), dtype).arg(None)
        node.moved += n * k * size
        node.op("aten.linear.default", [((m, n), dtype)])
    return node.finish()


def _int8(m, k, n, dtype, mb=0.0):
    size = np.dtype(dtype).itemsize
    node = Layers(f"int8 weights, {dtype} x", _layers(n * k, mb)).input((m, k), dtype)
    for _ in node.each():
        node.constant((n, k), "int8", high=127).constant((n,), dtype, positive=True)
        node.moved += n * k + n * size
        node.op("aten._weight_int8pack_mm.default", [((m, n), dtype)])
    return node.finish()


def _int4(m, k, n, dtype, group, mb=0.0):
    size = np.dtype(dtype).itemsize
    node = Layers(f"int4 g{group} weights, {dtype} x", _layers(n * k // 2, mb))
    node.input((m, k), dtype)
    for _ in node.each():
        node.constant((n, k // 2), "uint8", high=256)
        node.constant((k // group, n), dtype, positive=True).arg(group).arg(None)
        node.moved += n * k // 2 + (k // group) * n * size
        node.op("et_vk.linear_q4gsw.default", [((m, n), dtype)])
    return node.finish()


def _8da4w(m, k, n, group, mb=0.0):
    node = Layers(f"8da4w g{group}", _layers(n * k // 2, mb)).input((m, k))
    node.input((m,), positive=True)
    node.input((m,), "int8", high=1)  # zero points 0
    for _ in node.each():
        node.constant((n, k // 2), "uint8", high=256)
        node.constant((k // group, -(-n // 8) * 8), "int32", high=1)
        node.constant((k // group, n), positive=True).arg(group).arg(None)
        node.moved += n * k // 2 + (k // group) * n * 8
        node.op("et_vk.linear_dq8ca_q4gsw.default", [((m, n), "float32")])
    return node.finish()


def reference(node) -> "np.ndarray | None":
    """Layer 0's output in fp64 by numpy (None for 8da4w)."""
    op = node.built.chain[0].name
    x = node.arrays[0].astype(np.float64)
    n = node.built.values[node.built.chain[0].args[-1]].dims[-1]
    if op == "aten.linear.default":
        w = np.frombuffer(node.consts[0], node.arrays[0].dtype).reshape(n, -1)
        return x @ w.astype(np.float64).T
    if op not in ("et_vk.linear_q4gsw.default", "aten._weight_int8pack_mm.default"):
        return None
    w = np.frombuffer(node.consts[0], np.uint8 if "q4gsw" in op else np.int8)
    s = np.frombuffer(node.consts[1], node.arrays[0].dtype).astype(np.float64)
    if "q4gsw" in op:
        w = w.reshape(n, -1).astype(np.int64)
        q = np.stack([w & 15, w >> 4], -1).reshape(n, -1) - 8
        groups = s.reshape(-1, n).shape[0]
        return x @ (q.reshape(n, groups, -1) * s.reshape(groups, n).T[..., None]).reshape(n, -1).T
    return (x @ w.reshape(n, -1).astype(np.float64).T) * s


def rel_err(out, ref) -> str:
    """max |out - ref| / max(1, max |ref|) ('' without a reference)."""
    if ref is None:
        return ""
    out = out.astype(np.float64)
    return f"{np.abs(out - ref).max() / max(1.0, np.abs(ref).max()):.1e}"


def first_output(node, device) -> np.ndarray:
    """Layer 0's output of one execute of ``node``."""
    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        return dg.execute(node.arrays)[0]


def back_to_back(node, device, runs: int) -> float:
    """Best GPU ms of ``runs`` profiled executes of ``node`` in a row (one warm-up)."""
    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        dg.execute(node.arrays)
        times = []
        for _ in range(runs):
            dg.execute(node.arrays, profile=True)
            times.append(dg.last_profile.total_ns)
    return min(times) / 1e6


#: Seconds of back-to-back executes before each streamed measurement (--hold-s).
HOLD_S = 1.0


def streamed(node, device, runs: int) -> tuple:
    """(median, best) GPU ms per layer of ``runs`` back-to-back profiled executes of
    the Layers ``node``, after warm-up executes (at least 10, and HOLD_S seconds:
    the GPU's clocks rise under load, the H200 idles at 345 MHz), the median
    fence wait per layer of ``runs`` unprofiled executes (ms: no timestamps, no
    barriers added; the GPU's time plus one submit's latency over the layers), and
    layer 0's output of the first execute."""
    import time

    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        start, warm = time.perf_counter(), 0
        out = dg.execute(node.arrays)[0]
        while warm < 10 or time.perf_counter() - start < HOLD_S:
            dg.execute(node.arrays, profile=True)
            warm += 1
        times = []
        for _ in range(runs):
            dg.execute(node.arrays, profile=True)
            times.append(dg.last_profile.total_ns / node.layers)
        waits = []
        for _ in range(runs):
            dg.execute(node.arrays)
            waits.append(dg.last_timing["fence_wait_s"] * 1e3 / node.layers)
    return statistics.median(times) / 1e6, min(times) / 1e6, statistics.median(waits), out


def _forms(sweep: bool, name: str, probe: bool = False, extra=()):
    """(label, apply) pairs: the forms a case runs in (the default only, or with
    --sweep the FP16_SWEEP / QUANT_SWEEP forms, with --probe the PROBE forms of the
    int8 / int4 cases, and the int8 / int4 cases in each of ``extra``'s --form rows:
    (label, {"module.CONSTANT": value}) pairs); apply() sets the module constants
    (main restores the quantized-linear family's and the forms' after each)."""
    from vkdelegate.ops.families import quantized_linear as family

    default = ("", lambda: None)
    if name.startswith(("int8", "int4")):
        def row(label, values):
            def apply():
                forms.apply(values, _no_error)
            return f" [{label}]", apply
        rows = [row(label, values) for label, values in extra]
        if rows and not sweep and not probe:
            return [default] + rows
    else:
        rows = []
    probes = []
    if probe and name.startswith(("int8", "int4")):
        def probe_form(level, label):
            def apply():
                family.VPROBE = level
            return f" [probe {label}]", apply
        probes = [probe_form(1, "loads"), probe_form(2, "math"), probe_form(3, "empty")]
    if probes and not sweep:
        return [default] + probes + rows
    if not sweep or name.startswith(("linear float32", "8da4w")):
        return [default]
    if name.startswith("linear"):
        def fp16(rows, unroll):
            def apply():
                gemm_core.GEMV_UNROLL, gemm_core.GEMV_SHORT_K = unroll, 0
                tiles = gemm_tiles.tiles_for(family_device_type[0])
                gemm_tiles.TABLE[family_device_type[0]] = dataclasses.replace(
                    tiles, gemv_rows=rows)
            return f" [gemv r{rows} u{unroll}]", apply
        return [default] + [fp16(r, u) for r, u in FP16_SWEEP]

    def quant(direct, wg, rows, unroll, sg):
        def apply():
            family.VDIRECT, family.VWG, family.VROWS, family.VUNROLL = direct, wg, rows, unroll
            family.VSG_ROWS, family.VWG_FIT = sg, 0  # the invocations named
        form = "sg_rows" if sg else "direct" if direct else "staged"
        return f" [{form} wg{wg} r{rows} u{unroll}]", apply
    return [default] + probes + rows + [quant(*f) for f in QUANT_SWEEP]


def _no_error(message):
    raise SystemExit(message)  # --form rows are checked when parsed


family_device_type = [""]  # the device type whose tile-table row --sweep replaces


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
    parser.add_argument("--cases", default="", help="comma-separated name filters (substrings "
                        "of the cases' names; a comma followed by a space is part of one)")
    parser.add_argument("--hold-s", type=float, default=HOLD_S,
                        help="seconds of back-to-back executes before each streamed case "
                             "(clocks up)")
    parser.add_argument("--reverse", action="store_true",
                        help="run each shape's cases in reverse order (clock-state checks)")
    parser.add_argument("--back-to-back", action="store_true")
    parser.add_argument("--stream-mb", type=float, default=0.0)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--pipeline-stats", action="store_true")
    parser.add_argument("--form", action="append", default=[],
                        metavar="MODULE.CONSTANT=VALUE[+...]",
                        help="the int8 / int4 cases also in this form (benchmarks/forms.py; "
                             "several joined by +), one row each; repeatable")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: at least 1")
    shapes = []
    for shape in args.shapes.split(","):
        try:
            k, n = (int(v) for v in shape.split("x"))
            if k < 1 or n < 1:
                raise ValueError
        except ValueError:
            parser.error(f"--shapes: {shape!r} is not KxN (positive sizes, e.g. 4096x4096)")
        shapes.append((k, n))
    extra = [(item, forms.parse(item.split("+"), parser.error)) for item in args.form]
    if args.pipeline_stats:
        import os
        os.environ["VKDELEGATE_PIPELINE_STATS"] = "1"  # before the device is created
    from vkdelegate.ops.families import quantized_linear as family

    if args.gemv_everywhere:
        family.use_gemv = lambda info, m: m <= family.GEMV_ROWS
    if args.rows_per_workgroup:
        family.VROWS = args.rows_per_workgroup
    device = default_device(args.device)
    family_device_type[0] = device.info.type
    saved = ((gemm_core.GEMV_UNROLL, gemm_core.GEMV_SHORT_K), dict(gemm_tiles.TABLE),
             family.VDIRECT, family.VWG,
             family.VROWS, family.VUNROLL, family.VPROBE, family.VSG_ROWS, family.VWG_FIT)
    saved_forms = {name: forms.resolve(name, value, parser.error).__dict__[name.rpartition(".")[2]]
                   for _, values in extra for name, value in values.items()}
    globals()["HOLD_S"] = args.hold_s
    mb, rows = args.stream_mb, []
    m, gs = args.rows, args.group
    names = ["linear float32", "linear float16", "int8 weights, float32 x",
             "int8 weights, float16 x", f"int4 g{gs} weights, float32 x",
             f"int4 g{gs} weights, float16 x", f"8da4w g{gs}"]
    keep = [c for c in re.split(r",(?! )", args.cases) if c.strip()]
    if args.cases and not any(f in name for f in keep for name in names
                              if name != "linear float16"):
        parser.error(f"--cases {args.cases!r} names none of the cases (the fp16 linear, "
                     f"the baseline, always runs): {'; '.join(names)}")
    for k, n in shapes:
        cases = [lambda: _linear(m, k, n, "float32", mb), lambda: _linear(m, k, n, "float16", mb),
                 lambda: _int8(m, k, n, "float32", mb), lambda: _int8(m, k, n, "float16", mb),
                 lambda: _int4(m, k, n, "float32", gs, mb),
                 lambda: _int4(m, k, n, "float16", gs, mb), lambda: _8da4w(m, k, n, gs, mb)]
        timed = []  # (node, label, (median, best) GPU ms, or the device limit's message)
        order = list(enumerate(cases))
        for i, make in (order[::-1] if args.reverse else order):
            if i != 1 and keep and not any(f in names[i] for f in keep):
                continue
            node = make()  # one weight set for all of its forms
            ref = reference(node)
            for label, apply in _forms(args.sweep, names[i], args.probe, extra):
                apply()
                try:
                    if mb:
                        *ms, out = streamed(node, device, args.runs)
                    else:
                        best = (back_to_back(node, device, args.runs) if args.back_to_back
                                else measure(node, device, args.runs)[0])
                        ms, out = (best, best, None), first_output(node, device)
                    timed.append((node, label, ms, rel_err(out, ref)))
                except DeviceLimitError as exc:  # lavapipe: 128 MiB storage buffers at most
                    timed.append((node, label, str(exc).split(',')[0], ""))
                except VkDelegateError as exc:  # a --form the kernels refuse
                    parser.error(f"{node.name}{label}: {exc}")
                finally:
                    gemm_core.GEMV_UNROLL, gemm_core.GEMV_SHORT_K = saved[0]
                    gemm_tiles.TABLE.clear()
                    gemm_tiles.TABLE.update(saved[1])
                    (family.VDIRECT, family.VWG, family.VROWS, family.VUNROLL,
                     family.VPROBE, family.VSG_ROWS, family.VWG_FIT) = saved[2:]
                    forms.apply(saved_forms, parser.error)
                ms = timed[-1][2]
                print(f"{k}x{n} {node.name}{label}: " + (ms if isinstance(ms, str) else
                      f"{ms[0]:.4f} ms"), file=sys.stderr, flush=True)
        base = next((ms[0] for node, label, ms, _ in timed
                     if node.name == "linear float16" and not label and
                     not isinstance(ms, str)), None)
        for node, label, ms, err in timed:
            name = f"{node.name}{label}"
            if isinstance(ms, str):
                rows.append([f"{k}x{n}", name, 1, "-", "-", "-", "-",
                             "-", f"over a device limit ({ms})"])
                continue
            per_layer = node.moved / node.layers
            rows.append([f"{k}x{n}", name, node.layers, f"{ms[0]:.4f}", f"{ms[1]:.4f}",
                         f"{per_layer / ms[0] / 1e6:.1f}",
                         f"{base / ms[0]:.2f}x" if base and name != "linear float16" else "-",
                         "-" if ms[2] is None else f"{ms[2]:.4f}", err])
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}; "
          f"{args.rows} row(s), group {args.group}\n")
    what = (f"median of {args.runs} back-to-back runs, per layer" if mb else
            f"best of {args.runs} runs (both columns)")
    print(f"GPU ms: {what}" + ("; wait ms: median unprofiled fence wait per layer"
                                 if mb else "") + "\n")
    print(tabulate(rows, headers=["K x N", "case", "layers", "GPU ms", "best", "weight GB/s",
                                  "vs fp16", "wait ms", "rel err"]))
    if args.pipeline_stats:
        print_pipeline_stats(device)
    return 0


#: Defines that tell the forms of one shader apart in --pipeline-stats' table.
_FORM_DEFINES = ("W4", "W8", "X16", "DIRECT", "SG_ROWS", "WG", "ROWS", "UNROLL", "SVEC",
                 "HALF_DOT", "HWORDS",
                 "PROBE", "DQ8CA", "GEMV_ROWS", "GEMV_UNROLL", "OUT_T", "K_STEP", "R_MAX")


def print_pipeline_stats(device, form_defines=_FORM_DEFINES) -> None:
    """A table of the driver's statistics of every pipeline ``device`` created, each
    named by its shader and its ``form_defines``."""
    if not device.pipeline_statistics:
        print(f"\npipeline statistics: {device.info.name} lacks "
              f"VK_KHR_pipeline_executable_properties")
        return
    rows, names = [], []
    for shader, defines, pipe in device.pipelines.items():
        form = " ".join(f"{k}={v}" if v != "1" else k for k, v in defines
                        if k in form_defines)
        for exe in pipe.statistics():
            for stat in exe.statistics:
                if stat not in names:
                    names.append(stat)
            rows.append((f"{shader} {form}", exe.subgroup_size, exe.statistics))
    print("\npipeline statistics (the driver's, VK_KHR_pipeline_executable_properties)\n")
    print(tabulate([[r[0], r[1], *(r[2].get(n, "") for n in names)] for r in rows],
                   headers=["shader variant", "subgroup", *names]))


if __name__ == "__main__":
    raise SystemExit(main())
