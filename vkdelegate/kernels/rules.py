"""Partition-time support rules and shape functions shared by several op families.

A rule takes a NodeSpec (ops/registry.py) and returns None when the node can run
here, or the reason it cannot (a string the partitioner reports); families list them
in their OpSpec ``rules``. A shape function (OpSpec ``shape_fn``) takes the node's
arguments (TensorSpecs and Python values, output excluded) and returns the output
sizes. Rules only one family needs stay in its module. Torch-free.
"""
from __future__ import annotations

import math
from typing import Callable


def same_dtype(node):
    """Rule: every tensor of the node (inputs and outputs) has one dtype: ops that never
    convert (movement, GEMM, convolution)."""
    dtypes = {t.dtype for t in node.tensors()}
    if len(dtypes) > 1:
        return f"mixed dtypes {sorted(dtypes)}"
    return None


def static_channels(node):
    """Rule: the channel dim (dim 1) of the first argument is static: the ops that
    size per-channel buffers or weights from it at load (convolution, batch norm)."""
    x = node.args[0]
    if len(x.dynamic) > 1 and x.dynamic[1]:
        return "dynamic channel count"
    return None


def same_shape(args) -> tuple:
    """Shape function: the output has the first argument's sizes (elementwise unary
    ops, copies, softmax, flip)."""
    return tuple(args[0].shape)


def shape_from_list(fn: Callable) -> Callable:
    """Shape function ``args -> fn(args[0].shape, args[1])``: the output sizes from the
    input's sizes and its list argument (view's sizes, squeeze's dims, expand's sizes,
    repeat's repeats, constant_pad_nd's pad). ``fn`` raises VkDelegateError where ATen
    would."""
    def shape_fn(args) -> tuple:
        return fn(args[0].shape, args[1])
    shape_fn.__qualname__ = shape_fn.__name__ = f"{fn.__name__}_of_args"
    return shape_fn


def scalar_reason(value, dtype: str):  # a helper of rules, not a rule itself
    """Why the Python scalar ``value`` cannot become an element of a ``dtype`` tensor on
    the device (None if it can): integer tensors take no inf/NaN, and int64 tensors
    are held in int32, so their values must fit it."""
    if not isinstance(value, (int, float)) or dtype in ("bool", "float32", "float16",
                                                        "float64"):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"value {value} for an {dtype} tensor"
    if dtype == "int64" and not -2**31 <= int(value) < 2**31:
        return f"value {value} does not fit int32, the device representation of int64"
    return None
