"""The fuzz targets: one callable per untrusted-input entry point.

Each target takes the fuzzer's bytes and drives one public entry point the way a user
would. A ``VkDelegateError`` (subclasses included) is the accepted answer to bad input
and is swallowed here, provided its message is one printable line (``check_message``;
else ``MessageTextError``: a string from the input echoed with its control
characters); anything else propagates to the harness (``fuzz.checks``), which reports
it as a finding. ``InspectOutputError`` is raised here when the CLI fails in a way
that is not one error line with exit status 2, or prints a line that is not printable.

- ``blob``: ``read_blob`` then ``vkdelegate.runtime.load_delegate`` with the named
  constants of every seed, then one ``execute`` on inputs of the declared shapes.
- ``program``: the bytes as a file, ``vkdelegate.load`` and one call of every method
  on inputs built from the method's declared input specs.
- ``inspect``: the bytes as a file, ``vkdelegate inspect FILE`` and ``--json``
  through the CLI's main in-process.

Every load uses ``FUZZ_LIMITS`` (tighter than the defaults), so an input that asks for
a legitimate but huge allocation is refused instead of being made.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
import zlib

import numpy as np

from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits

MiB = 1 << 20

#: Limits every target loads with: an input over them must be refused at load.
FUZZ_LIMITS = LoadLimits(max_device_bytes=256 * MiB, max_tensor_bytes=64 * MiB,
                         max_host_bytes=256 * MiB, max_nodes=5_000, max_values=50_000,
                         max_segments=1_000)

# Inputs the harness itself would have to allocate past this are skipped: the call
# would measure our allocation, not the library's.
_MAX_INPUT_ELEMENTS = 1 << 22


class InspectOutputError(AssertionError):
    """``vkdelegate inspect`` ended other than with status 0 or one error line + 2, or
    printed a line with a control character in it."""


class MessageTextError(AssertionError):
    """A VkDelegateError whose message is not one line of printable text (a string of
    the input echoed raw: the CLI would print it as several lines or garble the
    terminal); strings from a file go through ``vkdelegate.errors.printable``."""


def check_message(exc: VkDelegateError) -> None:
    """Return if the message of ``exc`` (the accepted answer to bad input) is one
    printable line; else raise MessageTextError with ``exc``'s traceback, so that the
    finding's signature is the frame that formed the message."""
    text = str(exc)
    if not text.isprintable():
        raise MessageTextError(f"{type(exc).__name__} message is not one printable "
                               f"line: {text[:300]!r}").with_traceback(
                                   exc.__traceback__) from exc


def _rng(data: bytes) -> np.random.Generator:
    # Inputs depend only on the fuzz input, so a saved finding replays the same way.
    return np.random.default_rng(zlib.crc32(data))


def _array(shape, dtype: str, rng: np.random.Generator):
    """Zeros or random values of ``dtype`` and ``shape``; None if the harness cannot
    (or should not) make such an array."""
    try:
        np_dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None
    if any(s < 0 for s in shape) or math.prod(shape) > _MAX_INPUT_ELEMENTS:
        return None
    if rng.integers(2) == 0:
        return np.zeros(shape, np_dtype)
    if np_dtype.kind == "f":
        return rng.standard_normal(shape).astype(np_dtype)
    if np_dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(np_dtype)
    return rng.integers(-5, 6, shape).astype(np_dtype)


class BlobTarget:
    """read_blob + load_delegate + one execute. named_data: the constant pool."""

    def __init__(self, named_data: dict[str, bytes]):
        self.named_data = named_data

    def __call__(self, data: bytes) -> None:
        from vkdelegate.runtime import load_delegate
        from vkdelegate.serialization.blob import read_blob

        try:
            read_blob(data)
            graph = load_delegate(data, self.named_data, limits=FUZZ_LIMITS)
        except VkDelegateError as exc:
            check_message(exc)
            return
        with graph:
            rng = _rng(data)
            inputs = [_array(t.shape, t.dtype, rng) for t in graph.inputs]
            if any(a is None for a in inputs):
                return
            try:
                graph.execute(inputs)
            except VkDelegateError as exc:
                check_message(exc)


