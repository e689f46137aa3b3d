"""The on-device sampler (vkdelegate.sample, sample.glsl) per sampling setting.

One lowered one-node program calling ``torch.ops.vkdelegate.sample`` per vocabulary
size; for each case (greedy, temperature only, top-k, top-k + top-p, top-p alone) the
median over ``--runs`` calls of the GPU time of the sampler's dispatch(es) (the sum
of the dispatches' timestamps) and of the wall time of one call (logits in, id out).
The logits are seeded normal * 3 (fp32 or fp16), the draw a fixed 0.37.

    python benchmarks/sample.py [--runs 10] [--vocab 128256 151936] [--dtype float16]
                                [--filter top-p]

Runs on lavapipe too (about 10 ms a call there at V = 152k). Run it with the checkout
to measure on PYTHONPATH (the venv may hold another vkdelegate).
"""
from __future__ import annotations

import argparse

import torch
from tabulate import tabulate

from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend

from sdpa import measure_program  # benchmarks/sdpa.py (run from benchmarks/ or its path)

#: (name, temperature, top_k, top_p)
CASES = [
    ("greedy", 0.0, 0, 1.0),
    ("temperature 0.8", 0.8, 0, 1.0),
    ("top-k 50", 0.8, 50, 1.0),
    ("top-k 50 + top-p 0.9", 0.8, 50, 0.9),
    ("top-k 1024 + top-p 0.9", 0.8, 1024, 0.9),
    ("top-k 2000 + top-p 0.9", 0.8, 2000, 0.9),
    ("top-p 0.9", 0.8, 0, 0.9),
]


class _Sampler(torch.nn.Module):
    def forward(self, logits, sampling):
        return torch.ops.vkdelegate.sample(logits, sampling)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--vocab", type=int, nargs="+", default=[128256, 151936])
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    ensure_defined()
    rows = []
    for vocab in args.vocab:
        logits = (torch.randn(1, vocab, generator=torch.Generator().manual_seed(vocab))
                  * 3).to(getattr(torch, args.dtype))
        example = (logits, torch.tensor([1.0, 0, 1, 0.5]))
        ep = torch.export.export(_Sampler(), example)
        program = to_backend(ep, VulkanPartitioner())
        for name, t, k, p in CASES:
            if args.filter not in name:
                continue
            sampling = torch.tensor([t, k, p, 0.37], dtype=torch.float32)
            gpu, wall, _ = measure_program(program, (logits, sampling), args.runs)
            rows.append((vocab, name, f"{gpu:.3f}", f"{wall:.3f}"))
            print(*rows[-1], sep="\t", flush=True)
    print(tabulate(rows, headers=["V", "case", "GPU ms (median)", "wall ms (median)"]))


if __name__ == "__main__":
    main()
