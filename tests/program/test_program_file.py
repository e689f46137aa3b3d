"""Program files: save -> load in a fresh process, torch-free loading, dedup, and
refusal of corrupted or crafted files."""
import json
import re
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from vkdelegate.serialization import program_file

from .conftest import _vulkan_available

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Mixed(torch.nn.Module):
    """Vulkan (add, relu, tanh), CPU (sort), a parameter and mutable state."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6))
        self.register_buffer("calls", torch.zeros(6))

    def forward(self, x):
        self.calls.add_(1.0)
        y = torch.relu(x + self.w)
        z = torch.sort(y, dim=-1)[0]
        return {"sorted": torch.tanh(z) + self.calls, "y": y}


class Elementwise(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x - y) + torch.tanh(x), x


def _program(executor, module=None, inputs=None):
    torch.manual_seed(0)
    module = module or Mixed()
    inputs = inputs or (torch.randn(4, 6),)
    ep = torch.export.export(module, inputs)
    return module, to_backend(ep, VulkanPartitioner({"executor": executor})), inputs


def _run_python(code: str, *args, block_torch=False):
    prelude = "import sys\nsys.modules['torch'] = None\n" if block_torch else ""
    # Keep a PYTHONPATH the environment already has (where the GPU machine's vulkan
    # bindings are installed), with this checkout first.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_save_load_in_subprocess(tmp_path, executor):
    module, program, (x,) = _program(executor)
    path = tmp_path / "mixed.vkp"
    program.save(path)
    np.save(tmp_path / "x.npy", x.numpy())
    result = _run_python("""
        import sys, numpy as np, torch, vkdelegate
        p = vkdelegate.load(sys.argv[1])
        x = torch.from_numpy(np.load(sys.argv[2]))
        p(x)
        out = p(x)          # the state advances between calls, as in eager
        np.save(sys.argv[3], out["sorted"].numpy()); np.save(sys.argv[4], out["y"].numpy())
        print(p.report)
        """, str(path), str(tmp_path / "x.npy"), str(tmp_path / "s.npy"),
        str(tmp_path / "y.npy"))
    assert result.returncode == 0, result.stderr
    module(x)
    expected = module(x)
    assert "sort" in result.stdout  # the report travels with the program
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"),
                               expected["sorted"].detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                               expected["y"].detach().numpy(), rtol=1e-4, atol=1e-4)


def test_fully_delegated_runs_without_torch(tmp_path):
    # Vulkan only: the reference executor itself uses torch.
    reason = _vulkan_available()
    if reason:
        pytest.skip(reason)
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2, max=32)
    ep = torch.export.export(Elementwise(), (torch.randn(3, 5), torch.randn(3, 5)),
                             dynamic_shapes=({0: batch}, {0: batch}))
    program = to_backend(ep, VulkanPartitioner())
    assert all(n.on_vulkan for n in program.report.decisions)
    path = tmp_path / "full.vkp"
    program.save(path)
    sizes = (3, 29)
    inputs = {n: (torch.randn(n, 5), torch.randn(n, 5)) for n in sizes}
    for n, (a, b) in inputs.items():
        np.save(tmp_path / f"a{n}.npy", a.numpy())
        np.save(tmp_path / f"b{n}.npy", b.numpy())
    result = _run_python("""
        import sys, numpy as np, vkdelegate
        try:
            import torch
            raise SystemExit("torch should not be importable here")
        except ImportError:
            pass
        d = sys.argv[2]
        p = vkdelegate.load(sys.argv[1])
        for n in (3, 29):
            a, b = np.load(f"{d}/a{n}.npy"), np.load(f"{d}/b{n}.npy")
            out, same = p(a, b)
            assert isinstance(out, np.ndarray) and same is a, (type(out), type(same))
            np.save(f"{d}/out{n}.npy", out)
        try:
            p(np.zeros((33, 5), np.float32), np.zeros((33, 5), np.float32))
        except vkdelegate.VkDelegateError as e:
            print(e)
        """, str(path), str(tmp_path), block_torch=True)
    assert result.returncode == 0, result.stderr
    assert "input 'x' dim 0 is 33, allowed range 2..32" in result.stdout
    for n, (a, b) in inputs.items():
        np.testing.assert_allclose(np.load(tmp_path / f"out{n}.npy"),
                                   Elementwise()(a, b)[0].numpy(), rtol=1e-4, atol=1e-4)


def test_cpu_parts_without_torch_name_the_op(tmp_path):
    _, program, _ = _program("vulkan")
    program.save(tmp_path / "mixed.vkp")
    result = _run_python("""
        import sys, vkdelegate
        try:
            vkdelegate.load(sys.argv[1])
        except vkdelegate.VkDelegateError as e:
            print(e)
        """, str(tmp_path / "mixed.vkp"), block_torch=True)
    assert result.returncode == 0, result.stderr
    assert "runs aten.sort.default on the CPU, which needs torch" in result.stdout


def test_constants_and_blobs_stored_once(tmp_path):
    class Shared(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.w = torch.nn.Parameter(w)

        def forward(self, x):
            return torch.sort(x * self.w)[0] + self.w

    torch.manual_seed(0)
    w = torch.randn(64, 64)
    x = torch.randn(64, 64)
    eps = {name: torch.export.export(Shared(w.clone()), (x,)) for name in ("a", "b")}
    program = to_backend(eps, VulkanPartitioner({"executor": "reference"}))
    path = tmp_path / "shared.vkp"
    program.save(path)
    manifest, segments = program_file.read_program(path)
    digests = [s["sha256"] for s in manifest["segments"]]
    assert len(digests) == len(set(digests))
    weight_bytes = w.numpy().tobytes()
    assert sum(bytes(s) == weight_bytes for s in segments) == 1
    assert os.path.getsize(path) < 2 * len(weight_bytes)
    loaded = vkdelegate.load(path)
    torch.testing.assert_close(loaded.a(x), loaded.run("b", x))
    torch.testing.assert_close(loaded.b(x), Shared(w)(x).detach())


def _saved(tmp_path):
    _, program, _ = _program("reference")
    path = tmp_path / "p.vkp"
    program.save(path)
    return path


def _rewrite(path, edit):
    manifest, segments = program_file.read_program(path)
    manifest = edit(manifest) or manifest
    program_file.write_program(path, manifest, [bytes(s) for s in segments])


@pytest.mark.parametrize("where", ["manifest", "data", "header", "reserved", "padding",
                                   "last"])
def test_flipped_byte_is_refused(tmp_path, where):
    path = _saved(tmp_path)
    raw = bytearray(path.read_bytes())
    manifest, segments = program_file.read_program(path)
    # reserved: bytes 48..64 of the header, zero in every file we write (a flip there
    # loaded until a new user's trial); padding: the zeros after the manifest (to the
    # 64-byte aligned data section) and last: the file's last byte, the last
    # segment's alignment padding (a flip in either loaded until a later trial).
    m_size = program_file.HEADER.unpack_from(raw)[4]
    assert len(segments[-1]) % 64, "the last segment must end before its padding"
    offset = {"header": 20, "manifest": 100, "data": len(raw) - 100, "reserved": 57,
              "padding": program_file.HEADER_SIZE + m_size, "last": len(raw) - 1}[where]
    assert where in ("header", "manifest", "data") or raw[offset] == 0
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(VkDelegateError, match="corrupt|checksum|truncated"):
        vkdelegate.load(path)


def test_appended_bytes_are_refused(tmp_path):
    path = _saved(tmp_path)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(VkDelegateError, match=r"has 1 byte after its data section"):
        vkdelegate.load(path)


def test_truncated_file_is_refused(tmp_path):
    path = _saved(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(VkDelegateError, match="truncated"):
        vkdelegate.load(path)


def test_corrupt_header_and_empty_file_messages(tmp_path):
    # A header field out of range names the field it read, not only the file's size;
    # an empty file says so.
    from vkdelegate.serialization import program_file as pf

    path = _saved(tmp_path)
    raw = bytearray(path.read_bytes())
    fields = list(pf.HEADER.unpack_from(raw))
    fields[3] = len(raw) + 100  # the manifest's offset, past the end
    pf.HEADER.pack_into(raw, 0, *fields)
    path.write_bytes(bytes(raw))
    with pytest.raises(VkDelegateError, match=rf"corrupt header \(file size {len(raw)}; "
                       rf"the header says: .*manifest ends at {len(raw) + 100 + fields[4]}"):
        vkdelegate.load(path)
    empty = tmp_path / "empty.vkdp"
    empty.write_bytes(b"")
    with pytest.raises(VkDelegateError, match=r"empty.vkdp is empty \(0 bytes\)"):
        vkdelegate.load(empty)


def test_pickle_and_torch_save_files_are_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(VkDelegateError, match="bad magic.*looks like a pickle"):
        vkdelegate.load(tmp_path / "evil.pkl")
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    with pytest.raises(VkDelegateError, match="bad magic.*zip"):
        vkdelegate.load(tmp_path / "model.pt")
    assert not marker.exists()


def test_pickle_payload_inside_a_valid_file_is_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = _saved(tmp_path)
    manifest, segments = program_file.read_program(path)
    segments = [bytes(s) for s in segments] + [pickle.dumps(Payload())]
    (name, ref), = manifest["methods"]["forward"]["state"].items()
    for dtype in ("object", "float32"):  # object dtype refused; float32: wrong size
        manifest["methods"]["forward"]["state"][name] = dict(
            ref, segment=len(segments) - 1, dtype=dtype)
        program_file.write_program(path, manifest, segments)
        with pytest.raises(VkDelegateError, match="not allowed|do not hold"):
            vkdelegate.load(path)
    assert not marker.exists()


def test_an_option_of_a_newer_version_is_named_as_such(tmp_path):
    path = _saved(tmp_path)
    _rewrite(path, lambda m: m["options"].update(warp_drive=True))
    with pytest.raises(VkDelegateError, match=r"compile option 'warp_drive' is not known "
                                              r"to vkdelegate .* \(a file written by a "
                                              r"newer version\?\); known options: "):
        vkdelegate.load(path)


@pytest.mark.parametrize("op", ["builtins.eval", "os.system", "aten.__init__.x",
                                "aten.not_an_op.default", "operator.attrgetter"])
def test_crafted_glue_op_is_refused(tmp_path, op):
    path = _saved(tmp_path)

    def edit(manifest):
        manifest["methods"]["forward"]["plan"]["nodes"][0]["op"] = op

    _rewrite(path, edit)
    with pytest.raises(VkDelegateError, match=rf"method 'forward': node 0 calls "
                       rf"{re.escape(op)}, which a program's CPU part may not call"):
        vkdelegate.load(path)


@pytest.mark.parametrize("edit,text", [
    (lambda m: m["methods"]["forward"]["plan"]["nodes"][0].update(args=[{"v": "nope"}]),
     "reads 'nope' before it is defined"),
    (lambda m: m["methods"]["forward"]["delegates"][0].update(blob=999), "malformed"),
    (lambda m: m.update(methods=[]), "malformed"),
    (lambda m: m["methods"]["forward"]["plan"].update(out_spec={"t": "set"}),
     "malformed tree spec"),
    (lambda m: m["methods"]["forward"].update(report={"decisions": 3}),
     "malformed partition report"),
])
def test_crafted_manifest_is_refused(tmp_path, edit, text):
    path = _saved(tmp_path)
    _rewrite(path, edit)
    with pytest.raises(VkDelegateError, match=text):
        vkdelegate.load(path)


def test_newer_format_version_is_refused(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    manifest, segments = program_file.read_program(path)
    monkeypatch.setattr(program_file, "FORMAT_VERSION", 7)
    program_file.write_program(path, manifest, [bytes(s) for s in segments])
    monkeypatch.undo()
    with pytest.raises(VkDelegateError, match="format version 7 is not supported"):
        vkdelegate.load(path)


def test_not_a_file(tmp_path):
    with pytest.raises(VkDelegateError, match="cannot read program file"):
        vkdelegate.load(tmp_path / "missing.vkp")
    (tmp_path / "junk").write_bytes(b"VKDPROG1" + bytes(10))
    with pytest.raises(VkDelegateError, match="truncated|corrupt"):
        vkdelegate.load(tmp_path / "junk")


def test_list_delegate_blobs_for_inspect(tmp_path):
    _, program, _ = _program("reference")
    path = tmp_path / "p.vkp"
    program.save(path)
    listed = program_file.list_delegate_blobs(path)
    delegates = program.methods["forward"].delegates
    assert [label for label, _, _ in listed] == [
        f"{path} method 'forward' delegate {i}" for i in range(len(delegates))]
    for (_, blob, named), d in zip(listed, delegates):
        assert blob == d.blob and named == d.named_data
    from vkdelegate.cli import main

    assert main(["inspect", str(path)]) == 0


def test_inspect_shows_dynamic_dims_as_ranges(tmp_path, capsys):
    """Blob dims are upper bounds; inspect's method lines give each input's range."""
    from torch.export import Dim
    from vkdelegate.cli import main

    ep = torch.export.export(torch.nn.Linear(8, 4), (torch.randn(3, 8),),
                             dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    to_backend(ep, VulkanPartitioner({"executor": "reference"})).save(tmp_path / "d.vkp")
    assert main(["inspect", str(tmp_path / "d.vkp")]) == 0
    assert "forward(input: float32[1..64, 8])" in capsys.readouterr().out
    assert main(["inspect", "--json", str(tmp_path / "d.vkp")]) == 0
    assert json.loads(capsys.readouterr().out)["methods"] == [
        "forward(input: float32[1..64, 8])"]


def test_inspect_shows_what_runs_on_the_cpu(tmp_path, capsys):
    """The partition report a program file stores: inspect prints each method's, the
    CPU nodes with their reasons (text and --json)."""
    from vkdelegate.cli import main

    _, program, _ = _program("reference")
    program.save(tmp_path / "p.vkp")
    assert main(["inspect", str(tmp_path / "p.vkp")]) == 0
    out = capsys.readouterr().out
    assert "== partition report (forward)" in out and program.report.summary() in out
    assert "no Vulkan implementation of aten.sort.default" in out
    assert main(["inspect", "--json", str(tmp_path / "p.vkp")]) == 0
    reports = json.loads(capsys.readouterr().out)["reports"]
    assert reports["forward"]["summary"] == program.report.summary()
    assert [n["op"] for n in reports["forward"]["cpu_nodes"]] == [
        "aten.sort.default", "operator.getitem"]


def test_report_round_trip(tmp_path):
    _, program, _ = _program("reference")
    program.save(tmp_path / "p.vkp")
    loaded = vkdelegate.load(tmp_path / "p.vkp")
    assert loaded.report == program.report
    assert str(loaded.report) == str(program.report)
    assert [d.op for d in loaded.report.cpu_nodes] == ["aten.sort.default",
                                                       "operator.getitem"]


@pytest.mark.parametrize("path", [42, None, 3.5])
def test_path_must_be_a_path(path):
    # open(42) would read file descriptor 42; a load of a non-path is refused instead.
    with pytest.raises(VkDelegateError, match=f"must be a str or os.PathLike, got "
                                              f"{type(path).__name__}"):
        vkdelegate.load(path)
    with pytest.raises(VkDelegateError, match="must be a str or os.PathLike"):
        program_file.read_program(path)


def test_failed_save_keeps_the_file_that_was_there(tmp_path, monkeypatch):
    """save writes a temporary file and renames it over the target: a write that fails
    (here the rename, as a full disk would fail a write) leaves the old program file
    whole and no temporary behind; a missing folder or a directory is one clear error."""
    _, program, inputs = _program("reference")
    path = tmp_path / "p.vkp"
    program.save(path)
    before = path.read_bytes()

    def no_space(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(program_file.os, "replace", no_space)
    with pytest.raises(VkDelegateError, match=r"cannot save the program to .*p\.vkp: "
                                              r"No space left on device"):
        program.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["p.vkp"]
    with pytest.raises(VkDelegateError, match="folder .* does not exist"):
        program.save(tmp_path / "missing" / "p.vkp")
    with pytest.raises(VkDelegateError, match="it is a directory"):
        program.save(tmp_path)
    loaded = vkdelegate.load(path)
    torch.testing.assert_close(loaded(*inputs), program(*inputs))
    # A file that is not a program (a model's weights, notes) is never overwritten; an
    # empty one or an older program file is.
    notes = tmp_path / "weights.safetensors"
    notes.write_bytes(b"\x08\x00\x00\x00{}weights")
    with pytest.raises(VkDelegateError, match=r"weights\.safetensors: that file exists "
                                              r"and is not a vkdelegate program file"):
        program.save(notes)
    assert notes.read_bytes() == b"\x08\x00\x00\x00{}weights"
    empty = tmp_path / "empty.vkp"
    empty.write_bytes(b"")
    program.save(empty)
    program.save(path)  # over a program file
    assert vkdelegate.load(empty) is not None
