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

import numpy as np

from vkdelegate.backend import glue_ops, pytree_spec
from vkdelegate.backend.input_checks import check_inputs
from vkdelegate.errors import VkDelegateError

_SPECIAL_KEYS = ("dtype", "device", "layout", "memory_format")


def _is_torch_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def to_numpy(value) -> np.ndarray:
    """A delegate input: torch tensors become contiguous numpy arrays; ints 0-d arrays."""
    # np.require, not np.ascontiguousarray: the latter turns 0-d arrays into 1-d.
    if _is_torch_tensor(value):
        return np.require(value.detach().cpu().resolve_conj().numpy(), requirements="C")
    return np.require(value, requirements="C")


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
        return torch.device(name)
    elif key == "layout":
        value = getattr(torch, name, None)
        ok = isinstance(value, torch.layout)
    else:
        value = getattr(torch, name, None)
        ok = isinstance(value, torch.memory_format)
    if not ok:
        raise VkDelegateError(f"unknown {key} {name!r}")
    return value


_CASTS = ("float16", "float32")


def _value_name(input_spec: dict) -> str:
    """The glue value an input binds ("value"; older plans used "name" for both)."""
    return input_spec.get("value", input_spec["name"])


def _cast(arrays: list, dtypes: "list | None") -> list:
    """Delegate-boundary casts (force_fp16): dtype per array, None for none."""
    if not dtypes:
        return arrays
    return [a if d is None else a.astype(d) for a, d in zip(arrays, dtypes)]


class MethodRunner:
    """Executes one method's plan.

    plan: the method's JSON-ready dict. constants: name -> array/tensor for glue
    constants. state: name -> array/tensor of mutable buffers (updated after each call).
    delegates: objects with ``execute(list[np.ndarray]) -> list[np.ndarray]``, indexed
    by the plan's delegate nodes. Raises VkDelegateError for a malformed plan.
    """

    def __init__(self, plan: dict, constants: dict, state: dict, delegates: list):
        self.plan = plan
        self.constants = constants
        self.state = state
        self.delegates = delegates
        self._validate()

    def _validate(self) -> None:
        plan = self.plan
        for key in ("inputs", "in_spec", "out_spec", "nodes", "outputs", "user_outputs"):
            if key not in plan:
                raise VkDelegateError(f"method plan lacks {key!r}")
        pytree_spec.validate(plan["in_spec"])
        pytree_spec.validate(plan["out_spec"])
        defined = {_value_name(i) for i in plan["inputs"]} | set(self.constants) | set(
            self.state)
        self._ops = []
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
                self._ops.append(glue_ops.resolve(node["op"]))
            self._check_refs(node.get("args", []), defined, n)
            self._check_refs(node.get("kwargs", {}), defined, n)
            defined.add(node["out"])
        self._check_refs(plan["outputs"], defined, "outputs")

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

    def run_flat(self, flat_inputs: list) -> list:
        """Outputs (the full output tuple, leaves) for flattened inputs."""
        plan = self.plan
        check_inputs(flat_inputs, plan["inputs"], plan.get("ranges", {}))
        env = dict(self.constants)
        env.update(self.state)
        env.update({_value_name(spec): v for spec, v in zip(plan["inputs"], flat_inputs)})
        for node, fn in zip(plan["nodes"], self._ops):
            op = node["op"]
            if op == "delegate":
                args = [to_numpy(self._arg(a, env, False)) for a in node["args"]]
                args = _cast(args, node.get("cast_inputs"))
                outs = self.delegates[node["index"]].execute(args)
                # Own the memory: a runtime may reuse its output buffers on the next run.
                env[node["out"]] = _cast([np.require(o, requirements=["C", "W", "O"])
                                          for o in outs], node.get("cast_outputs"))
            elif op == "getitem":
                seq, index = node["args"]
                env[node["out"]] = env[seq["v"]][index]
            else:
                torch_side = op not in glue_ops.BUILTINS and op not in glue_ops.TORCH_FREE
                args = [self._arg(a, env, torch_side) for a in node.get("args", [])]
                kwargs = {k: self._arg(a, env, torch_side)
                          for k, a in node.get("kwargs", {}).items()}
                try:
                    env[node["out"]] = fn(*args, **kwargs)
                except Exception as exc:
                    raise VkDelegateError(f"CPU op {op} (node {node['out']}) failed: "
                                          f"{type(exc).__name__}: {exc}") from exc
        return [self._arg(a, env, False) for a in plan["outputs"]]

    def __call__(self, *args, **kwargs):
        """Run the method like the original module: same arguments, same structure out.

        Torch tensors in give torch tensors out; numpy arrays in give numpy arrays out.
        """
        flat = pytree_spec.flatten((tuple(args), dict(kwargs)), self.plan["in_spec"],
                                   "arguments")
        want_torch = any(_is_torch_tensor(v) for v in flat) or (
            not flat and "torch" in sys.modules)
        convert = to_torch if want_torch else to_numpy
        leaves = [convert(v) for v in self.call_flat(flat)]
        return pytree_spec.unflatten(leaves, self.plan["out_spec"])

    def call_flat(self, flat: list) -> list:
        """Run on flattened user inputs, apply state and input updates, and return the
        flattened user outputs (arrays or tensors, as produced)."""
        outputs = self.run_flat(flat)
        for name, index in self.plan.get("state_updates", {}).items():
            self.state[name] = outputs[index]
        for pos, index in self.plan.get("input_updates", {}).items():
            target, new = flat[int(pos)], outputs[index]
            if _is_torch_tensor(target):
                target.copy_(to_torch(new))
            else:
                np.copyto(target, to_numpy(new))
        return [outputs[i] for i in self.plan["user_outputs"]]
