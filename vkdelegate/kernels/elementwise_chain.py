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
           | "'" NAME "'"                a string choice (gelu's approximate, a
                                         cast's dtype)

for example ``aten.sigmoid.default(r0);aten.mul.Tensor(r0,r1)`` (SiLU). A unary step
takes its tensor, then its scalar parameters P0..P3 as ``s`` slots (their values as
``Unary.params`` makes them: clamp's absent bounds are infinities) or its string
choice; a binary step takes two operands, each a register or a scalar slot (a Python
scalar operand), then for add/sub the alpha slot (the ATen argument, unsigned); a
cast ``aten._to_copy.default(rK,'float16')`` takes its tensor and the dtype it
converts to (``'float16'`` or ``'float32'``). ``parse`` accepts only that grammar, only
ops of ``FUSABLE`` with their arity, and only registers already written: a chain read
from an untrusted program file can only compose the expressions of
kernels/elementwise_exprs.py, which ``glsl_body`` renders (scalars become exact float
literals), never text of its own.

Dtypes: every register has one, float32 or float16 (``register_dtypes``). The inputs'
are their tensors' dtypes; a cast's is the dtype it names (the other float dtype than
its operand's); any other step's is its tensor operands' dtype, which must be one (the
pass fuses only ops whose tensors share a dtype, as ATen's ops on one dtype); the
output tensor has the last register's dtype. So a float16 SwiGLU gate
``round16(silu(float(gate))) * up`` is one chain over float16 inputs with a float32
middle, and a program file whose tensors disagree with its chain is refused at load.

Semantics: every step is computed in fp32, as the unfused op's shader does, and every
step whose register is float16 rounds its result to float16 (round to nearest even,
``round_to_half`` of common.h) as the unfused op's store would, so a chain computes
what its ops computed one by one (eager PyTorch's fp16 ops likewise compute in fp32
and round each result; a cast to float16 rounds, a cast to float32 is exact).
Torch-free; registers no op.
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
#: Float dtypes a chain's registers hold (its inputs, steps and output).
DTYPES = ("float32", "float16")
#: The dtype conversion a chain may hold: ``aten._to_copy.default(rK,'DTYPE')`` between
#: the two DTYPES (float32 -> float16 rounds to nearest even, float16 -> float32 is
#: exact).
CAST = "aten._to_copy.default"

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
FUSABLE = frozenset(FUSABLE_UNARY + FUSABLE_BINARY + (CAST,))
#: Number of P0..P3 parameters per unary op (its ``params`` for float dtypes).
_UNARY_ARITY = {"aten.hardtanh.default": 2, "aten.clamp.default": 2,
                "aten.leaky_relu.default": 1, "aten.elu.default": 3,
                "aten.hardshrink.default": 1}

_STEP = re.compile(r"^(aten\.[a-z0-9_]+\.[A-Za-z_]+)\(([^()]*)\)$")
_ARG = re.compile(r"^(?:r(\d{1,2})|s(\d{1,2})|'([a-z0-9]{1,8})')$")


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
    if op == CAST:
        ok = kinds == ("r", "str") and args[1][1] in DTYPES
    elif op in BINARY_OPS:
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


def register_dtypes(steps: list[Step], input_dtypes) -> list[str]:
    """The dtype of every register of parsed ``steps`` (inputs first, then one per
    step) over inputs of ``input_dtypes`` (dtype names). VkDelegateError naming the
    input or step for an input that is not float32 or float16, a cast to its
    operand's own dtype, or a step whose tensor operands differ in dtype."""
    regs = []
    for k, dtype in enumerate(input_dtypes):
        if dtype not in DTYPES:
            raise VkDelegateError(f"fused elementwise chain: input {k} is {dtype} "
                                  f"(float32 or float16 expected)")
        regs.append(dtype)
    for j, step in enumerate(steps):
        where = f"fused elementwise chain step {j} ({step.op})"
        tensors = [regs[v] for k, v in step.args if k == "r"]
        if step.op == CAST:
            target = step.args[1][1]
            if tensors[0] == target:
                raise VkDelegateError(f"{where}: casts r{step.args[0][1]} to its own "
                                      f"dtype {target}")
            regs.append(target)
            continue
        if len(set(tensors)) != 1:
            raise VkDelegateError(f"{where}: operands of dtypes {tensors} (one dtype "
                                  f"expected: a chain converts only with {CAST})")
        regs.append(tensors[0])
    return regs


def check_dtypes(steps: list[Step], input_dtypes, output_dtype: str) -> list[str]:
    """``register_dtypes``, also checking that the output tensor's ``output_dtype`` is
    the last register's: VkDelegateError otherwise. Returns the register dtypes."""
    regs = register_dtypes(steps, input_dtypes)
    if regs[-1] != output_dtype:
        raise VkDelegateError(f"fused elementwise chain: output tensor of dtype "
                              f"{output_dtype}, but the chain's last step gives "
                              f"{regs[-1]}")
    return regs


def _rounded(expr: str, dtype: str) -> str:
    return f"round_to_half({expr})" if dtype == "float16" else f"({expr})"


def glsl_body(steps: list[Step], num_inputs: int, scalars, dtypes) -> str:
    """GLSL statements computing every step's register (float r{n+j}) from the input
    registers r0 .. r{n-1}, on one line (a -D define); the result is the last
    register. ``dtypes``: every register's dtype (``register_dtypes``). Each step is
    its op's expression of kernels/elementwise_exprs.py with ``x`` / ``a``, ``b``
    bound to its operands, P0..P3 and ALPHA to literals; a step of a float16 register
    rounds its value to float16 (common.h's round_to_half, nearest even: what the
    unfused op's float16 store does); a cast to float16 is that rounding, a cast to
    float32 the value itself."""
    if len(dtypes) != num_inputs + len(steps):
        raise VkDelegateError(f"fused elementwise chain: {len(dtypes)} register dtypes "
                              f"for {num_inputs} inputs and {len(steps)} steps")
    lines = []
    for j, step in enumerate(steps):
        reg = f"r{num_inputs + j}"
        dtype = dtypes[num_inputs + j]
        if step.op == CAST:
            lines.append(f"const float {reg} = {_rounded(f'r{step.args[0][1]}', dtype)};")
        elif step.op in BINARY_OPS:
            op = BINARY_OPS[step.op]
            expr = op.expr if isinstance(op.expr, str) else op.expr[None]
            a, b = (_operand(x, scalars) for x in step.args[:2])
            if op.alpha is not None:
                alpha = op.alpha * scalars[step.args[2][1]]
                expr = re.sub(r"\bALPHA\b", f"({float_literal(alpha)})", expr)
            lines.append(f"float {reg}; {{ const float a = {a}; const float b = {b}; "
                         f"{reg} = {_rounded(expr, dtype)}; }}")
        else:
            op = UNARY_OPS[step.op]
            expr = op.expr if isinstance(op.expr, str) else op.expr[step.args[1][1]]
            params = [scalars[i] for k, i in step.args[1:] if k == "s"]
            for p, value in enumerate(params):
                expr = re.sub(rf"\bP{p}\b", f"({float_literal(value)})", expr)
            lines.append(f"float {reg}; {{ const float x = r{step.args[0][1]}; "
                         f"{reg} = {_rounded(expr, dtype)}; }}")
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


#: fused_elementwise.glsl: a chain over its inputs (ops/families/fused_elementwise.py
#: registers its bindings and variants; kernels/gemm.py's several-row SwiGLU on GPUs
#: records it too).
SHADER = "fused_elementwise"


def _dtype(t) -> str:
    return t[0] if isinstance(t, tuple) else t.dtype


def chain_defines(out, inputs: list, steps: list, scalars: list) -> dict:
    """Defines of fused_elementwise.glsl for ``out`` and ``inputs`` (Tensors or
    (graph dtype, device dtype) pairs) computing parsed ``steps`` with ``scalars``.
    VkDelegateError when their dtypes disagree with the chain (``check_dtypes``)."""
    from vkdelegate.runtime.dtypes import storage_defines

    dtypes = check_dtypes(steps, [_dtype(t) for t in inputs], _dtype(out))
    d = storage_defines(OUT=out, **{f"IN{k}": t for k, t in enumerate(inputs)})
    d.update(NUM_INPUTS=str(len(inputs)), ACC_T="float", ACC_FLOAT="1",
             CHAIN_BODY=glsl_body(steps, len(inputs), scalars, dtypes),
             CHAIN_RESULT=result_register(steps, len(inputs)))
    return d
