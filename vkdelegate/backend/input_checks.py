"""Check a call's inputs against the dtypes and shapes a method was exported with.

Static dims must match exactly; a dynamic dim (exported with ``torch.export.Dim``)
must lie in its range, every use of one symbol must have the same size, and a derived
size (``2*T``, ``T + 1``: ``{"affine": [s, a, b]}``, a*s + b) must be that of the
symbol's size, or, where no input has the symbol itself, give a size in its range. A
mismatch raises VkDelegateError naming the input, the dim and the allowed range,
before anything runs (a delegate sized for the upper bound must never see more).
Torch-free: inputs are checked through ``.shape`` and ``.dtype``, and a torch tensor
(when torch is imported) must be dense and hold data.
"""
from __future__ import annotations

import sys

from vkdelegate.errors import VkDelegateError, printable

_DENSE_ONLY = "only dense (strided) tensors can be passed"


def dtype_of(value) -> str:
    """numpy-style dtype name of a numpy array or torch tensor."""
    name = str(value.dtype)
    return name.replace("torch.", "")


def unusable_tensor(value) -> "str | None":
    """Why a torch tensor cannot be a call's input, or None (for anything else too).

    A meta tensor has no data, and a sparse, nested or mkldnn tensor has no dense
    buffer to hand to numpy: refused by name here instead of failing as
    NotImplementedError, TypeError or RuntimeError when it is read. (``.shape`` of a
    nested tensor raises, so this runs before the shape is looked at.) So is a tensor
    subclass with its own ``__torch_dispatch__`` (a FakeTensor, a torchao quantized
    tensor, a wrapper such as TwoTensor): its data is not one plain buffer, and
    ``.numpy()`` refuses it. nn.Parameter and subclasses that only override
    ``__torch_function__`` are plain tensors underneath and pass.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    if type(value).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return (f"is a {type(value).__name__}, a tensor subclass with its own "
                f"__torch_dispatch__, which holds no plain data to pass; give a plain "
                f"torch.Tensor")
    if value.is_nested:
        return f"is a nested tensor; {_DENSE_ONLY}"
    if value.layout != torch.strided:
        return f"has layout {value.layout}; {_DENSE_ONLY} (call .to_dense() first)"
    if value.device.type == "meta":
        return "is on the meta device, which holds no data"
    return None


def _range_text(lo, hi) -> str:
    return f"{lo}..{hi if hi is not None else 'inf'}"


def affine_text(sym: str, a: int, b: int, dim_names: "dict | None" = None) -> str:
    """``2*T``, ``T + 1``: a derived size, in the ``Dim``'s name where known."""
    name = printable((dim_names or {}).get(sym, sym))
    if not name.isidentifier():
        name = f"({name})"  # a Dim export named by its own expression ("T - 1")
    text = name if a == 1 else f"{a}*{name}"
    return text + (f" + {b}" if b > 0 else f" - {-b}" if b < 0 else "")


def describe(spec: dict, ranges: dict, dim_names: "dict | None" = None) -> str:
    """An input's expected type, e.g. ``float32[3, 2..40, 2*T]``."""
    if "const" in spec:
        return repr(spec["const"])
    dims = []
    for want in spec["shape"]:
        if isinstance(want, int):
            dims.append(str(want))
        elif "sym" in want:
            dims.append(_range_text(*ranges.get(want["sym"], (0, None))))
        elif "affine" in want:
            dims.append(affine_text(*want["affine"], dim_names))
        else:
            dims.append(printable(want["expr"]))
    return f"{printable(spec['dtype'])}[{', '.join(dims)}]"


def _sym_text(sym: str, dim_names: dict) -> str:
    """``batch (s77)`` for a symbol of a named ``Dim``, else the symbol."""
    return (f"{printable(dim_names[sym])} ({printable(sym)})" if sym in dim_names
            else printable(sym))


