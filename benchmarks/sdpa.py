"""Fused SDPA (aten.scaled_dot_product_attention on sdpa.glsl) against its decomposed
form (matmul, softmax, masking nodes, as torch decomposes it) on the same device.

For each shape, both programs are lowered from one torch.export program: the fused one
as usual, the decomposed one with the SDPA op blocklisted (the partitioner then lets
torch decompose it and runs the pieces on Vulkan). Prints a table of the median over
``--runs`` calls of the GPU time (sum of the dispatches' timestamps) and of the wall
time of one call (host inputs in, outputs out), plus the largest difference between
the two outputs.

    python benchmarks/sdpa.py [--runs 10] [--filter causal] [--dtype float16]

With ``--prefill``, the block-sparse early exit instead (issue 14): prefill attention
at 512, 2048 and 8192 tokens (causal, a boolean sliding-window mask of 1024 keys as HF
Mistral builds it, and the same window as vkdelegate.sliding_window_sdpa), fused with
the early exit on and off (compile option ``sdpa_skip_masked_tiles``), whether the two
outputs are bit-identical, and PyTorch's SDPA on the same inputs (CUDA, device-resident,
timed with CUDA events, when available; else the CPU only up to --torch-cpu-max
tokens).

    python benchmarks/sdpa.py --prefill [--dtype float16|both] [--filter 8192]

For float16 also the portable tiled kernel (compile option sdpa_cooperative_matrix off,
where the device has cooperative matrices), the effective TFLOP/s (the scores the mask
lets through, 4 E FLOPs each) and the largest difference from PyTorch's output.

``--pipeline-stats`` ends with the driver's statistics of each attention pipeline
(registers, spills: VK_KHR_pipeline_executable_properties).
``--form MODULE.CONSTANT=VALUE`` (benchmarks/forms.py) sets a kernel form first, e.g.
``--form attention.COOP_STAGES=2`` for sdpa_coopmat.glsl with its double buffer.

The larger cases are sized for a GPU (the H200); on lavapipe use --filter lavapipe
(``--filter "lavapipe 1024"``: a boolean window of 128 keys at 1024 tokens and the same
window as the op, the block map's case, docs/PERF.md).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import forms as kernel_forms
import gpu_clock

from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend

SDPA = "aten.scaled_dot_product_attention.default"

#: (name, batch, q heads, kv heads, L, S, head dim, mode)
CASES = [
    ("small causal (lavapipe)", 1, 2, 2, 128, 128, 32, "causal"),
    ("decode 1x2048 gqa4 (lavapipe)", 1, 8, 2, 1, 2048, 64, "none"),
    ("bert-base 4x512", 4, 12, 12, 512, 512, 64, "none"),
    ("bert padding mask", 4, 12, 12, 512, 512, 64, "bool"),
    ("causal 1024", 1, 16, 16, 1024, 1024, 64, "causal"),
    ("causal 2048 gqa4", 1, 32, 8, 2048, 2048, 128, "causal"),
    ("decode 1x4096 gqa4", 1, 32, 8, 1, 4096, 128, "none"),
    ("decode llama-1b 1x256 gqa4 static cache", 1, 32, 8, 1, 256, 64, "bool"),
    ("vit float mask", 8, 6, 6, 197, 197, 64, "float"),
]


class _Attention(torch.nn.Module):
    def __init__(self, mode: str, gqa: bool):
        super().__init__()
        self.mode, self.gqa = mode, gqa

    def forward(self, q, k, v, mask):
        if self.mode in ("bool", "float"):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                  enable_gqa=self.gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.mode == "causal",
                                              enable_gqa=self.gqa)


def _inputs(b, hq, hk, lq, s, e, mode, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, e).to(dtype) for h, n in ((hq, lq), (hk, s), (hk, s)))
    if mode == "bool":
        mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
        mask[:, :, :, s * 3 // 4:] = False  # key padding
    elif mode == "float":
        mask = torch.randn(1, hq, lq, s).to(dtype)
    else:
        mask = torch.zeros(1)
    return q, k, v, mask


def measure_program(program, inputs, runs: int) -> tuple[float, float, torch.Tensor]:
    """(median GPU ms of a call: the sum of its dispatches' timestamps, median wall ms
    of a call with host inputs and outputs, the output) over ``runs`` calls each, the
    GPU held busy for gpu_clock.HOLD_S first (--hold-s); benchmarks/sample.py uses it
    too."""
    out = program(*inputs)  # build and warm up
    gpu_clock.hold(gpu_clock.HOLD_S, lambda: program(*inputs))
    program.set_profiling(True)
    gpu = []
    for _ in range(runs):
        program(*inputs)
        gpu.append(sum(p.total_ns for _, p in program.last_profiles()) / 1e6)
    program.set_profiling(False)
    wall = []
    for _ in range(runs):
        t0 = time.perf_counter()
        program(*inputs)
        wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(gpu), statistics.median(wall), out


#: (name, q heads, kv heads, tokens, head dim, mode[, window]): Llama-3-8B-shaped
#: attention; the window (bool and op modes) is WINDOW keys unless given.
PREFILL = [
    ("prefill lavapipe", 2, 1, 256, 64, "causal"),
    ("prefill lavapipe 1024 window 128 bool", 4, 2, 1024, 64, "bool", 128),
    ("prefill lavapipe 1024 window 128 op", 4, 2, 1024, 64, "op", 128),
    ("prefill 512 causal", 32, 8, 512, 128, "causal"),
    ("prefill 2048 causal", 32, 8, 2048, 128, "causal"),
    ("prefill 8192 causal", 32, 8, 8192, 128, "causal"),
    ("prefill 2048 window 1024 bool", 32, 8, 2048, 128, "bool"),
    ("prefill 8192 window 1024 bool", 32, 8, 8192, 128, "bool"),
    ("prefill 8192 window 1024 op", 32, 8, 8192, 128, "op"),
]
WINDOW = 1024


class _Prefill(torch.nn.Module):
    def __init__(self, mode: str, window: int = WINDOW):
        super().__init__()
        self.mode, self.window = mode, window

    def forward(self, q, k, v, mask):
        if self.mode == "op":
            return torch.ops.vkdelegate.sliding_window_sdpa(q, k, v, self.window)
        if self.mode == "bool":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _window_mask(n: int, window: int = WINDOW) -> torch.Tensor:
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return ((j <= i) & (j > i - window))[None, None]


def _torch_ms(module, inputs, runs: int, cpu_max: int):
    """PyTorch SDPA's time and output: on CUDA (device tensors, CUDA events) when
    available; else on the CPU (one run) up to ``cpu_max`` tokens; else ("-", ..., None)."""
    if module.mode == "op":  # the same attention as the bool mask, eager spells it so
        module = _Prefill("bool", module.window)
        inputs = inputs[:3] + (_window_mask(inputs[0].shape[-2], module.window),)
    if torch.cuda.is_available():
        dev = [t.cuda() for t in inputs]
        times = []
        for _ in range(runs + 2):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            out = module(*dev)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return f"{statistics.median(times[2:]):.3f}", "cuda", out.cpu()
    if inputs[0].shape[-2] > cpu_max:
        return "-", "cpu (skipped)", None
    t0 = time.perf_counter()
    out = module(*inputs)
    return f"{(time.perf_counter() - t0) * 1e3:.1f}", "cpu (1 run)", out


def _flops(hq: int, n: int, e: int, mode: str, window: int = WINDOW) -> float:
    """FLOPs of the attention a mask lets through (Q K^T and P V: 4 E per score):
    causal n (n + 1) / 2 scores per head, the window of ``window`` keys fewer."""
    w = min(window, n) if mode in ("bool", "op") else n
    scores = n * w - w * (w - 1) / 2
    return 4.0 * hq * e * scores


def prefill(args, dtype) -> list:
    """One row per PREFILL case: the fused kernel with the early exit on and off (and
    for float16 with cooperative matrices off, the portable tiled kernel), whether the
    two early-exit settings are bit-identical, the effective TFLOP/s, PyTorch's time and
    the largest difference from PyTorch's output."""
    ensure_defined()
    rows = []
    settings = [{"sdpa_skip_masked_tiles": True}, {"sdpa_skip_masked_tiles": False}]
    if dtype == torch.float16:
        settings.append({"sdpa_cooperative_matrix": False})
    for name, hq, hk, n, e, mode, *rest in PREFILL:
        if args.filter not in name:
            continue
        window = rest[0] if rest else WINDOW
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, h, n, e).to(dtype) for h in (hq, hk, hk))
        mask = _window_mask(n, window) if mode == "bool" else torch.zeros(1)
        if mode == "op":  # vkdelegate.sliding_window_sdpa takes Hq % Hk heads as GQA
            mask = torch.zeros(1)
        inputs = (q, k, v, mask)
        module = _Prefill(mode, window)
        ep = torch.export.export(module, inputs)
        ms, outs = [], []
        for options in settings:
            program = to_backend(ep, VulkanPartitioner(options))
            try:
                gpu, _, out = measure_program(program, inputs, args.runs)
            finally:
                program.close()
            ms.append(gpu)
            outs.append(out)
        t_ms, t_dev, t_out = _torch_ms(module, inputs, args.runs, args.torch_cpu_max)
        diff = "-" if t_out is None else \
            f"{(outs[0].float() - t_out.float()).abs().max().item():.1e}"
        portable = f"{ms[2]:.3f}" if len(ms) > 2 else "-"
        rows.append((name, f"{hq}/{hk}x{n}x{e}", f"{ms[0]:.3f}", f"{ms[1]:.3f}",
                     f"{ms[1] / ms[0]:.2f}x", torch.equal(outs[0], outs[1]), portable,
                     f"{_flops(hq, n, e, mode, window) / ms[0] / 1e9:.2f}", t_ms, t_dev, diff))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--filter", default="")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "both"])
    ap.add_argument("--prefill", action="store_true",
                    help="the early-exit prefill table instead (see the docstring)")
    ap.add_argument("--torch-cpu-max", type=int, default=2048,
                    help="largest token count timed with PyTorch on the CPU")
    ap.add_argument("--form", action="append", metavar="MODULE.CONSTANT=VALUE",
                    help="set a kernel form before lowering (repeatable; VALUE is JSON), "
                         "e.g. attention.COOP_STAGES=1")
    ap.add_argument("--pipeline-stats", action="store_true")
    ap.add_argument("--hold-s", type=float, default=gpu_clock.HOLD_S,
                    help="seconds the GPU is kept busy before each measurement (its "
                         "clock idles down within seconds; gpu_clock.py); default 1 "
                         "with CUDA (the GPU machine), else 0")
    args = ap.parse_args()
    gpu_clock.HOLD_S = args.hold_s
    if args.pipeline_stats:
        import os
        os.environ["VKDELEGATE_PIPELINE_STATS"] = "1"  # before the device is created
    forms = kernel_forms.parse(args.form, ap.error)
    kernel_forms.apply(forms, ap.error)
    title_forms = "".join(f", form {k}={v}" for k, v in forms.items())
    from tabulate import tabulate

    names = ["float32", "float16"] if args.dtype == "both" else [args.dtype]
    if args.prefill:
        for dname in names:
            rows = prefill(args, getattr(torch, dname))
            print(f"dtype {dname}, median of {args.runs} runs; early exit = compile "
                  f"option sdpa_skip_masked_tiles; portable = sdpa_cooperative_matrix off; "
                  f"TFLOP/s of the unmasked scores, early exit on{title_forms}")
            print(tabulate(rows, headers=["case", "Hq/HkxNxE", "exit on GPU ms",
                                          "exit off GPU ms", "speed-up", "bit-identical",
                                          "portable GPU ms", "TFLOP/s", "torch SDPA ms",
                                          "torch on", "max |diff| vs torch"]))
        _pipeline_stats(args)
        return
    dtype = getattr(torch, names[-1])

    rows = []
    for name, b, hq, hk, lq, s, e, mode in CASES:
        if args.filter not in name:
            continue
        inputs = _inputs(b, hq, hk, lq, s, e, mode, dtype)
        ep = torch.export.export(_Attention(mode, hq != hk), inputs)
        fused = to_backend(ep, VulkanPartitioner())
        decomposed = to_backend(ep, VulkanPartitioner(operator_blocklist=[SDPA]))
        try:
            f_gpu, f_wall, f_out = measure_program(fused, inputs, args.runs)
            d_gpu, d_wall, d_out = measure_program(decomposed, inputs, args.runs)
        finally:
            fused.close()
            decomposed.close()
        diff = (f_out.float() - d_out.float()).abs().max().item()
        rows.append((name, f"{b}x{hq}/{hk}x{lq}x{s}x{e}", mode, f"{f_gpu:.3f}",
                     f"{d_gpu:.3f}", f"{d_gpu / f_gpu:.1f}x", f"{f_wall:.2f}",
                     f"{d_wall:.2f}", f"{diff:.1e}"))
    print(f"dtype {args.dtype}, median of {args.runs} runs; decomposed = SDPA "
          f"blocklisted{title_forms}")
    print(tabulate(rows, headers=["case", "BxHq/HkxLxSxE", "mask", "fused GPU ms",
                                  "decomposed GPU ms", "speed-up", "fused wall ms",
                                  "decomposed wall ms", "max |diff|"]))
    _pipeline_stats(args)


def _pipeline_stats(args) -> None:
    if args.pipeline_stats:
        from quant_gemv import print_pipeline_stats
        from vkdelegate.runtime import default_device

        print_pipeline_stats(default_device(), ("D_MAX", "STAGES", "CAUSAL", "WINDOW",
                                                "MASK_BOOL", "TILE_MAP", "SKIP_MASKED_TILES"))


if __name__ == "__main__":
    main()
