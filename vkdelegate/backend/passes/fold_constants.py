"""Fold small values that every call computes alike into constants.

A decode step's prelude computes, every step, values that do not depend on its
inputs: the attention mask's ``arange(0, max_seq_len)`` and the float32 copy of the
rotary embedding's ``inv_freq`` buffer (``inv_freq.float()`` of a float16 model).
Each is a dispatch per step. This pass computes them once at lowering, with the same
ATen op on the CPU (eager's values, bit for bit), and makes them constants:

- an integer ``arange`` (any overload) whose start/end/step are Python numbers;
- ``_to_copy`` of a constant that changes only its dtype (no device, layout or memory
  format change, no ``non_blocking``);
- ``unsqueeze``/``view``/``reshape`` of a constant this pass made (a view of a
  constant is a copy on the device, a dispatch, where a view of an intermediate
  shares its memory);
- any other functional ATen op (no mutated argument, not random) whose tensor
  arguments are all constants and whose result is integer or boolean: index
  arithmetic on constants, such as BEiT's relative position index (meshgrid, sub,
  permute, where, sum: some forty int64 nodes a forward, each a dispatch).

Float ``full``/``arange`` are not folded: force_fp16 checks a fill value that float16
cannot hold on the node (backend/fp16_ranges.py) but not every element of a large
constant.

A result of more than ``MAX_ELEMENTS`` elements is left alone (a constant is stored in
the program file; a computed one is not), as is a node the program returns.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

#: The largest folded result, in elements.
MAX_ELEMENTS = 1 << 16

_ARANGE = (aten.arange.default, aten.arange.start, aten.arange.start_step)
#: The integer dtypes (an integer or boolean result of constants folds).
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _number(x) -> bool:
    return type(x) in (int, float, bool)


def _static_value(node) -> bool:
    v = node.meta.get("val")
    return isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) \
        and v.numel() <= MAX_ELEMENTS


_VIEWS = (aten.unsqueeze.default, aten.view.default, aten.reshape.default,
          aten._unsafe_view.default)


def _constant_args(pg, node) -> bool:
    """Whether every node among ``node``'s arguments (lists included) is a constant."""
    found = []
    torch.fx.node.map_arg((node.args, node.kwargs), found.append)
    return all(a.op == "placeholder" and a.name in pg.constants for a in found)


def _integer_result(pg, node) -> bool:
    """A functional, deterministic ATen op of constants with an integer or boolean
    result (module docstring)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable \
            or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    val = node.meta["val"]
    if val.dtype not in INTEGER_DTYPES + (torch.bool,):
        return False
    return _constant_args(pg, node) and all(
        pg.constants[a.name].device.type == "cpu" for a in node.all_input_nodes)


def _foldable(pg, node, made) -> bool:
    if node.op != "call_function" or not node.users or not _static_value(node):
        return False
    if any(u.op == "output" for u in node.users):
        return False
    kwargs = node.kwargs
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return False
    if kwargs.get("pin_memory") or kwargs.get("layout", torch.strided) != torch.strided:
        return False
    if node.target in _ARANGE:
        return node.meta["val"].dtype in INTEGER_DTYPES and all(_number(a) for a in node.args)
    if node.target in _VIEWS:
        src = node.args[0] if node.args else None
        return isinstance(src, torch.fx.Node) and src.name in made and not node.kwargs \
            and all(type(a) is int or (isinstance(a, (list, tuple)) and all(
                type(d) is int for d in a)) for a in node.args[1:])
    if node.target == aten._to_copy.default:
        src = node.args[0] if node.args else None
        if len(node.args) != 1 or not isinstance(src, torch.fx.Node) \
                or src.op != "placeholder" or src.name not in pg.constants:
            return False
        if set(kwargs) - {"dtype", "device", "layout", "pin_memory", "memory_format"} \
                or kwargs.get("memory_format") not in (None, torch.preserve_format,
                                                       torch.contiguous_format):
            return False
        return pg.constants[src.name].device.type == "cpu"
    return _integer_result(pg, node)


def fold_constants(pg) -> bool:
    """Replace the foldable nodes (module docstring) by constants; True if any."""
    graph = pg.gm.graph
    changed = False
    made = set()
    for node in list(graph.nodes):
        if not _foldable(pg, node, made):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                             lambda a: pg.constants[a.name])
        value = node.target(*args, **kwargs)
        want = node.meta["val"]
        if not isinstance(value, torch.Tensor) or value.dtype != want.dtype \
                or tuple(value.shape) != tuple(want.shape):
            continue
        const = pg.add_constant(f"{node.name}_folded", value.contiguous().clone())
        made.add(const.name)
        node.replace_all_uses_with(const)
        graph.erase_node(node)
        changed = True
    return changed
