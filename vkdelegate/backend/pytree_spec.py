"""Nested input/output structure of a method, as JSON, without torch.

A loaded program must rebuild what the original module returned (tuples, lists,
dicts, None) and flatten what the caller passes in, in an environment that may lack
torch. torch's TreeSpec is converted once, at lowering, to a small JSON tree:

    {"t": "leaf"} | {"t": "none"} | {"t": "tuple"|"list", "c": [...]}
    | {"t": "dict", "k": [str keys], "c": [...]}
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError

_SEQUENCES = {"tuple": tuple, "list": list}


def from_treespec(spec) -> dict:
    """Convert a torch.utils._pytree.TreeSpec; VkDelegateError for other containers."""
    if spec.is_leaf():
        return {"t": "leaf"}
    kind = spec.type
    children = [from_treespec(spec.child(i)) for i in range(spec.num_children)]
    if kind is type(None):
        return {"t": "none"}
    if kind in (tuple, list):
        return {"t": kind.__name__, "c": children}
    if kind is dict:
        keys = list(spec.context)
        if not all(isinstance(k, str) for k in keys):
            raise VkDelegateError(f"dict keys must be strings to be saved, got {keys}")
        return {"t": "dict", "k": keys, "c": children}
    raise VkDelegateError(f"container type {kind.__name__} in a method's inputs or "
                          f"outputs is not supported (use tuple, list or dict)")


def validate(spec) -> None:
    """Raise VkDelegateError unless ``spec`` is a well-formed tree (read from a file)."""
    if not isinstance(spec, dict) or spec.get("t") not in ("leaf", "none", "tuple",
                                                            "list", "dict"):
        raise VkDelegateError(f"malformed tree spec {str(spec)[:80]}")
    if spec["t"] in ("tuple", "list", "dict"):
        children = spec.get("c")
        if not isinstance(children, list):
            raise VkDelegateError("malformed tree spec: children must be a list")
        if spec["t"] == "dict":
            keys = spec.get("k")
            if not isinstance(keys, list) or len(keys) != len(children) or not all(
                    isinstance(k, str) for k in keys):
                raise VkDelegateError("malformed tree spec: bad dict keys")
        for child in children:
            validate(child)


def num_leaves(spec: dict) -> int:
    if spec["t"] == "leaf":
        return 1
    return sum(num_leaves(c) for c in spec.get("c", []))


def flatten(value, spec: dict, where: str = "input") -> list:
    """The leaves of ``value``, checked against ``spec``; VkDelegateError on mismatch."""
    kind = spec["t"]
    if kind == "leaf":
        return [value]
    if kind == "none":
        if value is not None:
            raise VkDelegateError(f"{where}: expected None, got {type(value).__name__}")
        return []
    if kind == "dict":
        if not isinstance(value, dict) or set(value) != set(spec["k"]):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise VkDelegateError(f"{where}: expected a dict with keys {spec['k']}, "
                                  f"got {got}")
        items = [(f"{where}[{k!r}]", value[k]) for k in spec["k"]]
    else:
        if not isinstance(value, (tuple, list)) or len(value) != len(spec["c"]):
            got = (f"{len(value)} items" if isinstance(value, (tuple, list))
                   else type(value).__name__)
            raise VkDelegateError(f"{where}: expected {len(spec['c'])} items, got {got}")
        items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    leaves = []
    for (name, item), child in zip(items, spec["c"]):
        leaves.extend(flatten(item, child, name))
    return leaves


def unflatten(leaves: list, spec: dict):
    """Rebuild the nested structure of ``spec`` from ``leaves`` (in order)."""
    it = iter(leaves)

    def build(s):
        kind = s["t"]
        if kind == "leaf":
            return next(it)
        if kind == "none":
            return None
        children = [build(c) for c in s["c"]]
        if kind == "dict":
            return dict(zip(s["k"], children))
        return _SEQUENCES[kind](children)

    return build(spec)
