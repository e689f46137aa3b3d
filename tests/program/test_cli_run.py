"""``vkdelegate run``: outputs as .npy, named input errors, profile and trace."""
import json

import numpy as np
import pytest
import torch

from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.cli import main

from .conftest import _vulkan_available


class TwoOut(torch.nn.Module):
    def forward(self, x, y):
        s = torch.relu(x + y)
        return {"sum": s, "rest": (torch.tanh(s) - y, torch.sort(x)[0])}


def _save(tmp_path, executor):
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    ep = torch.export.export(TwoOut(), (x, y))
    to_backend(ep, VulkanPartitioner({"executor": executor})).save(tmp_path / "p.vkp")
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    return tmp_path, TwoOut()(x, y)


@pytest.fixture
def saved(tmp_path, executor):
    return _save(tmp_path, executor)


def test_run_writes_outputs(saved):
    d, expected = saved
    rc = main(["run", str(d / "p.vkp"), "--input", f"x={d / 'x.npy'}", "--input",
               f"y={d / 'y.npy'}", "--output-dir", str(d / "out")])
    assert rc == 0
    for name, want in [("sum", expected["sum"]), ("rest.0", expected["rest"][0]),
                       ("rest.1", expected["rest"][1])]:
        np.testing.assert_allclose(np.load(d / "out" / f"output_{name}.npy"), want.numpy(),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("inputs,text", [
    (["x=X"], "missing input 'y' (float32[3, 4]); give --input y=FILE.npy"),
    (["x=X", "y=X", "z=X"], "unknown input 'z'; the method takes input(s) 'x', 'y'"),
    (["x=X", "y=BAD"], "input 'y' dim 0 is 2, expected 3, a static size (input 'y' is "
                       "float32[3, 4])"),
    (["x=X", "y"], "--input 'y': expected NAME=FILE.npy"),
])
def test_input_errors_are_one_line(saved, capsys, inputs, text):
    d, _ = saved
    np.save(d / "bad.npy", np.zeros((2, 4), np.float32))
    args = [a.replace("=X", f"={d / 'x.npy'}").replace("=BAD", f"={d / 'bad.npy'}")
            for a in inputs]
    argv = ["run", str(d / "p.vkp"), "--output-dir", str(d)]
    for a in args:
        argv += ["--input", a]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"vkdelegate run: error: {text}\n"


def test_profile_and_trace(tmp_path, capsys):
    if _vulkan_available():
        pytest.skip(_vulkan_available())
    d, _ = _save(tmp_path, "vulkan")
    rc = main(["run", str(d / "p.vkp"), "--input", f"x={d / 'x.npy'}", "--input",
               f"y={d / 'y.npy'}", "--output-dir", str(d), "--profile", "--trace",
               str(d / "trace.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "aten.add.Tensor" in out and "GPU us" in out
    events = json.loads((d / "trace.json").read_text())["traceEvents"]
    assert {e["name"] for e in events} >= {"aten.add.Tensor", "aten.relu.default"}
    assert all(e["dur"] >= 0 for e in events)


def test_method_choice(tmp_path, capsys):
    class Neg(torch.nn.Module):
        def forward(self, x):
            return -torch.relu(x)

    x = torch.randn(5)
    eps = {"pos": torch.export.export(torch.nn.ReLU(), (x,)),
           "neg": torch.export.export(Neg(), (x,))}
    to_backend(eps, VulkanPartitioner({"executor": "reference"})).save(tmp_path / "m.vkp")
    np.save(tmp_path / "x.npy", x.numpy())
    base = ["run", str(tmp_path / "m.vkp"), "--output-dir", str(tmp_path)]
    assert main(base + ["--method", "neg", "--input", f"x={tmp_path / 'x.npy'}"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), Neg()(x).numpy())
    assert main(base + ["--input", f"input={tmp_path / 'x.npy'}"]) == 2
    assert capsys.readouterr().err == ("vkdelegate run: error: the program has methods "
                                       "pos, neg; choose one with --method\n")


def test_unwritable_paths_fail_before_running(saved, capsys):
    # An output folder that is a file, or a trace in a missing folder: one line, exit 2.
    d, _ = saved
    inputs = ["--input", f"x={d / 'x.npy'}", "--input", f"y={d / 'y.npy'}"]
    blocker = d / "file"
    blocker.write_text("")
    assert main(["run", str(d / "p.vkp"), *inputs, "--output-dir", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vkdelegate run: error: ") and err.count("\n") == 1
    assert main(["run", str(d / "p.vkp"), *inputs, "--output-dir", str(d / "out"),
                 "--trace", str(d / "missing" / "t.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not list((d / "out").glob("output_*.npy"))
