"""force_fp16: which nodes of a partition must stay float32 (docs/LOWERING.md).

float16 holds finite values up to 65504 (65520 and beyond round to inf) and rounds
magnitudes up to 2**-25 to zero. Under ``force_fp16`` a partition's float32 tensors
become float16, so a value that does not fit silently becomes inf, NaN or 0 where eager
float32 keeps it (a -1e5 attention mask, ``torch.finfo(torch.float32).min``, the
square of 300 in an RMSNorm). This module finds the nodes that must compute in float32
instead; ``fp16_cast.apply_force_fp16`` then keeps their tensors float32 inside the
delegate and casts at the edges. The rules, applied in graph order:

1. Seeds. A node is a seed when it handles float tensors and
   - a ``Scalar`` argument or a number in a ``Tensor`` position (add/sub/mul/div
     operands, clamp bounds, fill values, ``scalar_tensor``, ...) rounds to +-inf in float16 from a finite value, or, except
     for mul/div (which use the scalar's fp32 value with float16 tensors), rounds a
     nonzero value to 0;
   - it reads a float32 constant (or a delegate input computed on the CPU from a
     literal, e.g. ``scalar_tensor(-1e5)``) holding a finite value that rounds to inf,
     or a one-element one (a lifted scalar) whose nonzero value rounds to 0;
   - it is a product (``mul`` of two tensors, ``pow`` with exponent > 1) feeding a
     sum or mean: x*x of an fp16 x reaches 4.3e9 although its mean may fit again;
   - it is a variance (``var``), the mean of squares of deviations.
   ``float``-typed arguments (a norm's eps) are not checked: shaders take them in fp32.
2. Widening. A seed's float output may exceed float16 ("wide"); every node reading a
   wide tensor stays float32 too and its float output is wide, except for outputs
   that are bounded again: softmax, sigmoid and tanh (|y| <= 1), sqrt (the root of a
   mean of squares of fp16 values fits) and rsqrt (``rsqrt(m + eps)`` is at most
   ``eps ** -0.5``; it would exceed fp16 only for inputs in (0, 2**-32)).
3. Fused chains with casts. A ``vkdelegate.fused_elementwise`` node whose steps hold
   ``aten._to_copy`` (between float32 and float16) names the dtypes it converts to,
   so it stays as lowered: its float32 tensors stay float32. It is not a seed (its
   output is no wider than the unfused casts' was).

4. Periodic arguments. A sine, cosine or tangent (also inside a fused chain) and the
   float nodes its argument is computed from stay float32 (``_keep_periodic_arguments``):
   float16 rounds an argument near 1000 by up to 0.5, and the result by as much.

5. Float32-only kernels. A node whose Vulkan kernel takes a float32 argument (or
   makes a float32 output) in float32 only stays float32 (the LLM sampler's
   ``sampling`` vector).

So ``softmax(scores + (1 - m) * finfo.min)`` and ``softmax(s.masked_fill(m, -1e5))``
run their mask arithmetic and softmax in float32 and match eager exactly (a fully
masked row included: eager gives a uniform row, or ``softmax(scores)`` when -1e5 is
added, never NaN), and RMSNorm keeps ``x*x -> mean -> + eps -> rsqrt`` in float32.
Accumulators need no rule: every reduction, softmax, matmul, linear, convolution, pool
and batch-norm shader accumulates in fp32 (``ACC_T``, runtime/dtypes.py).
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Mapping, Optional

import numpy as np
import torch

from vkdelegate.serialization.builder import schema_args

#: Ops whose float output is bounded whatever their float32 input (see rule 2).
NARROWING = frozenset({"aten._softmax.default", "aten.sigmoid.default",
                       "aten.tanh.default", "aten.sqrt.default", "aten.rsqrt.default"})
#: Reductions that sum their input: a product feeding one is a seed.
SUMS = frozenset({"aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim",
                  "aten.mean.default"})
#: Ops whose Scalar operand keeps its fp32 value with float16 tensors (binary.py
#: ``fp32_scalar``): a tiny scalar there does not flush to zero.
_FP32_SCALAR = frozenset({"aten.mul.Tensor", "aten.div.Tensor", "aten.div.Tensor_mode"})
_PRODUCTS = frozenset({"aten.mul.Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor"})


def _half(v: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # overflow is what we look for
        return float(np.float16(v))


def value_problem(v, flush_matters: bool = True) -> Optional[str]:
    """Why the number ``v`` does not survive float16, or None: "rounds to -inf" for a
    finite value of magnitude >= 65520, "rounds to 0" for a nonzero one <= 2**-25
    (only when ``flush_matters``). inf, NaN and exact zeros are fine."""
    v = float(v)
    if not math.isfinite(v):
        return None
    h = _half(v)
    if math.isinf(h):
        return f"rounds to {'-' if h < 0 else ''}inf in float16"
    if flush_matters and v != 0 and h == 0:
        return "rounds to 0 in float16"
    return None


def array_problem(array: np.ndarray) -> Optional[tuple[float, str]]:
    """(offending value, why) for a float32 constant, or None (see the module rules:
    any finite overflowing element; a zero-flushing value only in a one-element one)."""
    a = np.asarray(array, dtype=np.float64).ravel()
    finite = a[np.isfinite(a)]
    if finite.size:
        big = float(finite[np.argmax(np.abs(finite))])
        problem = value_problem(big, flush_matters=False)
        if problem:
            return big, problem
    if a.size == 1:
        problem = value_problem(a[0])
        if problem:
            return float(a[0]), problem
    return None


def _is_float(val) -> bool:
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def _handles_float(node: torch.fx.Node) -> bool:
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    flat = []
    for v in vals:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    return any(_is_float(v) for v in flat)


def _scalar_seed(node: torch.fx.Node) -> Optional[str]:
    schema = getattr(node.target, "_schema", None)
    if schema is None or not _handles_float(node):
        return None
    flush = str(node.target) not in _FP32_SCALAR
    for sa, value in zip(schema.arguments, schema_args(node)):
        # A number in a Tensor position is a wrapped scalar (``x * -3.4e38`` exports
        # as mul.Tensor with a float ``other``).
        if str(sa.type) not in ("number", "Optional[number]", "Tensor", "Optional[Tensor]"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            problem = value_problem(value, flush)
            if problem:
                return f"scalar {sa.name}={value!r} {problem}"
    return None


def _product_seed(node: torch.fx.Node) -> Optional[str]:
    name = str(node.target)
    if name not in _PRODUCTS or not _is_float(node.meta.get("val")):
        return None
    if name == "aten.mul.Tensor" and not all(isinstance(a, torch.fx.Node)
                                             for a in node.args[:2]):
        return None
    if name == "aten.pow.Tensor_Scalar" and not (isinstance(node.args[1], (int, float))
                                                 and node.args[1] > 1):
        return None
    sums = [u.name for u in node.users if str(u.target) in SUMS]
    if not sums:
        return None
    return (f"product {node.name} feeds {sums[0]}: products of float16 values reach "
            f"4.3e9 where their mean may fit float16 again")


def _fused_seed(node: torch.fx.Node) -> Optional[str]:
    """The rules above for the steps of a fused chain (vkdelegate.fused_elementwise,
    passes/fuse_elementwise): a seed when one of its scalars would be one (checked as
    for add: flushing to 0 counts), or when it holds a product and feeds a sum."""
    if str(node.target) != "vkdelegate.fused_elementwise.default" or \
            not _is_float(node.meta.get("val")):
        return None
    steps, scalars = node.args[1], node.args[2]
    for value in scalars:
        problem = value_problem(value, True)
        if problem:
            return f"chain scalar {value!r} {problem}"
    products = ("aten.mul.Tensor(r", "aten.pow.")
    sums = [u.name for u in node.users if str(u.target) in SUMS]
    if sums and any(step.startswith(products) for step in steps.split(";")):
        return (f"fused chain {node.name} holds a product and feeds {sums[0]}: products "
                f"of float16 values reach 4.3e9 where their mean may fit float16 again")
    return None


def _fused_cast(node: torch.fx.Node) -> Optional[str]:
    """Why a fused chain holding a dtype cast (``aten._to_copy`` steps between float32
    and float16, passes/fuse_elementwise) keeps its dtypes, or None: its steps name
    the dtypes they convert to, so its float32 tensors stay float32 (fp16_cast casts
    around it). Not a seed: its output is no wider than the unfused casts' was."""
    if str(node.target) != "vkdelegate.fused_elementwise.default" or \
            not isinstance(node.args[1], str) or "aten._to_copy.default(" not in node.args[1] \
            or not _handles_float(node):
        return None
    return ("fused chain with dtype casts keeps its float32 steps (its casts name their "
            "dtypes)")


