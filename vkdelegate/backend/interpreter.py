"""Run one method of a lowered program: CPU glue with torch, delegates on Vulkan.

A method is a JSON-ready plan (see ``vkdelegate.backend.program``): a list of nodes,
each an ATen op, a size operation, a ``getitem`` or a delegate call. Values move
between torch tensors (CPU ops) and numpy arrays (delegates) only at the boundary,
and torch is imported only when a CPU op or a torch input needs it, so a fully
delegated method runs without torch (numpy in, numpy out).

Node forms: ``{"op": name, "args": [...], "kwargs": {...}, "out": value name}`` and
``{"op": "delegate", "index": i, "args": [refs], "out": name}``. An argument is a JSON
scalar, a list, None, ``{"v": name}`` (a value), or ``{"dtype"|"device"|"layout"|
"memory_format": name}``.
"""
from __future__ import annotations

import sys
import threading
import weakref

import numpy as np

from vkdelegate.backend import glue_ops, pytree_spec
from vkdelegate.backend.glue_checks import CreationBudget, check_arguments, glue_literal, \
    sizes_at_call
from vkdelegate.backend.input_checks import check_inputs
from vkdelegate.backend.plan_check import check_plan
from vkdelegate.backend.program_state import ProgramState, state_fqn
from vkdelegate.backend.state_bindings import plan_bindings
from vkdelegate.errors import VkDelegateError, first_line, not_picklable, printable
from vkdelegate.limits import LoadLimits, check_limit, resolve_limits
from vkdelegate.runtime import host_copy

_SPECIAL_KEYS = ("dtype", "device", "layout", "memory_format")


def _is_torch_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _byte_span(value) -> "tuple[int, int] | None":
    """[first, last) host addresses of a tensor's or array's elements; None for
    anything else (or an empty one)."""
    if _is_torch_tensor(value):
        if value.numel() == 0 or value.device.type != "cpu":
            return None
        extent = 1 + sum((n - 1) * abs(st) for n, st in zip(value.shape, value.stride()))
        lowest = min(0, sum((n - 1) * st for n, st in zip(value.shape, value.stride())
                            if st < 0))
        start = value.data_ptr() + lowest * value.element_size()
        return start, start + extent * value.element_size()
    if isinstance(value, np.ndarray) and value.size:
        try:
            from numpy.lib.array_utils import byte_bounds  # numpy >= 2
        except ImportError:  # numpy 1.x
            byte_bounds = np.byte_bounds
        return byte_bounds(value)
    return None


def check_mutated_inputs_unshared(flat: list, mutated: list) -> None:
    """VkDelegateError when an input the method mutates in place shares memory with
    another input (``p(x, x)`` for ``a.mul_(2); return a + b``): eager would see the
    update through both names, while the program reads every input first and writes
    the new value back after the run, so it would return a different result.
    ``flat``: the flattened user inputs; ``mutated``: positions of the mutated ones."""
    spans = [_byte_span(v) for v in flat]
    for pos in mutated:
        if spans[pos] is None:
            continue
        for other, span in enumerate(spans):
            if other != pos and span is not None and span[0] < spans[pos][1] \
                    and spans[pos][0] < span[1]:
                raise VkDelegateError(
                    f"inputs {min(pos, other)} and {max(pos, other)} share memory, and the "
                    f"program mutates input {pos} in place: eager would see the update "
                    f"through both; pass distinct tensors (e.g. a .clone())")


def _torch_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """The runtime's parallel host copy (runtime/host_copy.py ``set_parallel_copy``):
    torch's ``copy_`` over zero-copy tensor views, run by torch's intra-op threads."""
    import torch

    torch.from_numpy(dst).copy_(torch.from_numpy(src))


