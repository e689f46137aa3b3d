"""Which mutable buffers of a method can stay on the GPU between calls.

A buffer the module updates in place (``self.count.add_(1)``) is, in a method plan, a
state value (its value before the call) and a ``state_updates`` entry naming the
output that holds its new value. When one delegate both reads the state and computes
its new value, the runtime can keep the state in that delegate's input memory
(``DelegateGraph.bind_state``): the glue then neither uploads it nor, unless another
node or a user output needs the new value, downloads it.

A state stays on the host (passed to the delegates every call, as before) when it is
read by a CPU node, by two delegates, twice by one, or returned as is; when its new
value comes from a CPU node or from another delegate than the one reading it; or
when the executor or the runtime refuses the binding (the reference executor, dtypes
or sizes that differ).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateBinding:
    """One state a delegate keeps on the device.

    name: the state value's name in the plan. input: its position among the delegate
    call's arguments (the graph input index). output: position of its new value in
    the delegate's outputs (the graph output index). download: the new value is also
    read on the host (a user output, a CPU node, another delegate).
    """

    name: str
    input: int
    output: int
    download: bool


def _collect(arg, where, refs: dict) -> None:
    """Record ``where`` for every value ``arg`` references ({"v": name} leaves)."""
    if isinstance(arg, dict):
        if "v" in arg:
            refs.setdefault(arg["v"], []).append(where)
        else:
            for value in arg.values():
                _collect(value, where, refs)
    elif isinstance(arg, list):
        for value in arg:
            _collect(value, where, refs)


def plan_bindings(plan: dict) -> dict[int, list[StateBinding]]:
    """Delegate index -> the states it can keep on the device, for a method plan
    (see ``vkdelegate.backend.interpreter``). Never raises on a plan MethodRunner
    accepted; a state that does not qualify is simply left out."""
    refs: dict[str, list] = {}
    producers = {}
    for n, node in enumerate(plan["nodes"]):
        producers[node["out"]] = node
        if node["op"] == "delegate":
            for pos, arg in enumerate(node.get("args", [])):
                _collect(arg, ("delegate", n, pos), refs)
        else:
            _collect(node.get("args", []), ("node", n), refs)
            _collect(node.get("kwargs", {}), ("node", n), refs)
    for k, arg in enumerate(plan["outputs"]):
        _collect(arg, ("output", k), refs)
    bindings: dict[int, list[StateBinding]] = {}
    for name, k in plan.get("state_updates", {}).items():
        readers = refs.get(name, [])
        if len(readers) != 1 or readers[0][0] != "delegate":
            continue
        _, n, pos = readers[0]
        caller = plan["nodes"][n]
        if caller["args"][pos] != {"v": name}:
            continue
        new = plan["outputs"][k] if isinstance(k, int) and 0 <= k < len(plan["outputs"]) \
            else None
        if not (isinstance(new, dict) and set(new) == {"v"}):
            continue
        item = producers.get(new["v"])
        if item is None or item["op"] != "getitem":
            continue
        seq, index = item["args"]
        if seq != {"v": caller["out"]} or not isinstance(index, int):
            continue
        others = [w for w in refs.get(new["v"], []) if w != ("output", k)]
        bindings.setdefault(caller["index"], []).append(
            StateBinding(name, pos, index, download=bool(others)))
    return bindings
