#!/usr/bin/env bash
# Creates .venv-et: a virtual environment of its own for ExecuTorch 1.5.1 (it cannot
# share .venv: executorch pins torchao and other packages of its own). Used to make
# .pte files and ET-VK blobs for the interop tests (tests/program/test_pte_*.py) and by
# CI (.ci/run), which builds it only when it is missing.
#
# torch is pinned to the same 2.13.0 CPU build as requirements.txt: an unpinned torch
# would let pip pull a multi-GB CUDA build. The script fails if executorch's resolution
# would replace that torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${ET_VENV:-.venv-et}
TORCH_PIN="torch==2.13.0"
ET_PIN="executorch==1.5.1"

if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.installed" ]; then
  echo "$VENV exists (rm -r $VENV to rebuild)"
  exit 0
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "$TORCH_PIN"
# The torch pin is repeated so that pip refuses (instead of swapping torch) if
# executorch asked for another one.
"$PY" -m pip install -q "$ET_PIN" "$TORCH_PIN"
"$PY" -m pip install -q 'numpy>=1.26' 'flatbuffers>=24.3.25' 'vulkan==1.3.275.1' \
  'tqdm>=4.66' 'tabulate>=0.9' 'pytest>=8' "$TORCH_PIN"
"$PY" -m pip install -q --no-deps -e .
"$PY" - <<'PYEOF'
import torch, executorch, vkdelegate
assert torch.__version__.startswith("2.13.0"), torch.__version__
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner  # noqa: F401
print("torch", torch.__version__, "| vkdelegate", vkdelegate.__file__)
PYEOF
touch "$VENV/.installed"
