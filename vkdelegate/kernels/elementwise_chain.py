"""Fused elementwise chains: several float elementwise ops in one dispatch.

A chain is a program of steps over registers. Registers ``r0 .. r{n-1}`` are the n
tensor inputs (at most ``MAX_INPUTS``, broadcast against the output by
kernels/broadcast.py's plan); step j writes register ``r{n+j}``; the last step is the
output. Its text form, which the fused op ``vkdelegate.fused_elementwise`` carries in
graphs and program files, is

    steps := step (";" step)*            at most MAX_STEPS
    step  := OP "(" arg ("," arg)* ")"   OP: an ATen name of ``FUSABLE``
    arg   := "r" INT                     a register written before this step
           | "s" INT                     a float of the op's scalars list
           | "'" NAME "'"                a string choice (gelu's approximate)

for example ``aten.sigmoid.default(r0);aten.mul.Tensor(r0,r1)`` (SiLU). A unary step
takes its tensor, then its scalar parameters P0..P3 as ``s`` slots (their values as
``Unary.params`` makes them: clamp's absent bounds are infinities) or its string
choice; a binary step takes two operands, each a register or a scalar slot (a Python
scalar operand), then for add/sub the alpha slot (the ATen argument, unsigned).
``parse`` accepts only that grammar, only ops of ``FUSABLE`` with their arity, and only
registers already written: a chain read from an untrusted program file can only compose
the expressions of kernels/elementwise_exprs.py, which ``glsl_body`` renders (scalars
become exact float literals), never text of its own.

Semantics: every step is computed in fp32, as the unfused op's shader does, and in a
float16 chain every step's result is rounded to float16 as the unfused op's store would
(``ROUND_STEP``), so a chain computes what its ops computed one by one (eager
PyTorch's fp16 ops likewise compute in fp32 and round each result). Torch-free;
registers no op.
"""
from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels.elementwise_exprs import BINARY_OPS, UNARY_OPS

MAX_INPUTS = 3  # kernels/broadcast.py's MAX_OPERANDS
MAX_STEPS = 16
#: Float dtypes a chain computes on (every input and the output the same one).
DTYPES = ("float32", "float16")

#: Unary ops a chain may hold: float, float result, one expression per mode.
FUSABLE_UNARY = tuple(sorted(
    name for name, op in UNARY_OPS.items()
    if "float32" in op.dtypes and not op.out_bool and not op.by_dtype))
#: Binary ops a chain may hold (float arithmetic with a float result).
FUSABLE_BINARY = ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor",
                  "aten.div.Tensor", "aten.add.Scalar", "aten.sub.Scalar",
                  "aten.mul.Scalar", "aten.div.Scalar", "aten.maximum.default",
                  "aten.minimum.default", "aten.pow.Tensor_Tensor",
                  "aten.pow.Tensor_Scalar")
FUSABLE = frozenset(FUSABLE_UNARY + FUSABLE_BINARY)
#: Number of P0..P3 parameters per unary op (its ``params`` for float dtypes).
_UNARY_ARITY = {"aten.hardtanh.default": 2, "aten.clamp.default": 2,
                "aten.leaky_relu.default": 1, "aten.elu.default": 3,
                "aten.hardshrink.default": 1}

_STEP = re.compile(r"^(aten\.[a-z0-9_]+\.[A-Za-z_]+)\(([^()]*)\)$")
_ARG = re.compile(r"^(?:r(\d{1,2})|s(\d{1,2})|'([a-z]{1,8})')$")


@dataclass(frozen=True)
class Step:
    """One parsed step: ``op`` (an ATen name of FUSABLE), ``args``: ("r", register),
    ("s", scalar index) or ("str", choice), in the text's order."""

    op: str
    args: tuple


def describe(steps: str) -> str:
    """A one-line summary of chain text ``steps`` for reports: "chain of 3 ops:
    sigmoid, mul, mul" (the ATen op names without namespace and overload)."""
    names = [text.split("(")[0].split(".")[1] if text.count(".") >= 2 else text
             for text in steps.split(";")]
    return f"chain of {len(names)} ops: {', '.join(names)}"


