"""Nested input/output structure of a method, as JSON, without torch.

A loaded program must rebuild what the original module returned (tuples, lists,
dicts, None) and flatten what the caller passes in, in an environment that may lack
torch. torch's TreeSpec is converted once, at lowering, to a small JSON tree:

    {"t": "leaf"} | {"t": "none"} | {"t": "tuple"|"list", "c": [...]}
    | {"t": "dict", "k": [str keys], "c": [...]}
    | {"t": "record", "n": class name, "k": [str keys], "c": [...]}
    | {"t": "namedtuple", "n": class name, "k": [field names], "c": [...]}
    | {"t": "structseq", "n": class name, "k": [field names], "c": [...]}

"record" is a dict subclass that torch's pytree flattens to its keys, as HF
transformers' ModelOutput (``BaseModelOutputWithPooling``, ``CausalLMOutput``...): a
loaded program returns it as a ``Record`` (keys, attributes and int indices, as
ModelOutput allows), since the class itself (and transformers) need not be importable
where the program runs, and a program file names no code to import. "namedtuple" is
rebuilt as a ``collections.namedtuple`` of the same name and fields. "structseq" is
one of torch's ``torch.return_types`` (what ``torch.topk``, ``torch.sort`` and
``x.max(dim)`` return): a call with torch tensors gets that class back, a call with
numpy arrays (where torch may be absent) a namedtuple of the same name and fields, so
``values, indices = out``, ``out.values`` and ``out[0]`` read the same either way.
"""
from __future__ import annotations

import collections
import functools
import keyword
import sys

from vkdelegate.errors import VkDelegateError, printable

_SEQUENCES = {"tuple": tuple, "list": list}
_KINDS = ("leaf", "none", "tuple", "list", "dict", "record", "namedtuple", "structseq")
_KEYED = ("dict", "record", "namedtuple", "structseq")
_NAMED = ("record", "namedtuple", "structseq")
#: The longest class name a record or namedtuple may carry.
MAX_NAME = 200


class Record(dict):
    """A method output that was a ModelOutput-like record (see the module docstring):
    a dict of its fields in order, also readable as attributes (``out.logits``) and by
    int index or slice over the values (``out[0]``, as ModelOutput's ``to_tuple``).
    ``record_name``: the class name the lowered module returned."""

    __slots__ = ("record_name",)

    def __init__(self, name: str, items):
        super().__init__(items)
        self.record_name = name

    def __getattr__(self, key):
        # Only for names that are not attributes: record_name itself before it is set
        # (pickle and copy make the object first) must not recurse.
        if key.startswith("__") or key == "record_name":
            raise AttributeError(key)
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            raise AttributeError(f"{getattr(self, 'record_name', 'Record')} has no field "
                                 f"{key!r} (its fields: {', '.join(self)})") from None

    def __reduce__(self):
        return (Record, (self.record_name, list(self.items())))

    def __getitem__(self, key):
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple:
        """The values, in field order."""
        return tuple(self.values())

    def __repr__(self) -> str:
        return f"{self.record_name}({', '.join(f'{k}={v!r}' for k, v in self.items())})"


def _register_with_torch() -> None:
    """Make Record a pytree node of torch's (``torch.utils._pytree.tree_leaves`` of an
    output then reaches its tensors), once, where torch is already imported: this
    module does not import torch itself."""
    global _registered
    if _registered or "torch" not in sys.modules:
        return
    _registered = True
    from torch.utils import _pytree

    _pytree.register_pytree_node(
        Record, lambda r: (list(r.values()), (r.record_name, list(r))),
        lambda values, context: Record(context[0], zip(context[1], values)),
        serialized_type_name="vkdelegate.Record")


_registered = False


@functools.lru_cache(maxsize=64)
def _namedtuple(name: str, fields: tuple):
    return collections.namedtuple(name, fields)


def _name_ok(name) -> bool:
    return isinstance(name, str) and len(name) <= MAX_NAME and name.isidentifier() \
        and not keyword.iskeyword(name)


def _structseq_fields(cls) -> "list | None":
    """The field names of ``cls`` when it is one of torch's ``torch.return_types``
    structseqs with named fields only (``topk``: values, indices), else None."""
    if not isinstance(cls, type) or cls.__module__ != "torch.return_types" \
            or not _name_ok(cls.__name__):
        return None
    fields = getattr(cls, "__match_args__", None)
    if not isinstance(fields, tuple) or getattr(cls, "n_fields", None) != len(fields) \
            or getattr(cls, "n_unnamed_fields", None) != 0 \
            or not all(_name_ok(f) for f in fields):
        return None
    return list(fields)


def _torch_structseq(name: str, fields: list):
    """``torch.return_types.<name>`` when torch is imported and that class has these
    fields (a file from another torch may name one this torch lacks), else None."""
    torch = sys.modules.get("torch")
    cls = getattr(getattr(torch, "return_types", None), name, None)
    return cls if _structseq_fields(cls) == fields else None