def _method_inputs(plan: dict, rng: np.random.Generator):
    """Flat inputs fitting a method's declared input specs (a dynamic dim in its
    range, near the low end); None where the specs give no shape the harness can
    build (a derived "expr" dim, a huge size)."""
    import torch

    ranges = plan.get("ranges") or {}
    flat = []
    for spec in plan["inputs"]:
        if "const" in spec:
            flat.append(spec["const"])
            continue
        shape = []
        for dim in spec["shape"]:
            if isinstance(dim, int):
                shape.append(dim)
            elif isinstance(dim, dict) and "sym" in dim:
                lo, hi = (list(ranges.get(dim["sym"]) or [1, None]) + [None])[:2]
                lo = lo if isinstance(lo, int) else 1
                hi = hi if isinstance(hi, int) else lo + 4
                shape.append(int(rng.integers(lo, max(lo, min(hi, lo + 4)) + 1)))
            else:
                return None
        array = _array(shape, spec["dtype"], rng) if spec.get("dtype") != "bfloat16" \
            else _array(shape, "float32", rng)
        if array is None:
            return None
        tensor = torch.from_numpy(array)
        flat.append(tensor.to(torch.bfloat16) if spec.get("dtype") == "bfloat16" else tensor)
    return flat


class ProgramTarget:
    """vkdelegate.load + one call of every method. workdir: where the file is written."""

    def __init__(self, workdir: str | None = None):
        self.path = os.path.join(workdir or tempfile.mkdtemp(prefix="vkfuzz-"),
                                 "input.vkp")

    def __call__(self, data: bytes) -> None:
        import vkdelegate

        with open(self.path, "wb") as f:
            f.write(data)
        try:
            program = vkdelegate.load(self.path, limits=FUZZ_LIMITS)
        except VkDelegateError as exc:
            check_message(exc)
            return
        rng = _rng(data)
        try:
            for name in program.method_names:
                runner = program.runner(name)
                try:
                    flat = _method_inputs(runner.plan, rng)
                except (KeyError, TypeError, ValueError, AttributeError):
                    flat = None  # a plan the harness cannot read; load accepted it
                if flat is None:
                    continue
                try:
                    program.run(name, *flat)  # the public call, pytree spec included
                except VkDelegateError as exc:
                    check_message(exc)
                    try:
                        runner.call_flat(flat)
                    except VkDelegateError as again:
                        check_message(again)
        finally:
            program.close()


class PteTarget(ProgramTarget):
    """``vkdelegate.load`` of an ExecuTorch program (.pte) + one call of every method."""

    def __init__(self, workdir: str | None = None):
        super().__init__(workdir)
        self.path = self.path[:-len(".vkp")] + ".pte"


class InspectTarget:
    """``vkdelegate inspect FILE`` and ``--json``, in-process, output captured."""

    def __init__(self, workdir: str | None = None):
        self.path = os.path.join(workdir or tempfile.mkdtemp(prefix="vkfuzz-"),
                                 "input.bin")

    def __call__(self, data: bytes) -> None:
        from vkdelegate.cli import main

        with open(self.path, "wb") as f:
            f.write(data)
        for argv in (["inspect", self.path], ["inspect", self.path, "--json"]):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    status = main(argv)
                except SystemExit as exc:
                    status = exc.code
            lines = err.getvalue().splitlines()
            if status == 0:
                bad = next((line for line in out.getvalue().split("\n")
                            if not line.isprintable()), None)
                if bad is None:
                    continue
                raise InspectOutputError(f"{' '.join(argv[:1] + argv[2:])}: a line that "
                                         f"is not printable: {bad[:300]!r}")
            if status == 2 and len(lines) == 1 and lines[0].isprintable() and \
                    lines[0].startswith("vkdelegate inspect: error: "):
                continue
            raise InspectOutputError(f"{' '.join(argv[:1] + argv[2:])}: exit status "
                                     f"{status!r}, stderr {err.getvalue()[:300]!r}")


def make_target(name: str, seeds: str, workdir: str | None = None):
    """The target ``name`` ("blob", "program", "inspect" or "pte") set up with the seed
    folder ``seeds`` (built by fuzz.corpus) and scratch folder ``workdir``."""
    from fuzz.corpus import load_named_data

    if name == "blob":
        return BlobTarget(load_named_data(seeds))
    if name == "program":
        return ProgramTarget(workdir)
    if name == "inspect":
        return InspectTarget(workdir)
    if name == "pte":
        return PteTarget(workdir)
    raise ValueError(f"unknown fuzz target {name!r}; known: {', '.join(TARGETS)}")


TARGETS = ("blob", "program", "inspect", "pte")
