"""EfficientNet-Lite0 lowered by ExecuTorch 1.5.1's VulkanPartitioner to a .pte.

Two halves, because the model packages (the ``examples`` extra) live in vkdelegate's
environment and ExecuTorch in its own (``.venv-et``), and neither may be installed
into the other:

- in vkdelegate's Python, ``efficientnet_lite.py OUT.pte [INPUT.npy]`` loads the model
  (vkdelegate.examples.efficientnet_lite), saves its state dict to a temporary file,
  runs this script in ExecuTorch's Python (``VKDELEGATE_ET_PYTHON`` or ``.venv-et``) and,
  given INPUT.npy, saves the pre-processed cat photo (skimage's ``chelsea``) there;
- in ExecuTorch's Python, ``efficientnet_lite.py --lower PACKAGE_DIR STATE.pt OUT.pte``
  puts the pure-Python ``efficientnet_lite_pytorch`` package folder on ``sys.path``,
  rebuilds the model from its name and the state dict, lowers it and checks the file
  with ExecuTorch's own reader (one plan, VulkanBackend delegates only).

``make et-efficientnet`` then runs ``vkdelegate run`` on it and prints the top-5
(tests/examples/test_et_efficientnet.py checks they are eager's).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def lower(package_dir: str, state_path: str, out: str) -> None:
    """(ExecuTorch's Python) Write the .pte of the model with the saved weights."""
    import torch

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.path.insert(0, str(Path(package_dir).parent))
    from efficientnet_lite_pytorch import EfficientNet
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._serialize._program import deserialize_pte_binary

    model = EfficientNet.from_name("efficientnet-lite0")
    model.load_state_dict(torch.load(state_path, weights_only=True))
    ep = torch.export.export(model.eval(), (torch.zeros(1, 3, 224, 224),))
    edge = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()])
    data = edge.to_executorch().buffer
    plan = deserialize_pte_binary(data).program.execution_plan[0]
    assert {d.id for d in plan.delegates} == {"VulkanBackend"}, plan.delegates
    Path(out).write_bytes(data)
    print(f"{out}: {len(data)} bytes, {len(plan.delegates)} VulkanBackend delegate(s)")


def et_python() -> str:
    given = os.environ.get("VKDELEGATE_ET_PYTHON")
    python = given or str(ROOT / ".venv-et" / "bin" / "python")
    if not Path(python).exists():
        sys.exit(f"no ExecuTorch Python at {python}: run `make et-venv`")
    return python


def make(out: str, input_path: "str | None" = None) -> None:
    """(vkdelegate's Python) Lower through ExecuTorch's Python; save the cat input."""
    import numpy as np
    import torch
    import efficientnet_lite_pytorch

    sys.path.insert(0, str(ROOT))
    from vkdelegate.examples import efficientnet_lite as zoo

    model = zoo.load_model()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.pt"
        torch.save(model.state_dict(), state)
        package = Path(efficientnet_lite_pytorch.__file__).parent
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run([et_python(), __file__, "--lower", str(package), str(state), out],
                       check=True, env=env)
    if input_path:
        np.save(input_path, zoo.preprocess(zoo.load_image()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--lower"]:
        lower(*sys.argv[2:5])
    else:
        make(*sys.argv[1:3])
