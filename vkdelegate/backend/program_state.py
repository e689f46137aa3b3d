"""ProgramState: the mutable buffers of a program, shared by all of its methods.

A buffer a module updates in place (a KV cache, an RNG state) is named by its fully
qualified name (FQN, ``layers.0.k_cache``, as in ``module.state_dict()``), and a
program holds ONE value per FQN: every method that reads or updates it (``prefill``
fills the cache, ``decode`` extends it) sees the others' updates. A method plan maps
its state placeholders to FQNs (``plan["state_fqn"]``; a plan without it uses the
placeholder name as the FQN).

Where the value lives: on the host (a numpy array or torch tensor; the reference
executor, or before any Vulkan delegate bound it) or in one device allocation (a
``runtime.state_buffer.StateBuffer``) that the Vulkan delegates of all methods bind
(``DelegateGraph.bind_state(..., shared=)``). A method whose glue needs the value on
the host (a CPU op reads it) gets it read back, and its new value written into the
buffer: correct, counted in ``upload_bytes``/``download_bytes``, and never needed by
the methods ``vkdelegate.llm`` lowers.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from vkdelegate.errors import VkDelegateError


def _copy(value):
    return value.clone() if hasattr(value, "clone") else np.array(value, copy=True)


class ProgramState:
    """FQN -> value of every mutable buffer of a program (see module docstring).

    initial: FQN -> array/tensor, the values ``reset()`` restores (copied).
    current: FQN -> the values to start from (None: ``initial``).
    Thread-safe (one lock). Counters ``upload_bytes``/``download_bytes``: bytes the
    state moved between host and device buffers since the program was made;
    ``version``: bumped by every ``set``/``reset`` and every call of a method that
    has state (``touch``), so a caller that remembers what the state holds (an LLM
    ``Session``'s cached tokens) can tell whether anyone else changed it since.

    Method calls and the program's ``close()`` exclude each other (``calling`` /
    ``closing``): a close waits for the calls in flight in other threads, and a call
    that starts meanwhile waits for the close to finish (then builds its delegates
    and binds fresh state buffers). Without it a call in another thread could bind,
    or run on, a state buffer the close was freeing.
    """

    def __init__(self, initial: dict, current: "dict | None" = None):
        self._initial = {k: _copy(v) for k, v in initial.items()}
        self._host = {k: _copy(v) for k, v in (current or initial).items()}
        self._device: dict = {}  # FQN -> (StateBuffer, numpy dtype of the host value)
        self._lock = threading.RLock()
        self.upload_bytes = 0
        self.download_bytes = 0
        self.version = 0
        self._gate = threading.Condition(threading.Lock())
        self._calls: dict = {}  # thread id -> calls in flight in that thread
        self._closing = False
        self._close_waiting = 0  # closes waiting for calls: new calls wait behind them

    @contextlib.contextmanager
    def calling(self):
        """Held for one method call: waits while the program is being closed or a
        close waits for the calls in flight (so back-to-back calls cannot starve it);
        a thread already inside a call goes ahead."""
        me = threading.get_ident()
        with self._gate:
            while (self._closing or self._close_waiting) and me not in self._calls:
                self._gate.wait()
            self._calls[me] = self._calls.get(me, 0) + 1
        try:
            yield
        finally:
            with self._gate:
                self._calls[me] -= 1
                if not self._calls[me]:
                    del self._calls[me]
                if self._close_waiting:  # only a close waits for calls to end
                    self._gate.notify_all()

    @contextlib.contextmanager
    def closing(self):
        """Held while the program closes: waits for the calls in flight in other
        threads (not this thread's own: a close from inside a call goes ahead)."""
        me = threading.get_ident()
        with self._gate:
            self._close_waiting += 1
            try:
                while self._closing or any(t != me for t in self._calls):
                    self._gate.wait()
            finally:
                self._close_waiting -= 1
            self._closing = True
        try:
            yield
        finally:
            with self._gate:
                self._closing = False
                self._gate.notify_all()

    def touch(self) -> None:
        """A method that may change the state runs: bump ``version``."""
        with self._lock:
            self.version += 1

    @property
    def names(self) -> list:
        return list(self._initial)

    @property
    def initial(self) -> dict:
        """FQN -> the value ``reset()`` restores (the stored arrays; do not modify)."""
        return self._initial

    def on_device(self, fqn: str) -> bool:
        return fqn in self._device

    def device_buffer(self, fqn: str):
        """The StateBuffer holding ``fqn``, or None while it lives on the host."""
        entry = self._device.get(fqn)
        return None if entry is None else entry[0]

    def device_bytes(self) -> int:
        """Bytes of device memory the state buffers hold (each sized to its value,
        with its staging buffer where the device stages)."""
        with self._lock:
            return sum(buffer.allocator.allocated_bytes
                       for buffer, _ in self._device.values() if not buffer.closed)

    def get(self, fqn: str, rows: "slice | None" = None):
        """The current value (host array/tensor; read back from the device buffer), or
        with ``rows`` (a slice of its first dim, step 1) those rows only (a device
        buffer then reads just them where it is mapped: ``StateBuffer.read``)."""
        with self._lock:
            if fqn not in self._device:
                value = self._host[fqn]
                return value if rows is None else value[rows]
            buffer, dtype = self._device[fqn]
            value = buffer.read(rows)
            self.download_bytes += value.nbytes if rows is not None else buffer.nbytes
            return value if dtype is None else value.astype(dtype)

    def set(self, fqn: str, value) -> None:
        """Make ``value`` the current one (written into the device buffer if there
        is one). Raises VkDelegateError for an unknown FQN or other sizes."""
        with self._lock:
            if fqn not in self._initial:
                raise VkDelegateError(f"program has no state {fqn!r}")
            self.version += 1
            if fqn not in self._device:
                self._host[fqn] = value
                return
            from vkdelegate.backend.interpreter import to_numpy

            buffer, _ = self._device[fqn]
            buffer.write(to_numpy(value).astype(buffer.dtype, copy=False))
            self.upload_bytes += buffer.nbytes

    def adopt(self, fqn: str, buffer) -> None:
        """``buffer`` (a StateBuffer, already holding the current value) is where
        ``fqn`` lives from now on."""
        with self._lock:
            host = self._host.pop(fqn)
            dtype = getattr(host, "dtype", None)
            dtype = None if dtype is None else np.dtype(str(dtype).removeprefix("torch."))
            self._device[fqn] = (buffer, None if dtype == np.dtype(buffer.dtype) else dtype)
            self.upload_bytes += buffer.nbytes

    def reset(self) -> None:
        """Every state back to its initial value (written into device buffers in
        place, so delegates bound to them keep them)."""
        with self._lock:
            for fqn, value in self._initial.items():
                self.set(fqn, _copy(value))

    def snapshot(self) -> dict:
        """FQN -> current value (copies read back from the device)."""
        with self._lock:
            return {fqn: (_copy(self._host[fqn]) if fqn in self._host else self.get(fqn))
                    for fqn in self._initial}

    def release(self) -> None:
        """Read every device buffer back to the host and free it (before the
        program's delegates go; the next call binds fresh buffers)."""
        with self._lock:
            for fqn in list(self._device):
                buffer, _ = self._device[fqn]
                value = self.get(fqn) if not buffer.closed else None
                if value is not None:
                    self._host[fqn] = value
                else:  # the Device was closed under us: the value is lost
                    self._host[fqn] = _copy(self._initial[fqn])
                del self._device[fqn]
                buffer.close()


def merge_initial(methods: dict) -> dict:
    """FQN -> initial value over the methods (name -> Method): a buffer two methods
    use must have one dtype and sizes. Raises VkDelegateError naming both methods."""
    merged, first = {}, {}
    for name, m in methods.items():
        for placeholder, value in m.state.items():
            fqn = state_fqn(m.plan, placeholder)
            if fqn in merged:
                old = merged[fqn]
                if tuple(old.shape) != tuple(value.shape) or str(old.dtype) != str(
                        value.dtype):
                    raise VkDelegateError(
                        f"state {fqn!r} is {old.dtype}{list(old.shape)} in method "
                        f"{first[fqn]!r} but {value.dtype}{list(value.shape)} in "
                        f"method {name!r}")
                continue
            merged[fqn], first[fqn] = value, name
    return merged


def state_fqn(plan: dict, placeholder: str) -> str:
    """The FQN of state placeholder ``placeholder`` of a method plan."""
    names = plan.get("state_fqn") if isinstance(plan, dict) else None
    fqn = names.get(placeholder) if isinstance(names, dict) else None
    return fqn if isinstance(fqn, str) else placeholder
