"""What one dispatch costs on a device, and where a decode step's attention time goes.

Two measurements, printed as tables:

1. The dispatch floor: a chain of N dependent one-op dispatches on a small tensor
   (``fuse_elementwise`` off so each op is its own dispatch). Wall time per call for
   N = 1 and N = ``--chain`` (slope = the unprofiled cost of one more dispatch with
   its barrier, host time excluded since both calls have one submit), and the median
   profiled GPU time of one dispatch (timestamps with a barrier around each).
2. ``vkdelegate.sdpa_at`` at a Llama-3.2-1B decode step (32 query / 8 KV heads, head dim
   64, fp16 cache of --cache positions, start_pos --pos): the profiled time of each of
   its dispatches for the forms of kernels/attention_decode.py named by ``--forms``
   (WG:KEYS[:PROBE[:NAME=VALUE,...]], the workgroup size = keys per chunk and the keys
   per split; 0:0 the module's defaults; PROBE: sdpa_decode.glsl's probe forms, wrong
   on purpose; then extra shader defines, pack=0/1 for PACK_GQA, and lanes=1 for the
   lanes form, sdpa_decode_lanes.glsl (the default; lanes=0 the workgroup form), with
   kb=, lwg=, dl4= for its LANES_KB, LANES_WG,
   LANES_DL4, merge=1 for LAST_MERGE (the splits merged in the dispatch) and skeys= for
   LANES_SPLIT_KEYS). ``--force-decode`` runs that kernel on a CPU driver too.

    python benchmarks/dispatch_floor.py [--chain 256] [--runs 20] [--forms 0:0 64:64]
    python benchmarks/dispatch_floor.py --only sdpa --forms 0:0 0:0:0:lanes=1 \
        0:0:0:lanes=1,kb=4 0:0:0:lanes=1,lwg=64
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import gpu_clock
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend


class _Chain(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x):
        for i in range(self.n):
            x = x * 1.0001 if i % 2 == 0 else x + 0.001
        return x


class _SdpaAt(torch.nn.Module):
    def forward(self, q, k, v, pos):
        return torch.ops.vkdelegate.sdpa_at(q, k, v, pos)


def _lower(module, inputs, options=None):
    ep = torch.export.export(module, inputs)
    return to_backend(ep, VulkanPartitioner(options or {}))


def _wall(program, inputs, runs, hold_s=0.0):
    program(*inputs)
    _hold(program, inputs, hold_s)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        program(*inputs)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _hold(program, inputs, seconds):
    """Keep the GPU busy for ``seconds`` (gpu_clock.hold: CUDA matrix products, else
    ``program`` called back to back)."""
    gpu_clock.hold(seconds, lambda: program(*inputs))


def _profiled(program, inputs, runs, hold_s=0.0):
    """Median us of each dispatch position over ``runs`` profiled calls: [(shader, us)]."""
    program(*inputs)
    _hold(program, inputs, hold_s)
    program.set_profiling(True)
    per = None
    for _ in range(runs):
        program(*inputs)
        ds = [d for _, p in program.last_profiles() for d in p.dispatches]
        if per is None:
            per = [(d.shader, []) for d in ds]
        for (_, xs), d in zip(per, ds):
            xs.append(d.duration_ns / 1e3)
    program.set_profiling(False)
    return [(name, statistics.median(xs)) for name, xs in per]


def chain(args):
    x = torch.randn(2048)
    opts = {"fuse_elementwise": False}
    one = _lower(_Chain(1), (x,), opts)
    many = _lower(_Chain(args.chain), (x,), opts)
    w1, wn = _wall(one, (x,), args.runs, args.hold_s), _wall(many, (x,), args.runs, args.hold_s)
    prof = _profiled(many, (x,), args.runs, args.hold_s)
    per = statistics.median(us for _, us in prof)
    print(f"dispatch floor, 2048 fp32 elements: wall N=1 {w1:.1f} us, N={args.chain} "
          f"{wn:.1f} us -> {(wn - w1) / (args.chain - 1):.2f} us per extra dispatch "
          f"(unprofiled); profiled median per dispatch {per:.2f} us "
          f"({len(prof)} dispatches)")


def sdpa(args):
    from vkdelegate.kernels import attention_decode as ad
    torch.manual_seed(0)
    dt = torch.float16
    q = torch.randn(1, 32, 1, 64).to(dt)
    k = torch.randn(1, 8, args.cache, 64).to(dt)
    v = torch.randn(1, 8, args.cache, 64).to(dt)
    pos = torch.tensor([args.pos])
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k[:, :, :args.pos + 1].float(), v[:, :, :args.pos + 1].float(),
        enable_gqa=True)
    defaults = (ad.WG, ad.SPLIT_KEYS, ad.SPLIT_BELOW, ad.use_decode, ad.defines, ad.PACK_GQA,
                ad.LANES_FORM, ad.LANES_KB, ad.LANES_WG, ad.LANES_DL4, ad.LAST_MERGE,
                ad.LANES_SPLIT_KEYS)
    print(f"sdpa_at decode, 32/8 heads x 64, fp16 cache {args.cache}, position {args.pos}")
    print(f"{'WG:keys':>10}  {'dispatches (us each)':<60} {'total us':>9} {'max diff':>9}")
    for form in args.forms:
        parts = form.split(":", 3)
        parts += ["0"] * (3 - len(parts)) + [""] * (4 - max(len(parts), 3))
        wg, keys, probe = (int(x) for x in parts[:3])
        extra = dict(kv.split("=") for kv in parts[3].split(",") if kv)
        if probe:
            extra["PROBE"] = str(probe)
        if "pack" in extra:  # pack=1: the query heads of a K/V head in one workgroup
            ad.PACK_GQA = extra.pop("pack") == "1"
        if "lanes" in extra:  # lanes=1: sdpa_decode_lanes.glsl
            ad.LANES_FORM = extra.pop("lanes") == "1"
        if "merge" in extra:  # merge=1: LAST_MERGE
            ad.LAST_MERGE = extra.pop("merge") == "1"
        for key, const in (("kb", "LANES_KB"), ("lwg", "LANES_WG"), ("dl4", "LANES_DL4"),
                           ("skeys", "LANES_SPLIT_KEYS")):
            if key in extra:
                setattr(ad, const, int(extra.pop(key)))
        if extra:
            ad.defines = lambda *a, _d=defaults[4], _e=extra, **k: {**_d(*a, **k), **_e}
        if wg:
            ad.WG, ad.SPLIT_KEYS, ad.SPLIT_BELOW = wg, keys, 1 << 20
        if args.force_decode:
            ad.use_decode = lambda info, l, hq, hk, d: ad.pack(l, hq, hk, d) is not None
        try:
            program = _lower(_SdpaAt(), (q, k, v, pos))
            prof = _profiled(program, (q, k, v, pos), args.runs, args.hold_s)
            diff = (program(q, k, v, pos).float() - ref).abs().max().item()
        finally:
            (ad.WG, ad.SPLIT_KEYS, ad.SPLIT_BELOW, ad.use_decode, ad.defines,
             ad.PACK_GQA, ad.LANES_FORM, ad.LANES_KB, ad.LANES_WG, ad.LANES_DL4,
             ad.LAST_MERGE, ad.LANES_SPLIT_KEYS) = defaults
        cells = " ".join(f"{n}:{us:.1f}" for n, us in prof)
        print(f"{form:>10}  {cells:<60} {sum(us for _, us in prof):9.1f} "
              f"{diff:9.2e} {_sm_clock()}")
    if args.pipeline_stats:
        from quant_gemv import print_pipeline_stats
        from vkdelegate.runtime.device import default_device
        print_pipeline_stats(default_device())


def _sm_clock() -> str:
    """The GPU's SM clock now (nvidia-smi), or '' where there is none."""
    import shutil
    import subprocess
    if not shutil.which("nvidia-smi"):
        return ""
    r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"],
                       capture_output=True, text=True)
    return r.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chain", type=int, default=256)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cache", type=int, default=256)
    ap.add_argument("--pos", type=int, default=96)
    ap.add_argument("--forms", nargs="*", default=["0:0", "128:128", "64:64", "32:32"])
    ap.add_argument("--hold-s", type=float, default=1.0,
                    help="seconds of back-to-back calls before each measurement")
    ap.add_argument("--pipeline-stats", action="store_true",
                    help="the driver's statistics of the pipelines (VKDELEGATE_PIPELINE_STATS=1)")
    ap.add_argument("--force-decode", action="store_true")
    ap.add_argument("--only", choices=["chain", "sdpa"], default=None)
    args = ap.parse_args()
    ensure_defined()
    if args.only in (None, "chain"):
        chain(args)
    if args.only in (None, "sdpa"):
        sdpa(args)


if __name__ == "__main__":
    main()
