"""The other direction: vkdelegate's VkDelegateETPartitioner inside ExecuTorch 1.5.1's
``to_edge_transform_and_lower`` (run in .venv-et by tests/data/pte/et_partitioner_lower.py,
which also reads every file back with ExecuTorch's deserialize_pte_binary and ET-VK's
blob deserializer); the .pte files then load and run here like eager."""
import ast
import os
import subprocess
import sys

import numpy as np
import pytest

import vkdelegate

from .pte_fixtures import ROOT, need_et_python
from .test_pte import _calls
from tests.vulkan_skip import vulkan_unavailable

SCRIPT = ROOT / "tests" / "data" / "pte" / "et_partitioner_lower.py"
NAMES = ("cnn_block", "mlp", "hardswish", "embedding", "multi_output", "cpu_kernel")


@pytest.fixture(scope="module")
def lowered_dir(tmp_path_factory):
    python = need_et_python()
    out = tmp_path_factory.mktemp("et_partitioner")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([python, str(SCRIPT), str(out)], capture_output=True,
                          text=True, env=env, timeout=1200)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        pytest.fail(f"et_partitioner_lower.py failed: {done.stderr[-800:]}")
    return out


def test_script_names_match():
    tree = ast.parse(SCRIPT.read_text())
    found = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
             and getattr(n.targets[0], "id", None) == "NAMES"]
    assert found == [NAMES]


def test_importing_without_executorch_is_a_clear_import_error():
    try:
        import executorch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="executorch"):
            import vkdelegate.backend.et_partitioner  # noqa: F401
    else:
        pytest.skip("executorch is installed in this environment")


@pytest.mark.parametrize("name", NAMES)
def test_et_lowered_with_our_partitioner_runs_here(lowered_dir, name):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    program = vkdelegate.load(lowered_dir / f"{name}.pte")
    runner = program.runner("forward")
    for ins, want in _calls(lowered_dir / f"{name}.npz"):
        got = runner.call_flat(list(ins))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)
    program.close()
