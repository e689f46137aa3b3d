#!/usr/bin/env bash
# Creates .venv-peers: the Vulkan peers a user would pick instead of vkdelegate, for
# benchmarks/lavapipe_peers.py, in a virtual environment of their own (they bring
# their own native runtimes and must not disturb .venv):
#   ncnn-Vulkan (PyPI ncnn) with pnnx (TorchScript -> ncnn converter), and
#   IREE-Vulkan (iree-base-compiler, iree-base-runtime, iree-turbine for torch.export).
# torch is pinned to the same 2.13.0 CPU build as requirements.txt (an unpinned torch
# pulls a multi-GB CUDA build); the peers' versions are pinned so numbers stay
# comparable between runs. Built only when missing (rm -r .venv-peers to rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${PEERS_VENV:-.venv-peers}
TORCH_PIN="torch==2.13.0"

if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.installed" ]; then
  echo "$VENV exists (rm -r $VENV to rebuild)"
  exit 0
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "$TORCH_PIN" 'numpy>=1.26' \
  ncnn==1.0.20261020 pnnx==20261020 \
  iree-base-compiler==3.13.0 iree-base-runtime==3.13.0 iree-turbine==3.9.0 "$TORCH_PIN"
"$PY" - <<'PYEOF'
import torch, ncnn, pnnx, iree.compiler, iree.runtime, iree.turbine.aot  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("torch", torch.__version__, "| ncnn", ncnn.__version__, "| Vulkan GPUs", ncnn.get_gpu_count())
PYEOF
touch "$VENV/.installed"
