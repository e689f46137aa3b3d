"""The executor interfaces: what the program layer calls on a built delegate.

Two executors build a delegate blob: the Vulkan runtime's ``DelegateGraph`` and the
CPU ``ReferenceGraph`` (backend/reference.py). Both satisfy ``Executor``; instead of
probing for methods, callers read ``keeps_state``: True means the executor can keep a
mutable buffer on the device (``bind_state``/``read_state``, runtime/device_state.py),
False means states stay on the host. ``MethodDelegate`` is what ``MethodRunner`` calls
on each delegate of a method (program.py's ``_LazyDelegate``, which builds an Executor
at its first call). Structural (``typing.Protocol``): the runtime implements them
without importing this module.
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class Executor(Protocol):
    """A built delegate. execute: one numpy array per graph input (graph dtypes, sizes
    within the declared bounds; None for a state kept on the device) -> one array per
    graph output (None for a state output the host never reads); VkDelegateError for
    bad inputs. close: free what it holds (idempotent). keeps_state: whether
    ``bind_state``/``read_state`` below exist."""

    keeps_state: bool

    def execute(self, inputs: Sequence[Optional[np.ndarray]]) -> list: ...

    def close(self) -> None: ...


@runtime_checkable
class StateExecutor(Executor, Protocol):
    """An Executor with ``keeps_state`` True. bind_state: keep graph input
    ``input_index`` on the device, set to ``initial`` and replaced by output
    ``output_index`` after each run (``download``: the host still reads that output);
    with ``shared`` (a StateBuffer of ``state_buffer``) the input reads that buffer,
    which other graphs of the device may bind too; VkDelegateError when the pair
    cannot alias. read_state: the state's current value (a copy)."""

    def bind_state(self, input_index: int, output_index: int, initial: np.ndarray,
                   download: bool, shared=None) -> None: ...

    def state_buffer(self, input_index: int, initial: np.ndarray): ...

    def read_state(self, input_index: int) -> np.ndarray: ...


@runtime_checkable
class MethodDelegate(Protocol):
    """One delegate of a method as ``MethodRunner`` drives it. bind_state binds the
    program-level buffer ``shared`` (or, when None, a new one holding ``initial``)
    and returns it, or returns None when its executor does not keep state (the state
    then stays on the host). before_close: set by the runner, called (when set) before
    the delegate is closed so that the runner forgets the delegate's bindings.
    last_transfer: host<->device bytes of its last call ({} when none were counted)."""

    before_close: Optional[Callable[[], Optional[Callable[[], None]]]]

    def execute(self, inputs: list) -> list: ...

    def bind_state(self, input_index: int, output_index: int, initial: np.ndarray,
                   download: bool, shared=None): ...

    def close(self) -> None: ...