def _str_keys(keys, what: str) -> list:
    if not all(isinstance(k, str) for k in keys):
        raise VkDelegateError(f"{what} keys must be strings to be saved, got {keys}")
    return list(keys)


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
    if kind in (dict, collections.OrderedDict):
        return {"t": "dict", "k": _str_keys(spec.context, "dict"), "c": children}
    context = spec.context
    if kind is collections.namedtuple and isinstance(context, type) \
            and _name_ok(context.__name__):
        return {"t": "namedtuple", "n": context.__name__,
                "k": _str_keys(context._fields, "namedtuple"), "c": children}
    fields = _structseq_fields(kind)
    if fields is not None:
        return {"t": "structseq", "n": kind.__name__, "k": fields, "c": children}
    if isinstance(kind, type) and issubclass(kind, dict) and _name_ok(kind.__name__) \
            and isinstance(context, (list, tuple)) and len(context) == len(children):
        return {"t": "record", "n": kind.__name__, "k": _str_keys(context, kind.__name__),
                "c": children}
    name = getattr(context, "__name__", None) if kind is collections.namedtuple \
        else getattr(kind, "__name__", str(kind))
    raise VkDelegateError(f"container type {name} in a method's inputs or outputs is not "
                          f"supported (tuple, list, dict, namedtuple, torch.return_types "
                          f"and dict-like records such as HF ModelOutput are)")


def validate(spec) -> None:
    """Raise VkDelegateError unless ``spec`` is a well-formed tree (read from a file)."""
    if not isinstance(spec, dict) or spec.get("t") not in _KINDS:
        raise VkDelegateError(f"malformed tree spec {printable(str(spec)[:80])}")
    kind = spec["t"]
    if kind in ("leaf", "none"):
        return
    children = spec.get("c")
    if not isinstance(children, list):
        raise VkDelegateError("malformed tree spec: children must be a list")
    if kind in _KEYED:
        keys = spec.get("k")
        if not isinstance(keys, list) or len(keys) != len(children) or not all(
                isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
            raise VkDelegateError(f"malformed tree spec: bad {kind} keys")
    if kind in _NAMED:
        name = spec.get("n")
        if not _name_ok(name):
            raise VkDelegateError(f"malformed tree spec: {kind} name "
                                  f"{printable(str(name)[:80])} is not a Python identifier")
        if kind in ("namedtuple", "structseq"):
            try:
                _namedtuple(name, tuple(keys))
            except (ValueError, TypeError) as exc:
                raise VkDelegateError(f"malformed tree spec: namedtuple {name} fields: "
                                      f"{printable(str(exc)[:120])}") from None
    for child in children:
        validate(child)


def num_leaves(spec: dict) -> int:
    if spec["t"] == "leaf":
        return 1
    return sum(num_leaves(c) for c in spec.get("c", []))


def flatten(value, spec: dict, where: str = "input") -> list:
    """The leaves of ``value``, checked against ``spec``; VkDelegateError on mismatch
    (naming the item, e.g. ``arguments[0][1]``)."""
    leaves: list = []
    _flatten(value, spec, (where,), leaves)
    return leaves


def _flatten(value, spec: dict, path: tuple, leaves: list) -> None:
    """``flatten`` into ``leaves``; ``path``: the item's name in parts (where, then an
    index or repr'd key per level), joined only for a message."""
    kind = spec["t"]
    if kind == "leaf":
        leaves.append(value)
        return
    if kind == "none":
        if value is not None:
            raise VkDelegateError(f"{''.join(path)}: expected None, got "
                                  f"{type(value).__name__}")
        return
    if kind in ("dict", "record"):
        if not isinstance(value, dict) or set(value) != set(spec["k"]):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise VkDelegateError(f"{''.join(path)}: expected a dict with keys "
                                  f"{spec['k']}, got {got}")
        for k, child in zip(spec["k"], spec["c"]):
            _flatten(dict.__getitem__(value, k), child, path + (f"[{k!r}]",), leaves)
        return
    if not isinstance(value, (tuple, list)) or len(value) != len(spec["c"]):
        got = (f"{len(value)} items" if isinstance(value, (tuple, list))
               else type(value).__name__)
        raise VkDelegateError(f"{''.join(path)}: expected {len(spec['c'])} items, "
                              f"got {got}")
    for i, (item, child) in enumerate(zip(value, spec["c"])):
        if child["t"] == "leaf":
            leaves.append(item)
        else:
            _flatten(item, child, path + (f"[{i}]",), leaves)


def unflatten(leaves: list, spec: dict, torch_types: bool = False):
    """Rebuild the nested structure of ``spec`` from ``leaves`` (in order).

    torch_types: rebuild a "structseq" as its ``torch.return_types`` class (the caller
    passed torch tensors, so torch is imported); otherwise, or where torch has no such
    class, as a namedtuple of the same name and fields."""
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
        if kind == "record":
            _register_with_torch()
            return Record(s["n"], zip(s["k"], children))
        if kind == "structseq" and torch_types:
            cls = _torch_structseq(s["n"], s["k"])
            if cls is not None:
                return cls(children)
        if kind in ("namedtuple", "structseq"):
            return _namedtuple(s["n"], tuple(s["k"]))(*children)
        return _SEQUENCES[kind](children)

    return build(spec)