def check_inputs(values: list, specs: list[dict], ranges: dict,
                 dim_names: "dict | None" = None) -> None:
    """Raise VkDelegateError unless ``values`` fit ``specs``.

    values: the flattened user inputs (numpy arrays or torch tensors).
    specs: per input {"name": str, "dtype": str, "shape": [int | {"sym": str} |
        {"affine": [str, a, b]} | {"expr": str}]}, or {"name": str, "const": value}
        for a Python scalar input that export specialized. An "expr" (a size of
        several symbols, e.g. s0*s1) is not checked; lowering warned of it.
    ranges: symbol -> [low, high or None].
    dim_names: symbol -> the ``torch.export.Dim`` name it came from, for messages.
    """
    dim_names = dim_names or {}
    if len(values) != len(specs):
        raise VkDelegateError(f"expected {len(specs)} inputs, got {len(values)}")
    bound: dict[str, tuple[int, str]] = {}
    derived = []  # (where, size, [symbol, a, b]): checked once every symbol is bound
    for value, spec in zip(values, specs):
        name = spec["name"]
        if "const" in spec:
            if type(value) is not type(spec["const"]) or value != spec["const"]:
                raise VkDelegateError(f"input {name!r} was exported as the constant "
                                      f"{spec['const']!r}; got {value!r} (export again "
                                      f"to use another value)")
            continue
        def expected(name=name, spec=spec) -> str:  # for a message only: describe is slow
            return f" (input {name!r} is {describe(spec, ranges, dim_names)})"
        problem = unusable_tensor(value)
        if problem is not None:
            raise VkDelegateError(f"input {name!r} {problem}")
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise VkDelegateError(f"input {name!r} must be a tensor or numpy array, got "
                                  f"{type(value).__name__}")
        if dtype_of(value) != spec["dtype"]:
            raise VkDelegateError(f"input {name!r} has dtype {dtype_of(value)}, expected "
                                  f"{describe(spec, ranges, dim_names)}")
        shape = tuple(value.shape)
        if len(shape) != len(spec["shape"]):
            raise VkDelegateError(f"input {name!r} has rank {len(shape)}, expected "
                                  f"{len(spec['shape'])}{expected()}")
        for d, (size, want) in enumerate(zip(shape, spec["shape"])):
            if isinstance(want, int):
                if size != want:
                    raise VkDelegateError(f"input {name!r} dim {d} is {size}, expected "
                                          f"{want}, a static size{expected()}")
                continue
            if "affine" in want:
                derived.append((f"input {name!r} dim {d}", size, want["affine"]))
                continue
            sym = want.get("sym")
            if sym is None:
                continue  # a size of several symbols ("expr"), which is not checked
            lo, hi = ranges.get(sym, (0, None))
            if size < lo or (hi is not None and size > hi):
                raise VkDelegateError(f"input {name!r} dim {d} is {size}, allowed range "
                                      f"{_range_text(lo, hi)} of dynamic size "
                                      f"{_sym_text(sym, dim_names)}{expected()}")
            if sym in bound and bound[sym][0] != size:
                raise VkDelegateError(f"input {name!r} dim {d} is {size} but "
                                      f"{bound[sym][1]} is {bound[sym][0]}; both are the "
                                      f"same dynamic size {_sym_text(sym, dim_names)}")
            bound.setdefault(sym, (size, f"input {name!r} dim {d}"))
    _check_derived(derived, bound, ranges, dim_names)


def _check_derived(derived: list, bound: dict, ranges: dict, dim_names: dict) -> None:
    """Each derived size a*s + b against the size of s: the size an input gives s
    itself, else the one the first derived size of s gives it (which must be a*s + b
    for an s in its range)."""
    for where, size, (sym, a, b) in derived:
        text = affine_text(sym, a, b, dim_names)
        if sym in bound:
            value, source = bound[sym]
            if size != a * value + b:
                raise VkDelegateError(f"{where} is {size}, expected {text} = "
                                      f"{a * value + b} for {_sym_text(sym, dim_names)} "
                                      f"= {value}, from {source}")
            continue
        lo, hi = ranges.get(sym, (0, None))
        value, rest = divmod(size - b, a)
        if rest or value < lo or (hi is not None and value > hi):
            few = hi is not None and hi - lo < 3
            sizes = ", ".join(str(a * v + b) for v in range(lo, hi + 1 if few else lo + 2))
            if not few:
                sizes += ", ..." + (f", {a * hi + b}" if hi is not None else "")
            raise VkDelegateError(f"{where} is {size}, expected {text} for "
                                  f"{_sym_text(sym, dim_names)} in {_range_text(lo, hi)} "
                                  f"({sizes})")
        bound[sym] = (value, f"{where} = {text}")