#: CPU ops whose float32 result is one literal, so a delegate reading it knows its value.
_LITERALS = {"aten.scalar_tensor.default": 0, "aten.full.default": 1}


def cpu_literal(node: torch.fx.Node):
    """A float32 array standing for the values of ``node`` (a glue node feeding a
    delegate, or a delegated node) when it is ``scalar_tensor(v)`` or ``full(size,
    v)``, else None (one element
    when the result has one, else two: the rules look only at the value and whether
    it is alone)."""
    pos = _LITERALS.get(str(node.target))
    val = node.meta.get("val")
    if pos is None or not isinstance(val, torch.Tensor) or val.dtype != torch.float32 \
            or len(node.args) <= pos or not isinstance(node.args[pos], (int, float)):
        return None
    numel = val.numel()
    count = 1 if isinstance(numel, int) and numel == 1 else 2
    return np.full(count, node.args[pos], dtype=np.float32)


def fp32_nodes(gm: torch.fx.GraphModule, known: Mapping[str, np.ndarray],
               wide_inputs: "set[str] | None" = None) -> tuple[dict, list]:
    """Nodes of partition ``gm`` that stay float32 under force_fp16.

    known: placeholder name -> values known at lowering (constants, CPU-computed
        literals). wide_inputs: placeholder names whose values may exceed float16
        (an earlier delegate's wide output).
    Returns (node name -> reason, for call_function nodes; per output of ``gm``,
    whether it may exceed float16).
    """
    # wide value -> where its float32 region starts (a seed node or an input)
    wide = {name: f"input {name}" for name in (wide_inputs or ())}
    bad_input = {}
    for name, array in known.items():
        if np.asarray(array).dtype == np.float32:
            problem = array_problem(array)
            if problem:
                bad_input[name] = f"{name} holds {problem[0]!r}, which {problem[1]}"
    keep, outputs = {}, []
    for node in gm.graph.nodes:
        if node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            outputs = [isinstance(o, torch.fx.Node) and o.name in wide for o in outs]
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:   # an item of a wide node's outputs
            if node.args[0].name in wide and _is_float(node.meta.get("val")):
                wide[node.name] = wide[node.args[0].name]
            continue
        reason = (_scalar_seed(node) or _product_seed(node) or _fused_seed(node)
                  or next((f"reads {a.name}: {bad_input[a.name]}"
                           for a in node.all_input_nodes if a.name in bad_input), None))
        if reason is None and str(node.target) == "aten.var.correction" \
                and _is_float(node.meta.get("val")):
            reason = "a variance reaches the square of its input's range"
        origin = node.name
        if reason is None:
            src = next((a for a in node.all_input_nodes if a.name in wide), None)
            if src is None:
                cast = _fused_cast(node)
                if cast is not None:   # kept as it is, its output no wider than before
                    keep[node.name] = cast
                continue
            origin = wide[src.name]
            reason = f"reads {src.name}, which may exceed float16 (float32 from {origin})"
        keep[node.name] = reason
        literal = cpu_literal(node)  # a delegated scalar_tensor/full: name its value
        problem = array_problem(literal) if literal is not None else None
        if problem:
            bad_input[node.name] = f"{node.name} holds {problem[0]!r}, which {problem[1]}"
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        if str(node.target) not in NARROWING and any(_is_float(v) for v in vals):
            wide[node.name] = origin
    _keep_periodic_arguments(gm, keep)
    _keep_float32_only_kernels(gm, keep)
    return keep, outputs


