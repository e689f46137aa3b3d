"""GPU time of EfficientNet-Lite0's pointwise (1 x 1) convolutions, one node each.

Every distinct 1 x 1 layer of EfficientNet-Lite0 at 224 x 224 (input channels ->
output channels @ side) at ``--batch`` images, lowered as the model's are
(kernels/conv_pointwise.py on GPUs), once per ``--forms`` entry (``default``, or
``MODULE.CONSTANT=VALUE`` assignments joined by ``+``, benchmarks/forms.py: e.g.
``conv_pointwise.TILED=false`` for conv2d_pw.glsl instead of conv2d_pw_tiled.glsl),
and the same multiply-adds as one batched matrix product [B, OC, IC] @ [B, IC, H*W]
(the GEMM core, kernels/gemm_core.py). Best GPU time of ``--runs`` profiled executes
(the dispatches' timestamps, a split form's two passes summed; the copies in and out
are not in it), TFLOP/s (2 per multiply-add). Before each case's measurement the GPU
is held busy for ``--hold-s`` seconds (benchmarks/gpu_clock.py: 1 with CUDA, else 0):
without it an idle GPU's clock times these short kernels at a fraction of their speed.
Torch is used only for that hold.

    python benchmarks/pointwise.py [--batch 8] [--runs 5] [--forms default
        conv_pointwise.TILED=false] [--no-bmm] [--hold-s S] [--device NAME]
"""
from __future__ import annotations

import argparse

from tabulate import tabulate

import forms as kernel_forms
import gpu_clock
from cnn_ops import bmm, conv
from vkdelegate.runtime import DelegateGraph, default_device

#: (input channels, output channels, side) of each distinct 1 x 1 layer, in model order.
LAYERS = [(32, 16, 112), (16, 96, 112), (96, 24, 56), (24, 144, 56), (144, 24, 56),
          (144, 40, 28), (40, 240, 28), (240, 40, 28), (240, 80, 14), (80, 480, 14),
          (480, 80, 14), (480, 112, 14), (112, 672, 14), (672, 112, 14), (672, 192, 7),
          (192, 1152, 7), (1152, 192, 7), (1152, 320, 7), (320, 1280, 7)]
#: How often each shape occurs in the model (for the model-weighted total).
COUNT = {(144, 24, 56): 1, (24, 144, 56): 2, (40, 240, 28): 2, (240, 40, 28): 1,
         (80, 480, 14): 3, (480, 80, 14): 2, (112, 672, 14): 3, (672, 112, 14): 2,
         (192, 1152, 7): 4, (1152, 192, 7): 3}


def measure(node, device, runs: int, hold_s: float) -> float:
    """Best GPU ms of ``node.built`` (one_node.OneNode) over ``runs`` profiled executes,
    after one plain execute and ``hold_s`` seconds of keeping the GPU busy."""
    with DelegateGraph(node.built, node.constant_bytes, device=device) as dg:
        dg.execute(node.arrays)
        gpu_clock.hold(hold_s, lambda: dg.execute(node.arrays))
        times = []
        for _ in range(runs):
            dg.execute(node.arrays, profile=True)
            times.append(dg.last_profile.total_ns)
    return min(times) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--forms", nargs="+", default=["default"])
    ap.add_argument("--no-bmm", action="store_true", help="leave out the bmm column")
    ap.add_argument("--filter", default="", help="only layers whose name contains this")
    ap.add_argument("--device", default=None)
    ap.add_argument("--hold-s", type=float, default=gpu_clock.HOLD_S,
                    help="seconds the GPU is held busy before each measurement")
    args = ap.parse_args()
    form_sets = [{} if f == "default" else kernel_forms.parse(f.split("+"), ap.error,
                                                              "--forms")
                 for f in args.forms]
    device = default_device(args.device)
    rows, totals = [], [0.0] * (len(form_sets) + 1)
    for ic, oc, side in LAYERS:
        name = f"{ic}->{oc} @{side}"
        if args.filter not in name:
            continue
        weight = COUNT.get((ic, oc, side), 1)
        flops = 2 * args.batch * ic * oc * side * side
        row = [name, weight]
        for i, forms in enumerate(form_sets):
            saved = kernel_forms.apply(forms, ap.error, "--forms")
            try:
                ms = measure(conv(name, args.batch, ic, oc, side, 1, 1), device,
                             args.runs, args.hold_s)
            finally:
                kernel_forms.apply(saved, ap.error, "--forms")
            totals[i] += weight * ms
            row.append(f"{1e3 * ms:.1f} ({flops / ms / 1e9:.2f})")
        if not args.no_bmm:
            ms = measure(bmm(name, args.batch, oc, ic, side * side), device, args.runs,
                         args.hold_s)
            totals[-1] += weight * ms
            row.append(f"{1e3 * ms:.1f} ({flops / ms / 1e9:.2f})")
        rows.append(row)
    rows.append(["model total (us)", ""] + [f"{1e3 * t:.1f}" for t in
                                           totals[:len(form_sets)]] +
                ([] if args.no_bmm else [f"{1e3 * totals[-1]:.1f}"]))
    print(f"device: {device.info.name} ({device.info.type}), driver {device.info.driver}; "
          f"batch {args.batch}; GPU us (TFLOP/s), best of {args.runs}\n")
    print(tabulate(rows, headers=["layer", "in model"] + [f"conv {f}" for f in args.forms]
                   + ([] if args.no_bmm else ["bmm"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
