"""LoweredProgram: what to_backend returns and ``vkdelegate.load`` gives back.

A program has one or more methods ("forward" by default). Each method is a JSON-ready
plan (CPU glue nodes, input specs, output structure), its glue constants and mutable
state (arrays or tensors; held program-wide, one value per buffer FQN that all
methods share, see ``program_state``), and its delegates (blob bytes plus the named constant data
the blob refers to). Calling a method runs it through ``MethodRunner``. Delegates are
built on the Vulkan device on their first call and kept.

Torch-free at import: a program whose methods are fully delegated loads and runs with
numpy only.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from vkdelegate.backend.host_budget import (budgeted_methods, check_host_bytes,
                                            glue_tensor_bytes, tensor_ref_bytes)
from vkdelegate.backend import llm_checks
from vkdelegate.backend.interpreter import MethodRunner, to_numpy, to_torch
from vkdelegate.backend.options import CompileOptions, known_options, parse_options
from vkdelegate.backend.program_state import ProgramState, merge_initial
from vkdelegate.backend.report import PartitionReport
from vkdelegate.errors import (DeviceLimitError, ResourceLimitError, VkDelegateError,
                               not_picklable, printable)
from vkdelegate.limits import LoadLimits, resolve_limits
from vkdelegate.serialization import program_file

_log = logging.getLogger("vkdelegate")

#: Appended to a device-limit message when the method has dynamic dims: delegate
#: tensors are allocated for the dims' upper bounds, not for the sizes of a call.
DYNAMIC_HINT = ("sized for the upper bound of dynamic dims; export with a smaller "
                "Dim max")


@dataclass
class Delegate:
    """One delegate: its blob and the named constant data the blob refers to
    (named_data: key -> bytes, or for a loaded program read-only memoryviews of the
    file's bytes; a key every delegate of a program names is one object)."""

    blob: bytes
    named_data: dict = field(default_factory=dict)


@dataclass
class Method:
    """One method: plan (JSON-ready dict), glue constants, mutable state, delegates."""

    plan: dict
    constants: dict
    state: dict
    delegates: list
    report: object = None


class SharedConstants:
    """The device constant pools that the Vulkan delegates of one program share
    (``runtime.constant_pool.ConstantPools``: each named constant, and each packed copy
    of it, once per device), made at the first build so that the program layer does
    not import the runtime before."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pools = None

    def pools(self):
        """The program's ``runtime.constant_pool.ConstantPools`` (made on first use)."""
        with self._lock:
            if self._pools is None:
                from vkdelegate.runtime.constant_pool import ConstantPools

                self._pools = ConstantPools()
            return self._pools

    @property
    def nbytes(self) -> int:
        """Bytes of device memory the pools hold now."""
        with self._lock:
            return 0 if self._pools is None else self._pools.nbytes


class _LazyDelegate:
    """Builds the delegate on the chosen executor (an ``executor.Executor``) at its
    first call; a ``MethodDelegate`` for the MethodRunner.

    A delegate that is valid but over a limit of the device (DeviceLimitError) runs
    on the CPU reference executor when torch is installed, with one warning on the
    "vkdelegate" logger naming the method, the delegate and the limit; without torch
    the DeviceLimitError is raised. dynamic: the method has dynamic dims (the message
    then says the tensors are sized for their upper bounds).
    Thread-safe: a call, ``bind_state`` and ``close`` hold one lock, so
    ``close`` from another thread waits for a call in flight, and a later call builds
    the delegate again.
    report: the method's PartitionReport (None: none); its ``fallbacks[index]`` holds
    the message while the delegate runs on the CPU. shared: the program's
    SharedConstants (None: the delegate keeps its constants in its own memory).
    """

    def __init__(self, delegate: Delegate, options: CompileOptions, where: str,
                 dynamic: bool = False, limits: "LoadLimits | None" = None,
                 report: "PartitionReport | None" = None, index: int = 0,
                 shared: "SharedConstants | None" = None):
        self.delegate, self.options, self.loaded = delegate, options, None
        self.shared = shared
        self.limits = resolve_limits(limits)
        self.where = where
        self.dynamic = dynamic
        self.report, self.index = report, index
        self.fallback = None  # the DeviceLimitError message when run on the CPU
        self.profiling = False
        self.last_profile = None
        self.before_close = None  # set by MethodRunner: forget this delegate's states
        # Reentrant: before_close runs under the lock.
        self._lock = threading.RLock()

    def build(self, progress: bool = False) -> None:
        """Decode the blob and build it on the executor (once); ``progress`` shows a
        progress bar while the Vulkan executor compiles shaders and packs weights."""
        with self._lock:
            self._build(progress)

    def _build(self, progress: bool) -> None:
        if self.loaded is not None:
            return
        if self.options.executor == "reference":
            from vkdelegate.backend.reference import load_reference

            self.loaded = load_reference(self.delegate.blob, self.delegate.named_data,
                                         self.limits)
        else:
            from vkdelegate.runtime import load_delegate

            try:
                self.loaded = load_delegate(self.delegate.blob,
                                            self.delegate.named_data,
                                            device=self.options.device,
                                            progress=progress, limits=self.limits,
                                            kernel_options=self.options.kernel_options,
                                            constant_pools=None if self.shared is None
                                            else self.shared.pools())
            except DeviceLimitError as exc:
                hint = f" ({DYNAMIC_HINT})" if self.dynamic else ""
                message = f"{self.where}: {exc}{hint}"
                if _torch_or_none() is None:
                    raise DeviceLimitError(message) from exc
                from vkdelegate.backend.reference import load_reference

                self.loaded = load_reference(self.delegate.blob,
                                             self.delegate.named_data, self.limits)
                self.fallback = message
                if self.report is not None:
                    self.report.fallbacks[self.index] = message
                _log.warning("%s; running this delegate on the CPU reference executor "
                             "instead", message)
            except VkDelegateError as exc:  # keeps the subclass (ResourceLimitError)
                hint = (f" ({DYNAMIC_HINT})" if self.dynamic
                        and isinstance(exc, ResourceLimitError) else "")
                raise type(exc)(f"{self.where}: {exc}{hint}") from exc

    def execute(self, inputs: list, repeat: int = 1) -> list:
        """Run the delegate (built at the first call); ``repeat`` > 1: that many runs
        in one submit (``DelegateGraph.execute``), Vulkan executor only."""
        with self._lock:
            return self._execute(inputs, repeat)

    def _execute(self, inputs: list, repeat: int = 1) -> list:
        self._build(False)
        if repeat != 1:
            if not getattr(self.loaded, "keeps_state", False) or self.profiling:
                raise VkDelegateError(f"{self.where}: repeated runs need the Vulkan "
                                      f"executor{' (' + self.fallback + ')' if self.fallback else ''}"
                                      f" and profiling off")
            return self.loaded.execute(inputs, repeat=repeat)
        if not self.profiling:
            return self.loaded.execute(inputs)
        if self.options.executor != "vulkan" or self.fallback is not None:
            raise VkDelegateError("profiling needs the Vulkan executor"
                                  + (f" ({self.fallback})" if self.fallback else ""))
        outputs = self.loaded.execute(inputs, profile=True)
        self.last_profile = self.loaded.last_profile
        return outputs

    def bind_state(self, input_index: int, output_index: int, initial, download: bool,
                   shared=None):
        """Keep a state on the device: bind ``shared`` (a program-level
        ``runtime.state_buffer.StateBuffer``), or a new StateBuffer holding
        ``initial`` when ``shared`` is None (``DelegateGraph.bind_state``). Returns
        the buffer bound, or None when the executor cannot keep state (the reference
        executor, a delegate that fell back to it), so the state stays on the host.
        Raises VkDelegateError when the graph refuses the pair or the buffer."""
        with self._lock:
            self._build(False)
            if not self.loaded.keeps_state:
                return None
            made = shared is None
            if made:
                shared = self.loaded.state_buffer(input_index, initial)
            try:
                self.loaded.bind_state(input_index, output_index, None, download,
                                       shared=shared)
            except VkDelegateError:
                if made:
                    shared.close()
                raise
            return shared

    @property
    def last_transfer(self) -> dict:
        """upload_bytes/download_bytes of the delegate's last call on Vulkan ({} on
        the reference executor, which moves nothing between host and device)."""
        loaded = self.loaded
        return dict(getattr(loaded, "last_transfer", None) or {})

    def close(self) -> None:
        """Release the built delegate (waits for a call in flight; idempotent)."""
        with self._lock:
            if self.loaded is not None and self.before_close is not None:
                self.before_close()
            if self.loaded is not None:
                self.loaded.close()
            self.loaded = None
            self.fallback = None
            if self.report is not None:
                self.report.fallbacks.pop(self.index, None)


class MethodReports(dict):
    """The partition reports of a program's methods (method name -> PartitionReport,
    in the program's order); ``str`` prints each under its method's name."""

    def __str__(self) -> str:
        return "\n\n".join(f"method {name!r}:\n{report}" for name, report in self.items())


class LoweredProgram:
    """A lowered program with one or more methods.

    ``program(*args)`` runs "forward" (or the only method); ``program.run(name, *args)``
    and ``program.<name>(*args)`` run any method. Torch tensors in give torch tensors
    out, numpy arrays in give numpy arrays out, in the structure the module returned.
    Raises VkDelegateError for inputs of the wrong dtype, rank or size.
    limits: the resource budget (``vkdelegate.limits.LoadLimits``; None: the defaults)
    the methods' plans and delegates are checked against.
    """

    def __init__(self, methods: dict, options: "CompileOptions | dict | None" = None,
                 limits: "LoadLimits | None" = None,
                 initial_state: "dict | None" = None):
        if not methods:
            raise VkDelegateError("a program needs at least one method")
        self.options = parse_options(options)
        self.limits = resolve_limits(limits)
        self.methods: dict[str, Method] = methods
        current = merge_initial(methods)
        if initial_state is not None and set(initial_state) != set(current):
            raise VkDelegateError(f"initial state names {sorted(initial_state)} are not "
                                  f"the methods' states {sorted(current)}")
        #: The program's mutable buffers, one per FQN, shared by all methods.
        self.store = ProgramState(initial_state if initial_state is not None
                                  else current, current)
        self._runners = {}
        #: Each weight once on the device for all methods (runtime/constant_pool.py).
        self.shared_constants = SharedConstants()
        for name, m in methods.items():
            dynamic = any(not isinstance(dim, int) for spec in m.plan.get("inputs", [])
                          for dim in spec.get("shape", ()))
            report = m.report if isinstance(m.report, PartitionReport) else None
            delegates = [_LazyDelegate(d, self.options, f"method {name!r}, delegate {i}",
                                       dynamic, self.limits, report, i,
                                       self.shared_constants)
                         for i, d in enumerate(m.delegates)]
            try:
                self._runners[name] = MethodRunner(m.plan, m.constants, m.state, delegates,
                                                   name, limits=self.limits,
                                                   store=self.store)
            except VkDelegateError as exc:  # keep the subclass (ResourceLimitError)
                raise type(exc)(f"method {name!r}: {exc}") from exc
        # An LLM program's methods check start_pos, token ids and sampling values
        # (backend/llm_checks.py); other programs are left alone.
        llm_checks.install(self)

    @property
    def method_names(self) -> list[str]:
        return list(self.methods)

    @property
    def report(self):
        """The partition report of the default method (kept in the program file), a
        PartitionReport; once a delegate over a limit of this device has fallen back to
        the CPU reference executor (at its build: ``build()`` or its first call), the
        report says so and why (``PartitionReport.fallbacks``). A program with several
        methods and no "forward" (an LLM program) has no default one: then a
        MethodReports, each method's report by name (``program.report["decode"]``, the
        same as ``program.methods["decode"].report``), printed one after the other."""
        if "forward" not in self.methods and len(self.methods) != 1:
            return MethodReports((name, m.report) for name, m in self.methods.items())
        return self.methods[self.default_method()].report

    def default_method(self) -> str:
        """"forward" if the program has it, else its only method."""
        if "forward" in self.methods:
            return "forward"
        if len(self.methods) == 1:
            return next(iter(self.methods))
        raise VkDelegateError(f"program has methods {self.method_names}; call "
                              f"program.run(name, ...)")

    def run(self, method: str, *args, **kwargs):
        """Run ``method``; VkDelegateError names the methods when it does not exist."""
        return self.runner(method)(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self.run(self.default_method(), *args, **kwargs)

    def __reduce_ex__(self, protocol):
        # pickle, copy.copy and copy.deepcopy all come here; the default failed on
        # a delegate's lock ("cannot pickle '_thread.RLock' object").
        raise not_picklable("a lowered program")

    def __getattr__(self, name):
        runners = self.__dict__.get("_runners", {})
        if name in runners:
            return runners[name]
        raise AttributeError(f"LoweredProgram has no attribute or method {name!r}")

    def runner(self, method: str) -> MethodRunner:
        """The MethodRunner of ``method`` (flat calls: ``runner.call_flat``)."""
        if method not in self._runners:
            raise VkDelegateError(f"program has no method {method!r}; it has "
                                  f"{self.method_names}")
        return self._runners[method]

    def run_repeated(self, method: str, times: int, *args, **kwargs):
        """Call ``method`` ``times`` times in a row on the same arguments with the host
        out of the loop: one submit of its delegate's command buffer ``times`` times
        (``MethodRunner.repeat``). Meant for a method whose inputs are the same every
        call and whose state carries the loop (``decode_next`` of
        ``vkdelegate.llm.lower``). times: 1 .. 1024 (runtime.graph.MAX_REPEAT); the
        first call after the method's states are bound runs on its own (it binds
        them), the rest in one submit. Returns the last call's outputs. Raises
        VkDelegateError for an unknown method, a ``times`` out of range, or a method
        that cannot repeat on the device (not one delegate alone, or state on the
        host). An error flagged by any run (e.g. an index past the KV cache) is raised
        after the submit, whose later runs still ran: the state then holds what every
        run wrote (a flagged write itself is skipped)."""
        return self.runner(method).repeat(times, *args, **kwargs)

    def set_profiling(self, on: bool) -> None:
        """Make the following calls record per-dispatch GPU times (Vulkan executor)."""
        for runner in self._runners.values():
            for d in runner.delegates:
                d.profiling = on

    def last_profiles(self, method: "str | None" = None) -> list:
        """(delegate index, runtime Profile) of the last profiled call of ``method``."""
        delegates = self.runner(method or self.default_method()).delegates
        return [(i, d.last_profile) for i, d in enumerate(delegates)
                if d.last_profile is not None]

    def state_dict(self, method: "str | None" = None) -> dict:
        """Current values of the program's mutable buffers, shared by all methods:
        FQN (as in the module's ``state_dict()``, e.g. ``cache.k0``) -> torch tensor
        when torch is installed, else numpy array; state kept on the GPU is read back
        (copies). method: only that method's buffers, keyed by its placeholder names
        (``b_cache_k0``)."""
        if method is not None:
            state = self.runner(method).state
        else:
            state = self.store.snapshot()
        torch = _torch_or_none()
        if torch is None:
            return {k: to_numpy(v) for k, v in state.items()}
        return {k: v if isinstance(v, torch.Tensor) else to_torch(np.asarray(v))
                for k, v in state.items()}

    def reset_state(self) -> None:
        """Set every mutable buffer back to its initial value: the module's buffers
        when it was exported (for a loaded program: the ``initial_state`` its file
        stored, see ``save``). State on the GPU is overwritten in place."""
        self.store.reset()

    def last_transfer(self, method: "str | None" = None) -> dict:
        """Bytes the last call of ``method`` moved between host and device:
        ``upload_bytes``, ``download_bytes`` (inputs, outputs, states), of which
        ``state_upload_bytes``/``state_download_bytes`` were program state (see
        ``MethodRunner.call_flat``); {} before the first call."""
        return dict(self.runner(method or self.default_method()).last_transfer)

    def device_memory(self) -> dict:
        """Bytes of device memory the built Vulkan delegates hold: ``"constants"``,
        the weights all methods share (each once per layout, see
        runtime/constant_pool.py; the bytes of the buffers), ``"state"``, the mutable
        buffers kept on the device (a KV cache; their blocks), and per built delegate
        ``"<method>/<index>"`` its own memory (activations, inputs and outputs, small
        constants; blocks grow 1, 2, 4... MiB, so these count reserved bytes).
        Delegates not built yet, or on the CPU reference executor, are left out."""
        out = {"constants": self.shared_constants.nbytes,
               "state": self.store.device_bytes()}
        for name, runner in self._runners.items():
            for i, d in enumerate(runner.delegates):
                held = getattr(d.loaded, "device_bytes", None)
                if held is not None:
                    out[f"{name}/{i}"] = held
        return out

    def num_delegates(self, method: "str | None" = None) -> int:
        return len(self.methods[method or self.default_method()].delegates)

    def build(self, progress: bool = False) -> "LoweredProgram":
        """Build every delegate now (decode, allocate, upload weights, compile and
        record) instead of at its first call, and bind the program's states to the
        delegates that keep them on the device (a method never called holds no copy of
        a KV cache of its own); returns the program. ``progress`` shows a progress bar
        per delegate (tqdm, on stderr)."""
        for runner in self._runners.values():
            for d in runner.delegates:
                d.build(progress)
            runner.bind_states()  # the states in the program's buffers, not copies
        return self

    def close(self) -> None:
        """Release every delegate's device resources (rebuilt if called again).
        Thread-safe: each delegate waits for a call in flight in another thread. A
        program dropped without ``close()`` is released when it is collected (each
        Vulkan delegate has a finalizer, see DelegateGraph)."""
        with self.store.closing():  # calls in other threads finish first, or wait
            for runner in self._runners.values():
                for d in runner.delegates:
                    d.close()
            self.store.release()  # the shared state buffers, after the graphs using them

    def __enter__(self) -> "LoweredProgram":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        parts = [f"{printable(name)}: {len(m.delegates)} delegate(s), "
                 f"{sum(n['op'] not in ('delegate', 'getitem') for n in m.plan['nodes'])} "
                 f"CPU op(s)"
                 for name, m in self.methods.items()]
        return f"LoweredProgram({'; '.join(parts)})"

    def save(self, path) -> None:
        """Write the program to one file (see ``vkdelegate.serialization.program_file``).

        Blobs and constants are stored once per distinct content, across partitions and
        methods. The file holds no pickle and no code.

        State: the file stores the CURRENT value of every mutable buffer (a KV cache
        as the last call left it), so a loaded program continues where this one
        stopped, and also the initial values, which ``reset_state()`` of the loaded
        program restores. Call ``reset_state()`` before ``save`` to store a fresh
        program.

        The file is complete or absent: it is written under a temporary name in the
        same folder and renamed over ``path``, so a failed save (a full disk) keeps a
        file that was at ``path``. Raises VkDelegateError naming ``path`` when it
        cannot be written (a missing folder, a directory, no permission, no space) or
        holds a file that is not a program file (a model's weights are never replaced;
        an empty file or an older program file is).
        """
        table = program_file.SegmentTable()
        methods = {}
        for name, m in self.methods.items():
            runner = self._runners[name]  # current state (see the docstring)
            methods[name] = {
                "plan": m.plan,
                "constants": {k: _tensor_ref(table, v) for k, v in m.constants.items()},
                "state": {k: _tensor_ref(table, v) for k, v in runner.state.items()},
                "report": m.report.to_json() if m.report is not None else None,
                "delegates": [{"blob": table.add(d.blob),
                               "named_data": {k: table.add(v)
                                              for k, v in d.named_data.items()}}
                              for d in m.delegates],
            }
        manifest = {"options": self.options.to_dict(), "methods": methods,
                    "initial_state": {k: _tensor_ref(table, v)
                                      for k, v in self.store.initial.items()}}
        program_file.write_program(path, manifest, table.segments)


def _tensor_ref(table: program_file.SegmentTable, value) -> dict:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
        data = value.detach().contiguous().view(torch.int16).numpy().tobytes()
        return {"segment": table.add(data), "dtype": "bfloat16", "shape": list(value.shape)}
    arr = to_numpy(value)
    return {"segment": table.add(arr.tobytes()), "dtype": str(arr.dtype),
            "shape": list(arr.shape)}


def _tensor_from(ref, segments, where: str):
    """A tensor (torch if installed, else numpy) from a manifest reference."""
    nbytes = tensor_ref_bytes(ref, where)
    seg, dtype, shape = ref["segment"], ref["dtype"], ref["shape"]
    if not 0 <= seg < len(segments):
        raise VkDelegateError(f"{where}: tensor reference segment {seg} does not exist "
                              f"(the file has {len(segments)})")
    seg = segments[seg]
    if nbytes != len(seg):
        raise VkDelegateError(f"{where}: {len(seg)} bytes do not hold {dtype}{shape}")
    torch = _torch_or_none()
    np_dtype = np.int16 if dtype == "bfloat16" else np.dtype(dtype)
    arr = np.frombuffer(seg, dtype=np_dtype).reshape(shape).copy()
    if torch is None:
        if dtype == "bfloat16":
            raise VkDelegateError(f"{where}: bfloat16 constants need torch")
        return arr
    tensor = torch.from_numpy(arr)
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


def _pte_bytes(path) -> "bytes | None":
    """The bytes of ``path`` when it is an ExecuTorch program, else None (also for
    a path ``read_program`` must refuse, so that it says why)."""
    from vkdelegate.serialization.pte_reader import is_pte

    if not isinstance(path, (str, os.PathLike)):
        return None
    try:
        with open(path, "rb") as f:
            if not is_pte(f.read(8)):
                return None
            f.seek(0)
            return f.read()
    except OSError:
        return None


def _torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


#: What reading a crafted manifest's fields can raise before a check names the field.
_MALFORMED = (KeyError, IndexError, TypeError, AttributeError, ValueError, OverflowError,
              RecursionError)


def load(path, *, device: "int | None" = None, executor: "str | None" = None,
         limits: "LoadLimits | None" = None) -> LoweredProgram:
    """Load a program file written by ``LoweredProgram.save``, or an ExecuTorch
    program (.pte, recognised by its ``ET12`` identifier; see
    ``vkdelegate.backend.pte_program``: its VulkanBackend delegates run on Vulkan,
    its other instructions on torch under the glue allow-list).

    device, executor: override the compile options stored in the file.
    limits: the resource budget the file is checked against before anything is
    allocated (``vkdelegate.limits.LoadLimits``; None: the defaults); a file over it
    raises ``ResourceLimitError``: its manifest's JSON nesting and segment count, each
    glue constant and state tensor (max_tensor_bytes) and their sum over the program
    (max_host_bytes), the glue nodes of each method (max_nodes).
    path: str or os.PathLike (anything else, e.g. an int that open() would take as a
    file descriptor, raises VkDelegateError).
    Raises VkDelegateError for a file that is not a valid program file (corrupt,
    truncated, crafted, a pickle) before running anything.
    """
    limits = resolve_limits(limits)
    raw = _pte_bytes(path)
    if raw is not None:
        from vkdelegate.backend.pte_program import load_pte

        options = {k: v for k, v in (("device", device), ("executor", executor))
                   if v is not None}
        return load_pte(raw, f"program file {path}", options, limits)
    manifest, segments = program_file.read_program(path, limits)
    where = f"program file {path}"
    try:
        # Counted from the manifest, before any constant or state is copied out.
        check_host_bytes(glue_tensor_bytes(budgeted_methods(manifest), limits, where),
                         limits, where)
        options = dict(manifest.get("options") or {})
        unknown = sorted(k for k in options if k not in known_options())
        if unknown:
            from vkdelegate import __version__

            raise VkDelegateError(
                f"{where}: compile option {unknown[0]!r} is not known to vkdelegate "
                f"{__version__} (a file written by a newer version?); known options: "
                f"{', '.join(known_options())}")
        if device is not None:
            options["device"] = device
        if executor is not None:
            options["executor"] = executor
        methods = {}
        # A key names one weight for every delegate of the program: the methods share
        # its device copy (runtime/constant_pool.py). The writer stores each distinct
        # byte string as one segment, so a key naming two segments is a crafted file.
        key_segment: dict = {}
        for name, m in manifest["methods"].items():
            for i, d in enumerate(m["delegates"]):
                for k, v in d["named_data"].items():
                    if key_segment.setdefault(k, v) != v:
                        raise VkDelegateError(
                            f"{where}: method {name!r}, delegate {i} names constant "
                            f"{printable(k)} as segment {v}, another delegate as segment "
                            f"{key_segment[k]} (one key must be one weight)")
        # Named constants (the weights) stay views of the file's bytes, which were read
        # once and checksummed: a weight every method names is not copied at all.
        for name, m in manifest["methods"].items():
            w = f"{where}, method {name!r}"
            delegates = [Delegate(bytes(segments[d["blob"]]),
                                  {k: segments[v] for k, v in d["named_data"].items()})
                         for d in m["delegates"]]
            methods[name] = Method(
                plan=m["plan"],
                constants={k: _tensor_from(v, segments, f"{w}, constant {k!r}")
                           for k, v in m["constants"].items()},
                state={k: _tensor_from(v, segments, f"{w}, state {k!r}")
                       for k, v in m["state"].items()},
                delegates=delegates,
                report=(PartitionReport.from_json(m["report"])
                        if m.get("report") is not None else None))
        initial = manifest.get("initial_state")  # files before issue 14 have none
        if initial is not None:
            initial = {k: _tensor_from(v, segments, f"{where}, initial state {k!r}")
                       for k, v in initial.items()}
    except VkDelegateError:
        raise
    except _MALFORMED as exc:
        raise VkDelegateError(f"{where}: malformed manifest ({type(exc).__name__}: "
                              f"{exc})") from exc
    try:
        return LoweredProgram(methods, options, limits, initial)
    except VkDelegateError as exc:  # name the file too; keeps the subclass
        sep = ", " if str(exc).startswith("method ") else ": "
        raise type(exc)(f"{where}{sep}{exc}") from exc
    except _MALFORMED as exc:
        raise VkDelegateError(f"{where}: malformed manifest ({type(exc).__name__}: "
                              f"{exc})") from exc
