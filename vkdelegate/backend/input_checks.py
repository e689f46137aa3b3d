"""Check a call's inputs against the dtypes and shapes a method was exported with.

Static dims must match exactly; a dynamic dim (exported with ``torch.export.Dim``)
must lie in its range, and every use of one symbol must have the same size. A
mismatch raises VkDelegateError naming the input, the dim and the allowed range,
before anything runs (a delegate sized for the upper bound must never see more).
Torch-free: inputs are checked through ``.shape`` and ``.dtype`` only.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError


def dtype_of(value) -> str:
    """numpy-style dtype name of a numpy array or torch tensor."""
    name = str(value.dtype)
    return name.replace("torch.", "")


def _range_text(lo, hi) -> str:
    return f"{lo}..{hi if hi is not None else 'inf'}"


def describe(spec: dict, ranges: dict) -> str:
    """An input's expected type, e.g. ``float32[3, 2..40]``."""
    if "const" in spec:
        return repr(spec["const"])
    dims = []
    for want in spec["shape"]:
        if isinstance(want, int):
            dims.append(str(want))
        elif "sym" in want:
            dims.append(_range_text(*ranges.get(want["sym"], (0, None))))
        else:
            dims.append(want["expr"])
    return f"{spec['dtype']}[{', '.join(dims)}]"


def _sym_text(sym: str, dim_names: dict) -> str:
    """``batch (s77)`` for a symbol of a named ``Dim``, else the symbol."""
    return f"{dim_names[sym]} ({sym})" if sym in dim_names else sym


def check_inputs(values: list, specs: list[dict], ranges: dict,
                 dim_names: "dict | None" = None) -> None:
    """Raise VkDelegateError unless ``values`` fit ``specs``.

    values: the flattened user inputs (numpy arrays or torch tensors).
    specs: per input {"name": str, "dtype": str, "shape": [int | {"sym": str} |
        {"expr": str}]}, or {"name": str, "const": value} for a Python scalar input
        that export specialized.
    ranges: symbol -> [low, high or None].
    dim_names: symbol -> the ``torch.export.Dim`` name it came from, for messages.
    """
    dim_names = dim_names or {}
    if len(values) != len(specs):
        raise VkDelegateError(f"expected {len(specs)} inputs, got {len(values)}")
    bound: dict[str, tuple[int, str]] = {}
    for value, spec in zip(values, specs):
        name = spec["name"]
        if "const" in spec:
            if type(value) is not type(spec["const"]) or value != spec["const"]:
                raise VkDelegateError(f"input {name!r} was exported as the constant "
                                      f"{spec['const']!r}; got {value!r} (export again "
                                      f"to use another value)")
            continue
        expected = f" (input {name!r} is {describe(spec, ranges)})"
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise VkDelegateError(f"input {name!r} must be a tensor or numpy array, got "
                                  f"{type(value).__name__}")
        if dtype_of(value) != spec["dtype"]:
            raise VkDelegateError(f"input {name!r} has dtype {dtype_of(value)}, expected "
                                  f"{describe(spec, ranges)}")
        shape = tuple(value.shape)
        if len(shape) != len(spec["shape"]):
            raise VkDelegateError(f"input {name!r} has rank {len(shape)}, expected "
                                  f"{len(spec['shape'])}{expected}")
        for d, (size, want) in enumerate(zip(shape, spec["shape"])):
            if isinstance(want, int):
                if size != want:
                    raise VkDelegateError(f"input {name!r} dim {d} is {size}, expected "
                                          f"{want}, a static size{expected}")
                continue
            sym = want.get("sym")
            if sym is None:
                # A derived size (e.g. 2*s0) is implied by the symbols it uses.
                continue
            lo, hi = ranges.get(sym, (0, None))
            if size < lo or (hi is not None and size > hi):
                raise VkDelegateError(f"input {name!r} dim {d} is {size}, allowed range "
                                      f"{_range_text(lo, hi)} of dynamic size "
                                      f"{_sym_text(sym, dim_names)}{expected}")
            if sym in bound and bound[sym][0] != size:
                raise VkDelegateError(f"input {name!r} dim {d} is {size} but "
                                      f"{bound[sym][1]} is {bound[sym][0]}; both are the "
                                      f"same dynamic size {_sym_text(sym, dim_names)}")
            bound.setdefault(sym, (size, f"input {name!r} dim {d}"))
