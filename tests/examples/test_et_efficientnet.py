"""EfficientNet-Lite0 lowered by ExecuTorch 1.5.1's own VulkanPartitioner (in .venv-et)
to a .pte, run here through ``vkdelegate run``: the cat photo gets eager's top-5."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from vkdelegate.cli import main
from tests.program.pte_fixtures import ROOT, need_et_python
from tests.vulkan_skip import vulkan_unavailable

model_zoo = pytest.importorskip(
    "vkdelegate.examples.efficientnet_lite", reason="needs the examples extra")
pytest.importorskip("efficientnet_lite_pytorch", reason="needs the examples extra")

SCRIPT = ROOT / "tests" / "data" / "pte" / "efficientnet_lite.py"


@pytest.mark.slow
def test_et_lowered_efficientnet_classifies_the_cat_like_eager(tmp_path, monkeypatch):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    monkeypatch.setenv("VKDELEGATE_ET_PYTHON", need_et_python())
    pte, x_path = tmp_path / "efficientnet_lite0.pte", tmp_path / "cat.npy"
    subprocess.run([sys.executable, str(SCRIPT), str(pte), str(x_path)], check=True,
                   timeout=1800)
    assert main(["run", str(pte), "--input", f"arg0={x_path}",
                 "--output-dir", str(tmp_path / "out")]) == 0
    ours = np.load(tmp_path / "out" / "output_0.npy")
    with torch.no_grad():
        eager = model_zoo.load_model()(torch.from_numpy(np.load(x_path))).numpy()
    assert ours.shape == eager.shape == (1, 1000)
    assert float(np.abs(ours - eager).max()) <= 1e-3
    ours_top = [i for i, _ in model_zoo.top_k(ours)]
    assert ours_top == [i for i, _ in model_zoo.top_k(eager)]
    assert model_zoo.labels()[ours_top[0]] == "Egyptian cat"
