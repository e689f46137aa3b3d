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
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tests" / "data" / "pte" / "generate.py"
#: The models generate.py makes (kept in step with its MODELS by test_generator_models).
MODELS = ("cnn_block", "mlp", "reduce_softmax", "elementwise", "multi_output",
          "embedding", "index_select", "dynamic_batch", "cpu_kernel", "hardswish",
          "max_pool_indices", "transposed_conv", "depthwise_separable", "upsample_pad",
          "pool_variants", "layer_norm", "group_norm", "attention", "transformer_block",
          "dynamic_seq", "dynamic_linear", "gather", "argmax", "concat_split", "reductions", "comparisons",
          "unary_mix", "activations", "matmul_bmm", "movement", "log_softmax_div",
          "to_copy")
#: Models whose blobs use ops of a family not merged yet (xfail strict until it is).
PENDING: dict = {}


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
    """The folder of every model's .pte and .npz: made by ONE generate.py run per test
    session, shared by the pytest-xdist workers (the first one makes it, under a lock,
    the others wait and reuse it)."""
    python = need_et_python()
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this session
    out = root / "pte_models"
    with FileLock(str(root / "pte_models.lock")):
        if not (out / "done").exists():
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            done = subprocess.run([python, str(GENERATOR), str(out)], capture_output=True,
                                  text=True, env=env, timeout=1800)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-4000:])
                pytest.fail(f"generate.py failed ({done.returncode}): "
                            f"{done.stderr[-600:]}")
            (out / "done").write_text("ok")
    return out
