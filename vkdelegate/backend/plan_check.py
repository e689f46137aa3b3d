"""Check a method plan's structure once, before anything runs it.

A plan read from a program file is JSON that passed a CRC, not proof that every field
the interpreter reads is there with the right type. ``check_plan`` walks exactly the
fields ``MethodRunner`` and ``check_inputs`` read and raises VkDelegateError naming
the field path (``plan.inputs[0].shape``), so a crafted file fails at load with a
clear error instead of a KeyError or TypeError at some later call.
"""
from __future__ import annotations

from vkdelegate.backend import pytree_spec
from vkdelegate.dtypes import TABLE
from vkdelegate.errors import VkDelegateError, printable

_SPECIAL_KEYS = ("dtype", "device", "layout", "memory_format")
#: A static input size must be below this: the device addresses elements with 32-bit
#: ints, so no lowered program has a larger dimension.
MAX_DIM = 2 ** 31
_SCALARS = (type(None), bool, int, float, str)


def _fail(path: str, problem: str):
    raise VkDelegateError(f"malformed plan: {path} {problem}")


def _need(container: dict, key: str, kind, path: str, optional: bool = False):
    """``container[key]`` if it has type ``kind`` (None for a missing optional key)."""
    if key not in container:
        if optional:
            return None
        _fail(f"{path}.{key}", "is missing")
    value = container[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        _fail(f"{path}.{key}", f"must be {names}, got {type(value).__name__}")
    return value


def _index(value, size: int, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
        _fail(path, f"must be an index below {size}, got {value!r}")
    return value


def check_arg(arg, path: str, refs_only: bool = False) -> None:
    """An argument: a JSON scalar, a list of arguments, {"v": name} or one
    {"dtype"|"device"|"layout"|"memory_format": name}; ``refs_only``: {"v": name}."""
    if isinstance(arg, dict):
        if set(arg) == {"v"} and isinstance(arg["v"], str):
            return
        if not refs_only and len(arg) == 1 and next(iter(arg)) in _SPECIAL_KEYS \
                and isinstance(next(iter(arg.values())), str):
            return
        _fail(path, f"is not a value reference: {printable(str(arg)[:60])}")
    if refs_only:
        _fail(path, f"must be a value reference {{'v': name}}, got {printable(str(arg)[:60])}")
    if isinstance(arg, list):
        for i, a in enumerate(arg):
            check_arg(a, f"{path}[{i}]")
    elif not isinstance(arg, _SCALARS):
        _fail(path, f"has type {type(arg).__name__}")


def _check_input(spec, path: str) -> None:
    if not isinstance(spec, dict):
        _fail(path, "must be a dict")
    _need(spec, "name", str, path)
    _need(spec, "value", str, path, optional=True)
    if "const" in spec:
        if not isinstance(spec["const"], _SCALARS):
            _fail(f"{path}.const", "must be a JSON scalar")
        return
    dtype = _need(spec, "dtype", str, path)
    if dtype not in TABLE:
        # The lowering writes only the dtype table's names (to_backend.py refuses others).
        _fail(f"{path}.dtype", f"is {printable(dtype)}, not one of the dtypes a program "
                               f"holds ({', '.join(sorted(TABLE))})")
    for d, dim in enumerate(_need(spec, "shape", list, path)):
        where = f"{path}.shape[{d}]"
        if isinstance(dim, dict) and len(dim) == 1 and isinstance(
                dim.get("sym", dim.get("expr")), str):
            continue
        if isinstance(dim, dict) and len(dim) == 1 and "affine" in dim:
            _check_affine(dim["affine"], f"{where}.affine")
            continue
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < MAX_DIM:
            _fail(where, f"must be a size below 2^31, {{'sym': s}}, {{'affine': [s, a, "
                         f"b]}} or {{'expr': e}}, got {printable(str(dim)[:40])}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_affine(value, where: str) -> None:
    """A derived size a*s + b: [symbol, a, b], ints 1 <= a < 2^31 and |b| < 2^31."""
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)
            and _is_int(value[1]) and _is_int(value[2])
            and 1 <= value[1] < MAX_DIM and -MAX_DIM < value[2] < MAX_DIM):
        _fail(where, f"must be [symbol, a, b] with ints 1 <= a < 2^31 and |b| < 2^31, "
                     f"got {printable(str(value)[:40])}")


def _check_node(node, n: int, path: str) -> None:
    if not isinstance(node, dict):
        _fail(path, "must be a dict")
    op = _need(node, "op", str, path)
    _need(node, "out", str, path)
    args = _need(node, "args", list, path, optional=op != "delegate" and op != "getitem")
    if op == "delegate":
        for i, a in enumerate(args):
            check_arg(a, f"{path}.args[{i}]", refs_only=True)
        for key in ("cast_inputs", "cast_outputs"):
            if node.get(key) is not None and not isinstance(node[key], list):
                _fail(f"{path}.{key}", "must be a list")
    elif op == "getitem":
        if len(args) != 2:
            _fail(f"{path}.args", f"must be [value, index], got {len(args)} items")
        check_arg(args[0], f"{path}.args[0]", refs_only=True)
        if not isinstance(args[1], int) or isinstance(args[1], bool):
            _fail(f"{path}.args[1]", f"must be an int, got {args[1]!r}")
        if not 0 <= args[1] < 2 ** 31:
            # The lowering writes the position of an output (export's getitem).
            _fail(f"{path}.args[1]", f"must be an output position in 0..2^31 - 1, got "
                                     f"{args[1]}")
    else:
        check_arg(args or [], f"{path}.args")
        kwargs = _need(node, "kwargs", dict, path, optional=True) or {}
        for k, a in kwargs.items():
            check_arg(a, f"{path}.kwargs[{k!r}]")


def check_plan(plan, state_names) -> None:
    """Raise VkDelegateError unless ``plan`` has every field the interpreter reads,
    with the right types and indices in range (see ``vkdelegate.backend.interpreter``
    for the plan's form). ``state_names``: the method's mutable buffers."""
    if not isinstance(plan, dict):
        _fail("plan", f"must be a dict, got {type(plan).__name__}")
    inputs = _need(plan, "inputs", list, "plan")
    for i, spec in enumerate(inputs):
        _check_input(spec, f"plan.inputs[{i}]")
    for sym, rng in (_need(plan, "ranges", dict, "plan", optional=True) or {}).items():
        ok = isinstance(rng, list) and len(rng) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in rng[:1]) and (
            rng[1] is None or isinstance(rng[1], int) and not isinstance(rng[1], bool))
        if not ok:
            _fail(f"plan.ranges[{sym!r}]", f"must be [low, high or null], got {rng!r}")
    for sym, name in (_need(plan, "dim_names", dict, "plan", optional=True) or {}).items():
        if not isinstance(name, str):
            _fail(f"plan.dim_names[{sym!r}]", f"must be a str, got {type(name).__name__}")
    for key in ("in_spec", "out_spec"):
        if key not in plan:
            _fail(f"plan.{key}", "is missing")
        try:
            pytree_spec.validate(plan[key])
        except VkDelegateError as exc:
            _fail(f"plan.{key}", str(exc))
    for n, node in enumerate(_need(plan, "nodes", list, "plan")):
        _check_node(node, n, f"plan.nodes[{n}]")
    outputs = _need(plan, "outputs", list, "plan")
    check_arg(outputs, "plan.outputs")
    user = _need(plan, "user_outputs", list, "plan")
    for i, k in enumerate(user):
        _index(k, len(outputs), f"plan.user_outputs[{i}]")
    if pytree_spec.num_leaves(plan["out_spec"]) != len(user):
        _fail("plan.out_spec", f"has {pytree_spec.num_leaves(plan['out_spec'])} leaves "
                               f"but plan.user_outputs has {len(user)}")
    for name, k in (_need(plan, "state_updates", dict, "plan", optional=True) or {}).items():
        if name not in state_names:
            _fail(f"plan.state_updates[{name!r}]", "names no state of the method")
        _index(k, len(outputs), f"plan.state_updates[{name!r}]")
    for name, fqn in (_need(plan, "state_fqn", dict, "plan", optional=True) or {}).items():
        if name not in state_names:
            _fail(f"plan.state_fqn[{name!r}]", "names no state of the method")
        if not isinstance(fqn, str) or not fqn:
            _fail(f"plan.state_fqn[{name!r}]", f"must be a non-empty str, got {fqn!r}")
    for pos, k in (_need(plan, "input_updates", dict, "plan", optional=True) or {}).items():
        where = f"plan.input_updates[{pos!r}]"
        if not (isinstance(pos, str) and pos.isdigit() and int(pos) < len(inputs)):
            _fail(where, f"must be keyed by an input position below {len(inputs)}")
        if "const" in inputs[int(pos)]:
            _fail(where, "updates a constant input")
        _index(k, len(outputs), where)