def to_numpy(value) -> np.ndarray:
    """A delegate input: torch tensors become contiguous numpy arrays; ints 0-d arrays.
    A torch input also hands the runtime's large host copies to torch's threads
    (``_torch_copy``).

    Raises VkDelegateError for a tensor of a dtype numpy has no form of (bfloat16)."""
    # np.require, not np.ascontiguousarray: the latter turns 0-d arrays into 1-d.
    if _is_torch_tensor(value):
        host_copy.set_parallel_copy(_torch_copy)
        # resolve_*: numpy() refuses a tensor whose lazy conjugate or negation bit is set.
        # Each step only where it changes something (each is a dispatcher call).
        if value.requires_grad:
            value = value.detach()
        if not value.is_cpu:
            value = value.cpu()
        if value.is_conj():
            value = value.resolve_conj()
        if value.is_neg():
            value = value.resolve_neg()
        try:
            array = value.numpy()
        except TypeError as exc:  # "Got unsupported ScalarType BFloat16"
            raise VkDelegateError(f"a {str(value.dtype).removeprefix('torch.')} tensor "
                                  f"cannot be passed to a Vulkan delegate ({exc})") from None
        except RuntimeError as exc:  # a tensor subclass check_inputs did not see
            raise VkDelegateError(f"a {type(value).__name__} cannot be passed to a "
                                  f"Vulkan delegate ({first_line(exc)})") from exc
        return array if array.flags.c_contiguous else np.require(array, requirements="C")
    if isinstance(value, np.ndarray) and value.flags.c_contiguous:
        return value
    return np.require(value, requirements="C")


def _tensor_to_numpy(value):
    """An output leaf for numpy callers: a tensor or array as a C-contiguous array;
    anything else (None, a Python int or float the method returns) as it is, as a
    torch caller gets it."""
    if _is_torch_tensor(value) or isinstance(value, np.ndarray):
        return to_numpy(value)
    return value


def _owned(array: np.ndarray) -> np.ndarray:
    """``array`` itself when it is C-contiguous, writable and owns its memory (a
    runtime's fresh output), else such a copy: np.require(array, requirements=["C",
    "W", "O"]) without its Python-level work in the common case."""
    flags = array.flags
    if flags.c_contiguous and flags.writeable and flags.owndata:
        return array
    return np.require(array, requirements=["C", "W", "O"])


def to_torch(value):
    """A CPU-op input: numpy arrays become tensors (sharing memory when writable)."""
    if isinstance(value, np.ndarray):
        import torch

        return torch.from_numpy(value if value.flags.writeable else value.copy())
    return value


def _special(key: str, name: str):
    import torch

    if key == "dtype":
        value = getattr(torch, name, None)
        ok = isinstance(value, torch.dtype)
    elif key == "device":
        try:
            return torch.device(name)
        except (RuntimeError, TypeError) as exc:
            raise VkDelegateError(f"unknown device {name!r}") from exc
    elif key == "layout":
        value = getattr(torch, name, None)
        ok = isinstance(value, torch.layout)
    else:
        value = getattr(torch, name, None)
        ok = isinstance(value, torch.memory_format)
    if not ok:
        raise VkDelegateError(f"unknown {key} {name!r}")
    return value


#: float16/float32: force_fp16's casts; int32/int64: an ExecuTorch blob declares its
#: int64 inputs and outputs int32, and ExecuTorch's runtime converts at the boundary
#: (``vkdelegate.backend.pte_program`` writes these).
_CASTS = ("float16", "float32", "int32", "int64")


def _value_name(input_spec: dict) -> str:
    """The glue value an input binds ("value"; older plans used "name" for both)."""
    return input_spec.get("value", input_spec["name"])


def _forget(runner_ref, index: int):
    """A delegate's before_close: its runner (if still alive) forgets its bindings."""
    def forget() -> None:
        runner = runner_ref()
        if runner is not None:
            runner.release_state(index)
    return forget


def _cast(arrays: list, dtypes: "list | None") -> list:
    """Delegate-boundary casts (force_fp16): dtype per array, None for none (and None
    for an array the runtime keeps on the device)."""
    if not dtypes:
        return arrays
    return [a if d is None or a is None else a.astype(d) for a, d in zip(arrays, dtypes)]


