"""Operand dtypes of elementwise shaders (binary_op, ternary_op): ATen's promotion
where the result is one of the operand dtypes, and the load from storage to the
computation type. Torch-free; registers no op.
"""
from __future__ import annotations

from vkdelegate.runtime.dtypes import acc_type


def category(dtype: str) -> int:
    """ATen's promotion category of a dtype name: 0 bool, 1 integer, 2 float."""
    return 0 if dtype == "bool" else (2 if acc_type(dtype) == "float" else 1)


def promote(dtypes: list) -> "str | None":
    """ATen's result dtype of tensor operands where it is one of them: the dtype of the
    highest category (bool < integer < float), if only one operand dtype is in it
    (float32 * bool -> float32, int32 + bool -> int32; int8 + int32 -> None), and
    float32 for float16 with float32 (the fp32 scores plus fp16 mask of a decomposed
    fp16 attention). ATen lets a dimensioned tensor win over a 0-d one of its category
    (float16[n] + float32[] is float16); callers check the node's output dtype against
    this result, so such a node stays on the CPU rather than computing wrongly."""
    top = max(dtypes, key=category)
    tops = {d for d in dtypes if category(d) == category(top)}
    if tops == {"float16", "float32"}:
        return "float32"
    if len(tops) > 1:
        return None
    return top


def load_define(storage: str, compute: str) -> str:
    """A_LOAD/B_LOAD: storage -> ACC_T (integer storage reaches float through int)."""
    if acc_type(compute) == "float" and storage not in ("float", "float16_t"):
        return "float(int(v))"
    return "ACC_T(v)"