def parse(steps: str, num_inputs: int, num_scalars: int) -> list[Step]:
    """The steps of chain text ``steps`` over ``num_inputs`` tensor inputs and a
    scalars list of ``num_scalars`` floats. VkDelegateError naming the step for
    anything outside the grammar: an unknown op, a wrong number or kind of arguments,
    a register not yet written, a scalar index out of range, more than MAX_STEPS
    steps or MAX_INPUTS inputs."""
    if not isinstance(steps, str) or not steps:
        raise VkDelegateError("fused elementwise chain: empty step list")
    if not 1 <= num_inputs <= MAX_INPUTS:
        raise VkDelegateError(f"fused elementwise chain: {num_inputs} tensor inputs "
                              f"(1 to {MAX_INPUTS})")
    texts = steps.split(";")
    if len(texts) > MAX_STEPS:
        raise VkDelegateError(f"fused elementwise chain: {len(texts)} steps (at most "
                              f"{MAX_STEPS})")
    parsed = []
    for j, text in enumerate(texts):
        where = f"fused elementwise chain step {j} {text[:60]!r}"
        m = _STEP.match(text)
        if not m:
            raise VkDelegateError(f"{where}: malformed step (expected "
                                  f"aten.OP.OVERLOAD(arg,...))")
        if m[1] not in FUSABLE:
            raise VkDelegateError(f"{where}: {m[1]} is not a fusable op")
        args = []
        for a in (m[2].split(",") if m[2] else []):
            am = _ARG.match(a)
            if not am:
                raise VkDelegateError(f"{where}: malformed argument {a[:20]!r}")
            if am[1] is not None:
                reg = int(am[1])
                if reg >= num_inputs + j:
                    raise VkDelegateError(f"{where}: register r{reg} is not written "
                                          f"before this step")
                args.append(("r", reg))
            elif am[2] is not None:
                idx = int(am[2])
                if idx >= num_scalars:
                    raise VkDelegateError(f"{where}: scalar s{idx} out of range "
                                          f"({num_scalars} scalars)")
                args.append(("s", idx))
            else:
                args.append(("str", am[3]))
        _check_arity(m[1], tuple(args), where)
        parsed.append(Step(m[1], tuple(args)))
    return parsed


def _check_arity(op: str, args: tuple, where: str) -> None:
    kinds = tuple(k for k, _ in args)
    if op in BINARY_OPS:
        alpha = BINARY_OPS[op].alpha is not None
        ok = len(args) == (3 if alpha else 2) and all(k in ("r", "s") for k in kinds[:2]) \
            and "r" in kinds[:2] and (not alpha or kinds[2] == "s")
    else:
        expr = UNARY_OPS[op].expr
        if isinstance(expr, dict):
            ok = kinds == ("r", "str") and args[1][1] in expr
        else:
            ok = kinds == ("r",) + ("s",) * _UNARY_ARITY.get(op, 0)
    if not ok:
        raise VkDelegateError(f"{where}: wrong arguments for {op}")


def float_literal(v: float) -> str:
    """An exact GLSL float for ``v`` (its fp32 bits: infinities and NaN included)."""
    bits = struct.unpack("<I", struct.pack("<f", float(v)))[0]
    return f"uintBitsToFloat(0x{bits:08x}u)"


def _operand(arg, scalars) -> str:
    kind, value = arg
    return f"r{value}" if kind == "r" else float_literal(scalars[value])


def glsl_body(steps: list[Step], num_inputs: int, scalars) -> str:
    """GLSL statements computing every step's register (float r{n+j}) from the input
    registers r0 .. r{n-1}, on one line (a -D define); the result is the last
    register. Each step is its op's expression of kernels/elementwise_exprs.py with
    ``x`` / ``a``, ``b`` bound to its operands, P0..P3 and ALPHA to literals, through
    the shader's ROUND_STEP (the storage rounding of a float16 chain)."""
    lines = []
    for j, step in enumerate(steps):
        reg = f"r{num_inputs + j}"
        if step.op in BINARY_OPS:
            op = BINARY_OPS[step.op]
            expr = op.expr if isinstance(op.expr, str) else op.expr[None]
            a, b = (_operand(x, scalars) for x in step.args[:2])
            if op.alpha is not None:
                alpha = op.alpha * scalars[step.args[2][1]]
                expr = re.sub(r"\bALPHA\b", f"({float_literal(alpha)})", expr)
            lines.append(f"float {reg}; {{ const float a = {a}; const float b = {b}; "
                         f"{reg} = ROUND_STEP({expr}); }}")
        else:
            op = UNARY_OPS[step.op]
            expr = op.expr if isinstance(op.expr, str) else op.expr[step.args[1][1]]
            params = [scalars[i] for k, i in step.args[1:] if k == "s"]
            for p, value in enumerate(params):
                expr = re.sub(rf"\bP{p}\b", f"({float_literal(value)})", expr)
            lines.append(f"float {reg}; {{ const float x = r{step.args[0][1]}; "
                         f"{reg} = ROUND_STEP({expr}); }}")
    return " ".join(lines)


def result_register(steps: list[Step], num_inputs: int) -> str:
    """The register holding the chain's output."""
    return f"r{num_inputs + len(steps) - 1}"


def scalar_values(scalars) -> list[float]:
    """A chain's scalars list as floats (infinities allowed: clamp's absent bounds);
    VkDelegateError for a value that is not a real number."""
    out = []
    for v in scalars:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise VkDelegateError(f"fused elementwise chain: scalar {v!r} is not a number")
        out.append(float(v))
    return out
