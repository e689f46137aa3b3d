"""Test cases that need the Khronos validation layer off, run in a subprocess.

The suite runs under the validation layer, and the one it installs (Debian 12's
1.3.239) rejects the cooperative-matrix features, so devices created for tests run the
portable kernels (vkdelegate/runtime/device.py). A test module whose cases need those
features defines ``run_cases()``, which exits with NO_DEVICE when the device cannot run
the kernel (its last printed line says why) and prints "all cases passed" at the end,
and its test calls ``run_cases_unvalidated("tests.ops.<module>")``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The exit status of ``run_cases()`` when the device cannot run the kernel tested.
NO_DEVICE = 77


def run_cases_unvalidated(module: str, timeout_s: int = 1200) -> None:
    """Run ``module.run_cases()`` in a subprocess with VKDELEGATE_VALIDATION=0: skip
    the calling test with the subprocess's last line when it exits NO_DEVICE, else
    assert that it passed (its output's tail in the message when not)."""
    env = dict(os.environ, VKDELEGATE_VALIDATION="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", f"import {module} as t; t.run_cases()"],
                         cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout_s)
    if run.returncode == NO_DEVICE:
        pytest.skip(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "all cases passed" in run.stdout
