"""Counting the host calls of one execute: the check that host work per inference
does not grow with the number of nodes (build once, run many; docs/DESIGN.md section 4).

A count, unlike a host-time measurement, is exact and does not depend on the machine's
load, so a test can assert on it; benchmarks/runtime_overhead.py prints it next to the
times.
"""
from __future__ import annotations

import sys
from typing import Callable


def count_calls(fn: Callable[[], object]) -> int:
    """Function calls, Python and C (builtins, cffi), that the calling thread makes
    while running ``fn()``, counted with ``sys.setprofile``. Calls made by other
    threads (a driver's worker threads) are not counted. Any profile function already
    installed is replaced for the duration and restored afterwards; an exception from
    ``fn`` propagates."""
    calls = 0

    def profiler(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return calls
