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


def test_outputs_of_an_earlier_run_are_named_not_deleted(saved, capsys):
    """output_*.npy files this run did not write (a None output now, another program's
    outputs) stay, and the run says which they are."""
    d, expected = saved
    out = d / "out"
    out.mkdir()
    np.save(out / "output_old.npy", np.zeros(2))
    np.save(out / "output_sum.npy", np.zeros(2))  # overwritten by this run
    (out / "notes.txt").write_text("mine")
    assert main(["run", str(d / "p.vkp"), "--input", f"x={d / 'x.npy'}", "--input",
                 f"y={d / 'y.npy'}", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"note: {out} also holds output_old.npy: not written by this run" in printed
    assert (out / "output_old.npy").exists() and (out / "notes.txt").read_text() == "mine"
    np.testing.assert_allclose(np.load(out / "output_sum.npy"), expected["sum"].numpy(),
                               rtol=1e-4, atol=1e-4)


class NonTensorOutputs(torch.nn.Module):
    def forward(self, x):
        return {"y": x + 1, "n": None, "k": 7, "f": 3.5}


def test_run_skips_none_and_writes_numbers(tmp_path, capsys):
    """A None output is not written (np.save made a pickled object array that np.load
    refuses); a Python number is a numeric 0-d array."""
    x = torch.randn(3, generator=torch.Generator().manual_seed(4))
    ep = torch.export.export(NonTensorOutputs(), (x,))
    to_backend(ep, VulkanPartitioner({"executor": "reference"})).save(tmp_path / "p.vkp")
    np.save(tmp_path / "x.npy", x.numpy())
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "p.vkp"), "--input", f"x={tmp_path / 'x.npy'}",
                 "--output-dir", str(out)]) == 0
    assert "n: None (not written)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["output_f.npy", "output_k.npy",
                                                     "output_y.npy"]
    np.testing.assert_allclose(np.load(out / "output_y.npy"), (x + 1).numpy(), rtol=1e-6)
    k, f = np.load(out / "output_k.npy"), np.load(out / "output_f.npy")
    assert k.shape == () and k.dtype == np.int64 and k == 7
    assert f.shape == () and f.dtype == np.float64 and f == 3.5


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
    # relu(x + y) and tanh(s) - y are fused elementwise chains (passes/fuse_elementwise)
    fused = "vkdelegate.fused_elementwise.default"
    assert fused in out and "GPU us" in out
    events = json.loads((d / "trace.json").read_text())["traceEvents"]
    assert {e["name"] for e in events} >= {fused}
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
    assert err == f"vkdelegate run: error: --output-dir {blocker}: is a file, not a folder\n"
    assert main(["run", str(d / "p.vkp"), *inputs, "--output-dir", str(d / "out"),
                 "--trace", str(d / "missing" / "t.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not list((d / "out").glob("output_*.npy"))
    # A folder that cannot be made names the flag (was "[Errno 2] ...: 'path'").
    assert main(["run", str(d / "p.vkp"), *inputs, "--output-dir",
                 str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vkdelegate run: error: --output-dir {blocker / 'sub'}: cannot "
                          f"create it") and err.count("\n") == 1, err


def _profile(tmp_path, capsys, module, inputs, dynamic_shapes=None, run_inputs=None):
    """Save ``module`` lowered for Vulkan, run it with --profile --trace; return the
    printed text and the trace events."""
    if _vulkan_available():
        pytest.skip(_vulkan_available())
    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    to_backend(ep, VulkanPartitioner({"executor": "vulkan"})).save(tmp_path / "p.vkp")
    argv = ["run", str(tmp_path / "p.vkp"), "--output-dir", str(tmp_path), "--profile",
            "--trace", str(tmp_path / "t.json")]
    for i, x in enumerate(run_inputs or inputs):
        np.save(tmp_path / f"in{i}.npy", x.numpy())
        argv += ["--input", f"{ep.graph_signature.user_inputs[i]}={tmp_path / f'in{i}.npy'}"]
    capsys.readouterr()
    assert main(argv) == 0
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    return capsys.readouterr().out, events


class AddRelu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x + 1)


def test_profile_shows_this_runs_shapes(tmp_path, capsys):
    # Exported for n <= 16, run with n = 3: the table shows 3x4, not the bound 16x4.
    torch.manual_seed(0)
    n = torch.export.Dim("n", max=16)
    out, _ = _profile(tmp_path, capsys, AddRelu(), (torch.randn(5, 4),),
                      dynamic_shapes={"x": {0: n}}, run_inputs=(torch.randn(3, 4),))
    relu = next(line for line in out.splitlines() if "fused_elementwise" in line)
    assert "3x4 3x4" in relu  # relu(x + 1), one fused chain
    assert "16x4" not in out and "tensor shapes (output last)" in out


class Pool(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.max_pool2d(x, 2, return_indices=True)


def test_profile_lists_every_output_of_a_multi_output_op(tmp_path, capsys):
    torch.manual_seed(0)
    out, _ = _profile(tmp_path, capsys, Pool(), (torch.randn(1, 2, 6, 8),))
    pool = next(line for line in out.splitlines() if "max_pool2d" in line)
    # input, then the ValueList output's values and indices
    assert "1x2x6x8" in pool and pool.count("1x2x3x4") == 2


class SortBetween(torch.nn.Module):
    def forward(self, x):
        return torch.relu(torch.sort(torch.relu(x) * 2)[0])


def test_trace_shows_delegates_in_sequence(tmp_path, capsys):
    # aten.sort runs on the CPU: two delegates, the second's events after the first's.
    torch.manual_seed(0)
    out, events = _profile(tmp_path, capsys, SortBetween(), (torch.randn(4, 8),))
    by_tid = {}
    for e in events:
        by_tid.setdefault(e["tid"], []).append(e)
    assert sorted(by_tid) == [0, 1]
    first_end = max(e["ts"] + e["dur"] for e in by_tid[0])
    assert first_end > 0
    assert min(e["ts"] for e in by_tid[1]) >= first_end


def test_negative_device_is_an_argument_error(saved, capsys):
    d, _ = saved
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(d / "p.vkp"), "--device", "-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device: device index must be >= 0, got -1" in err
    assert "compile option" not in err


@pytest.mark.parametrize("content,text", [
    (b"not an array at all", "is not a .npy array file (write one with numpy.save)"),
    (None, "holds Python objects, which are refused (give a numeric array)"),
])
def test_input_that_is_not_a_npy_array(saved, capsys, content, text):
    d, _ = saved
    bad = d / "bad.bin"
    if content is None:
        np.save(bad, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
        bad = d / "bad.bin.npy"
    else:
        bad.write_bytes(content)
    assert main(["run", str(d / "p.vkp"), "--input", f"x={bad}", "--input",
                 f"y={d / 'y.npy'}", "--output-dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert err == f"vkdelegate run: error: input 'x': {bad} {text}\n"
    assert "allow_pickle" not in err
