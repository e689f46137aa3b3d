"""Describe an fx node of an exported program as a registry ``NodeSpec``.

The registry's rules are torch-free; this module is the one place that turns torch's
node metadata (FakeTensors, SymInts, dtypes) into the plain ``TensorSpec`` / Python
values the rules read.
"""
from __future__ import annotations

import math

import torch

from vkdelegate import dtypes
from vkdelegate.ops.registry import NodeSpec, TensorSpec
from vkdelegate.errors import VkDelegateError

#: torch dtype -> the numpy dtype names used across vkdelegate (vkdelegate.dtypes).
#: Dtypes missing there (complex, ...) keep torch's name, which no op accepts.
TORCH_TO_NAME = {getattr(torch, name): name for name in dtypes.TABLE}


def dtype_name(dtype: torch.dtype) -> str:
    """numpy-style name of a torch dtype ("float32"); torch's name when numpy has none."""
    return TORCH_TO_NAME.get(dtype, str(dtype).replace("torch.", ""))


def dim_upper_bound(dim) -> tuple[int, bool]:
    """(size, dynamic) of one dimension: a plain int, or a SymInt's upper bound.

    Raises VkDelegateError when a dynamic dim has no finite upper bound (delegates size
    their memory for the largest input, so export needs ``Dim(..., max=N)``).
    """
    if isinstance(dim, int):
        return dim, False
    if isinstance(dim, torch.SymInt):
        node = dim.node
        constant = node.maybe_as_int()
        if constant is not None:
            return constant, False
        upper = node.shape_env.bound_sympy(node.expr).upper
        if upper is None or not math.isfinite(float(upper)):
            raise VkDelegateError(f"dynamic size {_label(node)} has no upper bound; "
                                  f"export with torch.export.Dim(..., max=N)")
        return int(upper), True
    raise VkDelegateError(f"unexpected dimension type {type(dim).__name__}")


def dim_name(node) -> "str | None":
    """The user's ``Dim`` name of a SymInt node's symbol (``s77`` -> ``batch``) where
    export kept one, read from its shape environment (ShapeEnv's ``var_to_sources`` and
    ``source_name_to_debug_name``); None otherwise, and on any torch without them."""
    try:
        return symbol_name(node.shape_env, node.expr)
    except AttributeError:
        return None


def symbol_name(env, sym) -> "str | None":
    """The user's ``Dim`` name of symbol ``sym`` in ShapeEnv ``env`` (see ``dim_name``):
    the debug name of an input size it stands for, else the name of the root ``Dim``
    of a derived one (``h`` of an input exported as ``2 * h``, whose symbol has that
    root as its source); None when export kept none."""
    try:
        roots = []
        for source in env.var_to_sources.get(sym, []):
            label = source.name if isinstance(source.name, str) else source.name()
            debug = env.source_name_to_debug_name.get(label)
            if isinstance(debug, str) and debug != str(sym):
                return debug
            if isinstance(label, str) and label.isidentifier() and label != str(sym):
                roots.append(label)
        return roots[0] if roots else None
    except (AttributeError, TypeError):
        return None


def model_call(node: torch.fx.Node) -> "str | None":
    """The model's own call a node was decomposed from (``linalg_inv`` for the
    ``linalg_inv_ex`` node of ``torch.linalg.inv``, ``one_hot`` for the asserts of
    ``F.one_hot``), from the ``torch_fn`` that export records; None where it is the
    node's own op (``sort`` for ``aten.sort.default``) or unknown (a node a pass made)."""
    torch_fn = node.meta.get("torch_fn")
    if not (isinstance(torch_fn, tuple) and len(torch_fn) == 2
            and isinstance(torch_fn[1], str) and "." in torch_fn[1]):
        return None
    kind, fn = torch_fn[1].split(".", 1)
    if kind == "OpOverload" or not fn.isidentifier():
        return None  # an ATen op called by name: the node's op itself
    op = getattr(getattr(node.target, "_schema", None), "name", "").split("::")[-1]
    return None if fn == op else fn


def from_model_call(node: torch.fx.Node) -> str:
    """`` (from the model's linalg_inv)`` after a node's name where ``model_call``
    knows the call it came from, else ""."""
    call = model_call(node)
    return f" (from the model's {call})" if call else ""


def _label(node) -> str:
    """A SymInt node's expression, with the user's ``Dim`` name where export kept one
    (``b (s31)``)."""
    name = dim_name(node)
    return f"{name} ({node.expr})" if name else str(node.expr)


def tensor_spec(val) -> TensorSpec:
    """TensorSpec of a FakeTensor (node.meta['val'])."""
    dims = [dim_upper_bound(d) for d in val.shape]
    return TensorSpec(dtype=dtype_name(val.dtype), shape=tuple(d for d, _ in dims),
                      dynamic=tuple(dyn for _, dyn in dims))


def _describe(value):
    """A node argument as the rules see it: TensorSpec, int, float, bool, str, list."""
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return tensor_spec(val)
        if isinstance(val, torch.SymInt):
            return dim_upper_bound(val)[0]
        if isinstance(val, (int, float, bool)):
            return val
        raise VkDelegateError(f"argument {value.name} has no tensor metadata")
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return str(value)
    return value


def schema_args(node: torch.fx.Node) -> list:
    """The node's arguments in schema order, kwargs made positional, defaults filled.

    Works for OpOverload targets only; raises VkDelegateError otherwise.
    """
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        raise VkDelegateError(f"{node.name}: target {target} is not an ATen operator")
    values = []
    for i, arg in enumerate(target._schema.arguments):
        if arg.name in node.kwargs:
            values.append(node.kwargs[arg.name])
        elif i < len(node.args) and not arg.kwarg_only:
            values.append(node.args[i])
        elif arg.has_default_value():
            values.append(arg.default_value)
        else:
            values.append(None)
    return values


def _symbolic_args(values) -> list[str]:
    """Names of fx nodes among ``values`` (lists searched) that carry a SymInt."""
    found = []
    for v in values:
        if isinstance(v, (list, tuple)):
            found += _symbolic_args(v)
        elif isinstance(v, torch.fx.Node) and isinstance(v.meta.get("val"), torch.SymInt):
            found.append(v.name)
    return found


def node_spec(node: torch.fx.Node, name: "str | None" = None) -> NodeSpec:
    """The NodeSpec of a call_function node: an ATen OpOverload (arguments in schema
    order) or a Python operator on SymInts (``operator.mul``; positional arguments).
    name: the op's registry name (default ``str(node.target)``). A SymInt argument is
    described by its upper bound and its position recorded in ``NodeSpec.symbolic``;
    whether its producer runs in the same partition is the partitioner's business.
    """
    if isinstance(node.target, torch._ops.OpOverload):
        values = schema_args(node)
    else:
        values = list(node.args)
    symbolic = frozenset(i for i, v in enumerate(values) if _symbolic_args([v]))
    args = tuple(_describe(a) for a in values)
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    outputs = tuple(tensor_spec(v) for v in vals if isinstance(v, torch.Tensor))
    return NodeSpec(op=name or str(node.target), args=args, outputs=outputs,
                    symbolic=symbolic)