#: Periodic functions: their output is bounded, but their argument needs float32's
#: precision (rule 4 of the module docstring).
PERIODIC = frozenset({"aten.sin.default", "aten.cos.default", "aten.tan.default"})


def _periodic_op(node: torch.fx.Node) -> Optional[str]:
    """The periodic op ``node`` computes (itself, or a step of its fused chain)."""
    name = str(node.target)
    if name in PERIODIC:
        return name
    if name == "vkdelegate.fused_elementwise.default" and isinstance(node.args[1], str):
        return next((op for op in sorted(PERIODIC) if f"{op}(" in node.args[1]), None)
    return None


def _keep_periodic_arguments(gm: torch.fx.GraphModule, keep: dict) -> None:
    """Rule 4: a sine, cosine or tangent and every float node its argument is computed
    from stay float32. float16 holds an argument near 1000 only to 0.5 (an
    ``arange(1024) * div`` position encoding), and the sine of it is then off by up to
    0.5 where eager's float32 is exact to 1e-4; the argument's inputs (``div``, rounded
    by 5e-4 in float16) matter as much. Non-float nodes (integer positions) end the
    walk."""
    for node in gm.graph.nodes:
        op = _periodic_op(node) if node.op == "call_function" else None
        if op is None or not _handles_float(node):
            continue
        fn = op.split(".")[1]
        keep.setdefault(node.name, f"{fn} of a float16 argument is off by up to half its "
                                   f"ulp (0.5 at 1000)")
        stack = list(node.all_input_nodes)
        while stack:
            src = stack.pop()
            if src.op != "call_function" or src.name in keep:
                continue
            val = src.meta.get("val")
            vals = val if isinstance(val, (list, tuple)) else [val]
            if not any(_is_float(v) for v in vals):
                continue
            keep[src.name] = (f"computes the argument of {node.name} ({fn}), which needs "
                              f"float32's precision")
            stack.extend(src.all_input_nodes)


def _keep_float32_only_kernels(gm: torch.fx.GraphModule, keep: dict) -> None:
    """Rule 5: a node whose Vulkan kernel takes a float32 argument (or makes a float32
    output) in float32 only stays float32 (the LLM sampler's ``sampling`` vector:
    temperature, top-k, top-p and the draw). Not a seed: its output is no wider."""
    from vkdelegate.ops import registry

    specs = registry.load_all()
    for node in gm.graph.nodes:
        spec = specs.get(str(node.target)) if node.op == "call_function" else None
        if spec is None or node.name in keep:
            continue
        only = [i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node)
                and _is_float(a.meta.get("val"))
                and "float16" not in spec.arg_dtypes.get(i, spec.dtypes)]
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        if only or ("float16" not in spec.dtypes and any(_is_float(v) for v in vals)):
            what = f"argument {only[0]}" if only else "its output"
            keep[node.name] = f"its Vulkan kernel takes {what} in float32 only"
