"""``ParamBlock``: a parameter block's members declared once, with their std140 packing.

An op that owns a parameter block declares it next to the dispatch that fills it::

    POOL_PARAMS = ParamBlock("pool_block", [("kernel_stride", "ivec4"),
                                            ("pad_dilation", "ivec4"), ("avg", "ivec4")])
    b.params(POOL_PARAMS.pack(kernel_stride=(kh, kw, sh, sw), pad_dilation=..., avg=...))

and the shader declares the same members in the same order inside
``PARAMS(pool_block) { ... };`` (common.h). tests/runtime/test_shader_bindings.py
compiles every declared variant and compares each block's member names, types and
offsets in the SPIR-V with the declaration, so the two cannot drift apart.

Member types: ``int``, ``float``, ``ivec4``, ``vec4``, arrays ``ivec4[N]``/``vec4[N]``
and the struct ``TensorMeta`` (tensor_meta.h). Arrays of scalars are refused: their
std140 stride (16) differs from std430's (4), and a block must lay out alike in both
(lavapipe binds parameter blocks as storage buffers, see common.h's PARAM_BLOCK).
"""
from __future__ import annotations

import struct

import numpy as np

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.params import META_BYTES, int32_value

_SCALARS = {"int": (np.int32, 1), "float": (np.float32, 1),
            "ivec4": (np.int32, 4), "vec4": (np.float32, 4)}
#: Structs a block may hold, by GLSL name: their members as (name, type).
STRUCTS = {"TensorMeta": (("sizes", "ivec4[2]"), ("strides", "ivec4[2]"),
                          ("info", "ivec4"))}


def _split(type_: str) -> tuple[str, int | None]:
    """("ivec4", 2) for "ivec4[2]", ("ivec4", None) for "ivec4"."""
    if type_.endswith("]"):
        base, _, count = type_[:-1].partition("[")
        return base, int(count)
    return type_, None


class ParamBlock:
    """A std140 parameter block: ``name`` (the GLSL block name, also its binding name)
    and ``fields``, (member name, type) pairs in declaration order.

    ``offsets`` maps each member to its byte offset, ``size`` is the block's size in
    bytes (a multiple of 16). VkDelegateError for an unknown type or a scalar array.
    """

    def __init__(self, name: str, fields):
        self.name = name
        self.fields = tuple((str(n), str(t)) for n, t in fields)
        self.offsets: dict[str, int] = {}
        offset = 0
        for member, type_ in self.fields:
            align, size = self._align_size(type_)
            offset = -(-offset // align) * align
            self.offsets[member] = offset
            offset += size
        self.size = -(-offset // 16) * 16
        # pack's plan, one entry a member: (name, offset, "i"/"f" or a struct's block,
        # values it holds, its type)
        self._plan = []
        for member, type_ in self.fields:
            base, count = _split(type_)
            if base in STRUCTS:
                kind = ParamBlock(f"{name}.{member}", STRUCTS[base])
                room = 0
            else:
                dtype, width = _SCALARS[base]
                kind, room = ("i" if dtype is np.int32 else "f"), width * (count or 1)
            self._plan.append((member, self.offsets[member], kind, room, type_))

    def _align_size(self, type_: str) -> tuple[int, int]:
        base, count = _split(type_)
        if base in STRUCTS and count is None:
            return 16, ParamBlock(base, STRUCTS[base]).size
        if base not in _SCALARS:
            raise VkDelegateError(f"parameter block {self.name}: unknown member type "
                                  f"{type_!r}")
        width = _SCALARS[base][1]
        if count is None:
            return 4 * width, 4 * width
        if width != 4 or count < 1:
            raise VkDelegateError(f"parameter block {self.name}: member type {type_!r} "
                                  f"(only arrays of ivec4/vec4 lay out alike in std140 "
                                  f"and std430)")
        return 16, 16 * count

    def glsl(self) -> str:
        """The block's member declarations as GLSL text, one per line."""
        lines = []
        for member, type_ in self.fields:
            base, count = _split(type_)
            lines.append(f"  {base} {member}{'' if count is None else f'[{count}]'};")
        return "\n".join(lines)

    def pack(self, **values) -> bytes:
        """The block's std140 bytes. Every member is given by name: a number for
        int/float, up to 4 numbers for ivec4/vec4 (the rest 0), up to 4 * N for an
        array of N (flattened, row after row), a dict of its members for a struct.
        Integers go through ``int32_value``. VkDelegateError naming the block and the
        member for a missing, unknown or out-of-range value."""
        if len(values) != len(self.fields) or not all(m in values for m in self.offsets):
            unknown = sorted(set(values) - set(self.offsets))
            missing = [m for m, _ in self.fields if m not in values]
            raise VkDelegateError(f"parameter block {self.name}: "
                                  + (f"unknown members {unknown}" if unknown else
                                     f"members {missing} not given"))
        out = bytearray(self.size)
        for member, offset, kind, room, type_ in self._plan:
            value = values[member]
            if isinstance(kind, ParamBlock):
                raw = kind.pack(**value)
                out[offset:offset + len(raw)] = raw
                continue
            # The common case in one call: a number, or a flat list / tuple of ints (or
            # floats) that struct takes as they are (it refuses a nested list, a
            # non-integer in an int member, an int past int32 or a float past float32's
            # range); anything else takes the checked path below.
            seq = (value,) if type(value) in (int, float) else value
            if type(seq) in (list, tuple) and (len(seq) == 1 if room == 1
                                               else len(seq) <= room):
                try:
                    struct.pack_into(f"<{len(seq)}{kind}", out, offset, *seq)
                    continue
                except (struct.error, OverflowError, TypeError):
                    out[offset:offset + 4 * room] = bytes(4 * room)
            flat = _flat(value)
            if len(flat) > room or (room == 1 and len(flat) != 1):
                raise VkDelegateError(f"parameter block {self.name}: member {member} "
                                      f"({type_}) given {len(flat)} values")
            if kind == "i":
                flat = [int32_value(v, f"parameter {self.name}.{member}[{i}]")
                        for i, v in enumerate(flat)]
                struct.pack_into(f"<{len(flat)}i", out, offset, *flat)
            else:  # numpy's conversion: past float32's range is inf
                raw = np.asarray(flat, dtype=np.float32).tobytes()
                out[offset:offset + len(raw)] = raw
        return bytes(out)


def _flat(value) -> list:
    """A member's numbers in order, nested lists and arrays flattened row after row."""
    return np.ravel(np.asarray(value, dtype=object)).tolist()


def tensor_meta_block(name: str) -> ParamBlock:
    """The block ``TENSOR_META(name)`` (tensor_meta.h) declares: one ``TensorMeta``
    member called ``name``, bound under ``name``. Its bytes are written by
    ``Tensor.meta`` (params.meta_record), never packed by an op."""
    block = ParamBlock(name, [(name, "TensorMeta")])
    assert block.size == META_BYTES, "tensor_meta.h and params.META_BYTES disagree"
    return block