class MethodRunner:
    """Executes one method's plan.

    plan: the method's JSON-ready dict. constants: name -> array/tensor for glue
    constants. state: state placeholder name -> array/tensor of the method's mutable
    buffers (their initial values when ``store`` is None). store: the program's
    ``program_state.ProgramState`` the method shares with its other methods (keyed
    by FQN, see ``plan["state_fqn"]``); None: a store of the method's own.
    delegates: ``executor.MethodDelegate`` objects, indexed by the plan's delegate
    nodes; one whose ``bind_state`` returns a buffer keeps the states that
    ``state_bindings.plan_bindings`` finds on the device (in the store's one buffer
    per FQN) from its first call on.
    limits: the resource budget (``vkdelegate.limits.LoadLimits``, None: defaults).
    ``last_transfer``: host<->device bytes of the last call (see ``call_flat``).
    Raises VkDelegateError for a malformed plan, ResourceLimitError for one over limits.
    """

    def __init__(self, plan: dict, constants: dict, state: dict, delegates: list,
                 name: str = "forward", limits: "LoadLimits | None" = None,
                 store: "ProgramState | None" = None):
        self.plan, self.name = plan, name
        self.limits = resolve_limits(limits)
        self.constants = constants
        self._state_names = dict.fromkeys(state)
        self.delegates = delegates
        self._validate()
        self._signature_cache = self._signature()  # _bind_arguments's, per call
        self._fqn = {k: state_fqn(plan, k) for k in self._state_names}
        self.store = store if store is not None else ProgramState(
            {self._fqn[k]: v for k, v in state.items()})
        self._bindings = plan_bindings(plan)
        self._bound: dict = {}       # state name -> (delegate index, StateBinding)
        self._bound_inputs: dict = {}  # delegate index -> argument positions bound
        self._tried: set = set()     # delegates whose bindings were attempted
        self._bind_lock = threading.Lock()
        self.last_transfer: dict = {}
        self._moved = {"upload_bytes": 0, "download_bytes": 0}
        #: Value checks of the method's inputs, or None: an object with
        #: ``check(flat_inputs)``, run after the dtype/shape checks and before
        #: anything runs, and ``explain(exc)``, a clearer VkDelegateError (or None)
        #: for one a run raised (``backend.llm_checks``, for LLM programs).
        self.guard = None
        ref = weakref.ref(self)
        for index, d in enumerate(delegates):  # a closed delegate binds again
            # A weak reference: no runner <-> delegate cycle, so a dropped program
            # is freed (and its graphs finalized) as soon as it is unreferenced.
            d.before_close = _forget(ref, index)

    def __reduce_ex__(self, protocol):
        raise not_picklable(f"method {printable(self.name)!r} of a lowered program")

    @property
    def state(self) -> dict:
        """Current value of every mutable buffer of the method (placeholder name ->
        array/tensor); a state kept on the device is read back from it (a copy)."""
        return {k: self.store.get(fqn) for k, fqn in self._fqn.items()}

    @property
    def states_on_device(self) -> list[str]:
        """Names of the states this method's delegates keep on the device."""
        return list(self._bound)

    def release_state(self, index: "int | None" = None) -> None:
        """Forget the device bindings of delegate ``index`` (all: None), before it is
        closed; the state itself stays in the program's store, and the next call
        binds it again."""
        for name, (d, _) in list(self._bound.items()):
            if index is None or d == index:
                del self._bound[name]
        for d in list(self._tried):
            if index is None or d == index:
                self._tried.discard(d)
                self._bound_inputs.pop(d, None)

    def bind_states(self) -> None:
        """Offer every delegate not offered yet its states now, as its first call would
        (``LoweredProgram.build``): a built method that is never called then holds no
        memory of its own for a state another method's buffer already holds."""
        with self.store.calling(), self._bind_lock:
            for node in self.plan["nodes"]:
                index = node.get("index") if node.get("op") == "delegate" else None
                if index in self._bindings and index not in self._tried:
                    self._bind(index, node)

    def _bind(self, index: int, node: dict) -> None:
        """Offer delegate ``index`` its states (once per build of the delegate): the
        program's buffer of each FQN, made from this call's value the first time."""
        self._tried.add(index)
        delegate = self.delegates[index]
        casts_in = node.get("cast_inputs") or []
        for b in self._bindings.get(index, []):
            fqn = self._fqn[b.name]
            shared = self.store.device_buffer(fqn)
            initial = None
            if shared is None:
                initial = to_numpy(self.store.get(fqn))
                cast = casts_in[b.input] if b.input < len(casts_in) else None
                if cast is not None:
                    initial = initial.astype(cast)
            try:
                bound = delegate.bind_state(b.input, b.output, initial, b.download,
                                            shared=shared)
            except VkDelegateError:
                bound = None  # the runtime cannot alias this pair: stay on the host
            if bound is not None:
                if shared is None:
                    self.store.adopt(fqn, bound)
                self._bound[b.name] = (index, b)
                self._bound_inputs.setdefault(index, set()).add(b.input)

    def _validate(self) -> None:
        plan = self.plan
        nodes = plan.get("nodes") if isinstance(plan, dict) else None
        if isinstance(nodes, list):  # counted before check_plan walks them
            check_limit("CPU glue node count", len(nodes), self.limits.max_nodes,
                        "max_nodes")
        check_plan(plan, self._state_names)
        defined = {_value_name(i) for i in plan["inputs"]} | set(self.constants) | set(
            self._state_names)
        self._ops = []
        self.creation = CreationBudget(self.limits)
        #: glue nodes sized on the meta device before each call (glue_checks)
        self._grows = {n for n, node in enumerate(plan["nodes"])
                       if isinstance(node, dict) and isinstance(node.get("op"), str)
                       and node["op"] not in ("delegate", "getitem")
                       and sizes_at_call(node["op"])}
        for n, node in enumerate(plan["nodes"]):
            if not isinstance(node, dict) or "op" not in node or "out" not in node:
                raise VkDelegateError(f"node {n} of the CPU glue is malformed")
            if node["op"] == "delegate":
                index = node.get("index")
                if not isinstance(index, int) or not 0 <= index < len(self.delegates):
                    raise VkDelegateError(f"node {n} calls delegate {index!r}, but the "
                                          f"method has {len(self.delegates)}")
                for key in ("cast_inputs", "cast_outputs"):
                    if not all(c is None or c in _CASTS for c in node.get(key) or []):
                        raise VkDelegateError(f"node {n}: bad {key}")
                self._ops.append(None)
            elif node["op"] == "getitem":
                self._ops.append(None)
            else:
                self._ops.append(self._check_call(n, node))
            self._check_refs(node.get("args", []), defined, n)
            self._check_refs(node.get("kwargs", {}), defined, n)
            defined.add(node["out"])
        self._check_refs(plan["outputs"], defined, "outputs")

    def _check_call(self, n: int, node: dict):
        """The callable of an op node, after the allow-list and argument checks and
        the sizing of a creation op (see ``glue_checks``)."""
        where = f"node {n}"  # LoweredProgram adds "method 'forward': "
        fn = glue_ops.resolve(node["op"], where)
        args = [glue_literal(a, where) for a in node.get("args", [])]
        kwargs = {k: glue_literal(a, where) for k, a in node.get("kwargs", {}).items()}
        check_arguments(node["op"], fn, args, kwargs, where)
        self.creation.add(n, node["op"], args, kwargs, f"node {n} ({node['op']})")
        return fn

    def _check_refs(self, arg, defined: set, where) -> None:
        if isinstance(arg, dict):
            if "v" in arg:
                if arg["v"] not in defined:
                    raise VkDelegateError(f"node {where} reads {arg['v']!r} before it is "
                                          f"defined")
            elif len(arg) == 1 and next(iter(arg)) in _SPECIAL_KEYS:
                pass
            else:
                for v in arg.values():
                    self._check_refs(v, defined, where)
        elif isinstance(arg, list):
            for v in arg:
                self._check_refs(v, defined, where)

    def _arg(self, arg, env: dict, torch_side: bool):
        if isinstance(arg, dict):
            if "v" in arg:
                value = env[arg["v"]]
                return to_torch(value) if torch_side else value
            key = next(iter(arg))
            return _special(key, arg[key])
        if isinstance(arg, list):
            return [self._arg(a, env, torch_side) for a in arg]
        return arg

    def run_flat(self, flat_inputs: list, repeat: int = 1) -> list:
        """Outputs (the full output tuple, leaves) for flattened inputs; ``repeat``:
        runs of the delegate per call (``repeat``, which checks that this is sound)."""
        plan = self.plan
        check_inputs(flat_inputs, plan["inputs"], plan.get("ranges", {}),
                     plan.get("dim_names"))
        guard = self.guard
        if guard is None:
            return self._run_plan(flat_inputs, repeat)
        guard.check(flat_inputs)
        try:
            return self._run_plan(flat_inputs, repeat)
        except VkDelegateError as exc:
            better = guard.explain(exc)
            if better is None:
                raise
            raise better from exc

    def _run_plan(self, flat_inputs: list, repeat: int) -> list:
        plan = self.plan
        if self._fqn:
            self.store.touch()  # this call may change the program's state
        env = dict(self.constants)
        env.update({k: self.store.get(fqn) for k, fqn in self._fqn.items()
                    if k not in self._bound})
        env.update({_value_name(spec): v for spec, v in zip(plan["inputs"], flat_inputs)})
        created = 0  # bytes this call's run-time-sized creation ops made
        for n, (node, fn) in enumerate(zip(plan["nodes"], self._ops)):
            op = node["op"]
            if op == "delegate":
                index = node["index"]
                if index in self._bindings and index not in self._tried:
                    with self._bind_lock:  # two threads' first calls bind once
                        if index not in self._tried:
                            self._bind(index, node)
                on_device = self._bound_inputs.get(index, ())
                args = [None if i in on_device else to_numpy(self._arg(a, env, False))
                        for i, a in enumerate(node["args"])]
                args = _cast(args, node.get("cast_inputs"))
                outs = (self.delegates[index].execute(args) if repeat == 1 else
                        self.delegates[index].execute(args, repeat=repeat))
                moved = getattr(self.delegates[index], "last_transfer", None) or {}
                for key in ("upload_bytes", "download_bytes"):
                    self._moved[key] += moved.get(key, 0)
                # Own the memory: a runtime may reuse its output buffers on the next run.
                # None: a state's new value that stayed on the device.
                env[node["out"]] = _cast([None if o is None else _owned(o) for o in outs],
                                         node.get("cast_outputs"))
            elif op == "getitem":
                seq, index = node["args"]
                try:
                    env[node["out"]] = env[seq["v"]][index]
                except (IndexError, TypeError, KeyError) as exc:
                    raise VkDelegateError(f"node {printable(node['out'])}: item {index} of "
                                          f"{seq['v']!r} does not exist") from exc
            else:
                torch_side = op not in glue_ops.BUILTINS and op not in glue_ops.TORCH_FREE
                args = [self._arg(a, env, torch_side) for a in node.get("args", [])]
                kwargs = {k: self._arg(a, env, torch_side)
                          for k, a in node.get("kwargs", {}).items()}
                if n in self.creation.at_run_time:
                    created += self.creation.check_call(
                        op, args, kwargs, f"method {self.name!r}, node {n} ({op})", created)
                elif n in self._grows:
                    created += self.creation.check_growth(
                        n, fn, args, kwargs, f"method {self.name!r}, node {n} ({op})", created)
                try:
                    env[node["out"]] = fn(*args, **kwargs)
                except Exception as exc:
                    raise VkDelegateError(f"CPU op {op} (node {printable(node['out'])}) "
                                          f"failed: {type(exc).__name__}: "
                                          f"{first_line(exc)}") from exc
        return [self._arg(a, env, False) for a in plan["outputs"]]

    def __call__(self, *args, **kwargs):
        """Run the method like the original module: same arguments, same structure out.

        Torch tensors in give torch tensors out; numpy arrays in give numpy arrays out.
        """
        return self._call(args, kwargs, 1)

    def _call(self, args, kwargs, repeat: int):
        args, kwargs = self._bind_arguments(args, kwargs)
        flat = pytree_spec.flatten((tuple(args), dict(kwargs)), self.plan["in_spec"],
                                   "arguments")
        want_torch = any(_is_torch_tensor(v) for v in flat) or (
            not flat and "torch" in sys.modules)
        convert = to_torch if want_torch else _tensor_to_numpy
        leaves = [convert(v) for v in self.call_flat(flat, repeat)]
        return pytree_spec.unflatten(leaves, self.plan["out_spec"], want_torch)

    def repeat(self, times: int, *args, **kwargs):
        """Call the method ``times`` times on the same arguments, with its one delegate
        run ``times`` times in a single submit (``DelegateGraph.execute(repeat=)``):
        equal to ``times`` calls in a row when the method is that delegate alone (no
        CPU glue ops) with every state it writes kept on the device (a state it only
        reads is the same input at every run), which this checks (the first call
        binds the states, so it runs on its own). Returns the last call's outputs, as
        ``__call__``. Raises VkDelegateError when the method cannot repeat so (it
        names why) or ``times`` is not an int in 1..MAX_REPEAT (runtime.graph)."""
        from vkdelegate.runtime.graph import MAX_REPEAT

        if isinstance(times, bool) or not isinstance(times, int) \
                or not 1 <= times <= MAX_REPEAT:
            raise VkDelegateError(f"times must be an int in 1..{MAX_REPEAT}, got {times!r}")
        why = self.repeat_blocker()
        if why is not None:
            raise VkDelegateError(f"method {self.name!r} cannot repeat on the device: "
                                  f"{why}")
        # States this method writes must stay on the device; one it only reads (another
        # method writes it) is the same input at every run.
        written = set(self.plan.get("state_updates", {}))
        if not written <= set(self._bound):
            out = self(*args, **kwargs)  # binds the states on the device
            times -= 1
            host = sorted(written - set(self._bound))
            if host:
                raise VkDelegateError(f"method {self.name!r} cannot repeat on the device: "
                                      f"its state {host} stays on the host")
            if times == 0:
                return out
        return self._call(args, kwargs, times)

    def repeat_blocker(self) -> "str | None":
        """Why ``repeat`` cannot run this method (not one delegate alone: CPU glue ops
        or input updates between runs; its delegate on the CPU reference executor, a
        device limit's fallback: the delegate is built here to know), or None. States
        written on the host are found at the first repeat only (they depend on how the
        states were bound)."""
        ops = [n["op"] for n in self.plan["nodes"] if n["op"] != "getitem"]
        if ops != ["delegate"] or self.plan.get("input_updates"):
            return (f"it is not one delegate alone (nodes: {ops}"
                    f"{', input updates' if self.plan.get('input_updates') else ''})")
        index = next(n["index"] for n in self.plan["nodes"] if n["op"] == "delegate")
        delegate = (self.delegates[index] if isinstance(index, int)
                    and 0 <= index < len(self.delegates) else None)
        build = getattr(delegate, "build", None)
        if build is not None:
            build()
            if getattr(delegate, "fallback", None):
                return f"its delegate runs on the CPU reference executor ({delegate.fallback})"
            if not getattr(getattr(delegate, "loaded", None), "keeps_state", False):
                return "its delegate does not run on the Vulkan executor"
        return None

    def _signature(self) -> "tuple[list[str], list[str]] | None":
        """(positional input names, keyword-only names) from the plan's in_spec, or
        None when the in_spec is not the (args tuple, kwargs dict) export gives."""
        spec = self.plan["in_spec"]
        if spec["t"] != "tuple" or len(spec["c"]) != 2 or spec["c"][1]["t"] != "dict" \
                or spec["c"][0]["t"] not in ("tuple", "list"):
            return None
        names, first = [], 0
        for i, child in enumerate(spec["c"][0]["c"]):
            leaf = child["t"] == "leaf" and first < len(self.plan["inputs"])
            names.append(self.plan["inputs"][first]["name"] if leaf else f"arg{i}")
            first += pytree_spec.num_leaves(child)
        return names, list(spec["c"][1]["k"])

    def _bind_arguments(self, args: tuple, kwargs: dict) -> "tuple[list, dict]":
        """Positional arguments and the exported keyword inputs: a keyword naming a
        positional input fills its slot; VkDelegateError names the method's inputs
        for too many, missing, repeated or unknown arguments."""
        signature = self._signature_cache
        if signature is None:
            return list(args), kwargs
        names, keywords = signature
        if not kwargs and len(args) == len(names) and not keywords:
            return list(args), kwargs  # the common call: every input by position

        def takes() -> str:  # for a message only
            return (f"{printable(self.name)} takes {len(names)} input(s) "
                    f"({', '.join(map(printable, names))})"
                    + (f" and keyword input(s) ({', '.join(map(printable, keywords))})"
                       if keywords else ""))
        if len(args) > len(names):
            raise VkDelegateError(f"{takes()}; got {len(args)} positional")
        missing = object()
        slots = list(args) + [missing] * (len(names) - len(args))
        rest = {}
        for key, value in kwargs.items():
            if key in keywords:
                rest[key] = value
            elif key in names[len(args):]:
                slots[names.index(key)] = value
            elif key in names:
                raise VkDelegateError(f"{takes()}; got {key!r} both by position and by "
                                      f"keyword")
            else:
                raise VkDelegateError(f"{takes()}; got unexpected keyword {key!r}")
        lacking = [n for n, v in zip(names, slots) if v is missing] + [
            k for k in keywords if k not in rest]
        if lacking:
            raise VkDelegateError(f"{takes()}; missing {', '.join(map(printable, lacking))}")
        return slots, rest

    def call_flat(self, flat: list, repeat: int = 1) -> list:
        """Run on flattened user inputs, apply state and input updates, and return the
        flattened user outputs (arrays or tensors, as produced).

        Sets ``last_transfer``: bytes this call moved between host and device,
        ``upload_bytes``/``download_bytes`` (delegate inputs, outputs and states, as
        the Vulkan runtime counts them, plus ``state_upload_bytes``/
        ``state_download_bytes``: program state read back or written for glue that
        needs it on the host, included in the totals). 0 on the reference executor.
        """
        with self.store.calling():  # a program.close() in another thread waits
            return self._call_flat(flat, repeat)

    def _call_flat(self, flat: list, repeat: int) -> list:
        updates = self.plan.get("input_updates", {})
        if updates:
            check_mutated_inputs_unshared(flat, sorted(int(p) for p in updates))
        store = self.store
        before = (store.upload_bytes, store.download_bytes)
        self._moved = {"upload_bytes": 0, "download_bytes": 0}
        outputs = self.run_flat(flat, repeat)
        for name, index in self.plan.get("state_updates", {}).items():
            if name not in self._bound:  # the device already holds the new value
                if not hasattr(outputs[index], "shape"):
                    raise VkDelegateError(f"state {name!r}: plan output {index} is "
                                          f"{type(outputs[index]).__name__}, not a tensor")
                store.set(self._fqn[name], outputs[index])
        up, down = store.upload_bytes - before[0], store.download_bytes - before[1]
        self.last_transfer = {"upload_bytes": self._moved["upload_bytes"] + up,
                              "download_bytes": self._moved["download_bytes"] + down,
                              "state_upload_bytes": up, "state_download_bytes": down}
        for pos, index in self.plan.get("input_updates", {}).items():
            target, new = flat[int(pos)], outputs[index]
            try:
                if _is_torch_tensor(target):
                    target.copy_(to_torch(new))
                else:
                    np.copyto(target, to_numpy(new))
            except (TypeError, RuntimeError, ValueError) as exc:
                raise VkDelegateError(f"input {pos}: cannot write its new value back "
                                      f"(plan output {index}): {exc}") from exc
        return [outputs[i] for i in self.plan["user_outputs"]]
