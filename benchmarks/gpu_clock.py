"""Measure a GPU busy: its SM clock idles down within a second or two (an H100 / H200
from 1980 to 345 MHz, docs/PERF.md), so a benchmark that builds, compiles or runs
PyTorch between its measurements times the next kernel at a fraction of its speed
unless something keeps the GPU busy right before (sdpa.py's 2048-token causal
attention: 1.06 ms after an idle moment, 0.235 ms held busy, on one H100).
"""
from __future__ import annotations

import time
from typing import Callable


def cuda() -> bool:
    """Whether this process's torch has CUDA (the GPU machine)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


#: Seconds a benchmark keeps the GPU busy before a measurement (its --hold-s): 1 with
#: CUDA (the GPU machine), 0 elsewhere (lavapipe's clock does not idle down).
HOLD_S = 1.0 if cuda() else 0.0


def hold(seconds: float, work: "Callable[[], object] | None" = None) -> None:
    """Keep the GPU busy for ``seconds``: with CUDA (the GPU machine's torch), fp32
    4096 x 4096 matrix products on the same GPU; else ``work()`` (e.g. one call of
    the program about to be measured) back to back; nothing where both are absent
    or ``seconds`` <= 0."""
    if seconds <= 0:
        return
    end = time.perf_counter() + seconds
    if cuda():
        import torch

        a = torch.randn(4096, 4096, device="cuda")
        while time.perf_counter() < end:
            for _ in range(8):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
        return
    while work is not None and time.perf_counter() < end:
        work()
