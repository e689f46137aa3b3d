""".pte files made by ExecuTorch 1.5.1 itself, for the interop tests.

ExecuTorch lives in its own virtual environment (``make et-venv`` makes ``.venv-et``;
``VKDELEGATE_ET_PYTHON`` names another Python that has it). ``pte_dir`` runs
tests/data/pte/generate.py there once per session and returns the folder of .pte and
.npz files. Without that Python the tests skip, except under CI (``CI`` set), where
.ci/run builds .venv-et first and a missing one is a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tests" / "data" / "pte" / "generate.py"
#: The models generate.py makes (kept in step with its MODELS by test_generator_models).
MODELS = ("cnn_block", "mlp", "reduce_softmax", "elementwise", "multi_output",
          "embedding", "index_select", "dynamic_batch", "cpu_kernel")


def et_python() -> "str | None":
    """The Python with executorch 1.5.1, or None."""
    given = os.environ.get("VKDELEGATE_ET_PYTHON")
    if given:
        return given
    default = ROOT / ".venv-et" / "bin" / "python"
    return str(default) if default.exists() else None


def need_et_python() -> str:
    python = et_python()
    if python is None:
        reason = ("no ExecuTorch environment (.venv-et): run `make et-venv` or set "
                  "VKDELEGATE_ET_PYTHON")
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the .pte interop tests")
        pytest.skip(reason)
    return python


@pytest.fixture(scope="session")
def pte_dir(tmp_path_factory) -> Path:
    python = need_et_python()
    out = tmp_path_factory.mktemp("pte")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([python, str(GENERATOR), str(out)], capture_output=True,
                          text=True, env=env, timeout=1200)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        pytest.fail(f"generate.py failed ({done.returncode}): {done.stderr[-600:]}")
    return out
