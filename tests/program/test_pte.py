"""ExecuTorch .pte files (made by ExecuTorch 1.5.1 in .venv-et) run here like eager."""
import numpy as np
import pytest
import torch

import vkdelegate
from vkdelegate import VkDelegateError
from vkdelegate.cli import main

from .conftest import _vulkan_available
from .pte_fixtures import GENERATOR, MODELS, PENDING, pte_dir  # noqa: F401

pytestmark = pytest.mark.skipif(_vulkan_available() is not None,
                                reason=str(_vulkan_available()))


def _calls(path):
    data = np.load(path)
    calls = sorted({int(k.split("_")[0][1:]) for k in data.files})
    for c in calls:
        ins = [data[f"c{c}_in{i}"] for i in range(sum(k.startswith(f"c{c}_in")
                                                      for k in data.files))]
        outs = [data[f"c{c}_out{j}"] for j in range(sum(k.startswith(f"c{c}_out")
                                                        for k in data.files))]
        yield ins, outs


def test_generator_models():
    text = GENERATOR.read_text()
    for name in MODELS:
        assert f'"{name}":' in text
    assert text.count('": (') == len(MODELS), "a MODELS entry is missing in pte_fixtures"


def test_at_least_30_models():
    assert len(MODELS) >= 30


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=PENDING[n]))
    if n in PENDING else n for n in MODELS])
def test_pte_matches_eager(pte_dir, name):
    program = vkdelegate.load(pte_dir / f"{name}.pte")
    runner = program.runner("forward")
    for ins, want in _calls(pte_dir / f"{name}.npz"):
        got = runner.call_flat(list(ins))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.dtype == w.dtype and g.shape == w.shape, (name, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)
    program.close()


def test_structure_and_torch_in_out(pte_dir):
    """Outputs come back in the module's structure; torch in gives torch out."""
    program = vkdelegate.load(pte_dir / "multi_output.pte")
    (ins, want), = _calls(pte_dir / "multi_output.npz")
    out, perm = program(torch.from_numpy(ins[0]))
    assert set(out) == {"relu", "cat"} and isinstance(perm, torch.Tensor)
    got = [out["relu"], out["cat"], perm]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-4)
    numpy_out, _ = program(ins[0])
    assert isinstance(numpy_out["relu"], np.ndarray)
    program.close()


def test_cpu_kernel_runs_through_the_allow_list(pte_dir):
    """cumsum stays an ExecuTorch KernelCall (aten::cumsum.out): it runs as the
    allowed functional aten.cumsum.default between the two delegates."""
    program = vkdelegate.load(pte_dir / "cpu_kernel.pte")
    ops = [n["op"] for n in program.methods["forward"].plan["nodes"]]
    assert "aten.cumsum.default" in ops and ops.count("delegate") == 2
    program.close()


def test_dynamic_input_over_its_bound(pte_dir):
    program = vkdelegate.load(pte_dir / "dynamic_batch.pte")
    with pytest.raises(VkDelegateError, match="dim 0 is 17"):
        program(np.zeros((17, 8), np.float32))
    program.close()


def test_other_backend_is_named(pte_dir, tmp_path):
    data = (pte_dir / "mlp.pte").read_bytes()
    assert data.count(b"VulkanBackend") == 1
    path = tmp_path / "other.pte"
    path.write_bytes(data.replace(b"VulkanBackend", b"OtherBackend1"))
    with pytest.raises(VkDelegateError, match="delegate 0 is for backend "
                                              "'OtherBackend1'; vkdelegate runs "
                                              "VulkanBackend delegates only"):
        vkdelegate.load(path)


@pytest.mark.parametrize("cut", [7, 40, 200, -100])
def test_truncated_pte(pte_dir, tmp_path, cut):
    data = (pte_dir / "cnn_block.pte").read_bytes()
    path = tmp_path / "cut.pte"
    path.write_bytes(data[:cut])
    with pytest.raises(VkDelegateError):
        vkdelegate.load(path).build()


def test_cli_run_and_inspect(pte_dir, tmp_path, capsys):
    (ins, want), = _calls(pte_dir / "mlp.npz")
    np.save(tmp_path / "x.npy", ins[0])
    pte = str(pte_dir / "mlp.pte")
    assert main(["run", pte, "--input", f"arg0={tmp_path / 'x.npy'}",
                 "--output-dir", str(tmp_path / "out")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output_0.npy"), want[0],
                               rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    assert main(["inspect", pte]) == 0
    text = capsys.readouterr().out
    assert "method 'forward' delegate 0" in text and "aten.linear" in text


def test_weights_are_named_data(pte_dir):
    """ET-VK puts constants in the .pte's NamedDataStore, keyed by the SHA-256 of their
    bytes; mlp's four weight and bias tensors come from there (outputs checked above)."""
    import hashlib

    from vkdelegate.serialization.pte_reader import read_pte

    named = read_pte((pte_dir / "mlp.pte").read_bytes()).named_data
    assert sorted(len(v) for v in named.values()) == [16, 128, 512, 2048]
    assert all(hashlib.sha256(v).hexdigest() == k for k, v in named.items())
