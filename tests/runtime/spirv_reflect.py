"""A minimal SPIR-V reader: the descriptor bindings of a compute shader and the layout
of the blocks behind them, read from the binary (no spirv-cross needed).

Only what tests/runtime/test_shader_bindings.py compares with the Python declarations:
each (set, binding)'s descriptor kind, access and block members (name, type, offset);
a uniform texel buffer (``uniform samplerBuffer``) as kind "texel" whose one member is
the variable. And the shared (Workgroup) variables' sizes (``workgroup_bytes``), which
tests/ops/test_sdpa_coopmat.py checks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAGIC = 0x07230203
# Opcodes (SPIR-V spec, section 3.49).
OP_NAME, OP_MEMBER_NAME = 5, 6
OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_VECTOR = 21, 22, 23
OP_TYPE_IMAGE, OP_TYPE_SAMPLED_IMAGE = 25, 27
DIM_BUFFER = 5
OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY, OP_TYPE_STRUCT, OP_TYPE_POINTER = 28, 29, 30, 32
OP_CONSTANT, OP_VARIABLE, OP_DECORATE, OP_MEMBER_DECORATE = 43, 59, 71, 72
# Decorations and storage classes.
BLOCK, BUFFER_BLOCK, ARRAY_STRIDE, NON_WRITABLE, NON_READABLE = 2, 3, 6, 24, 25
BINDING, DESCRIPTOR_SET, OFFSET = 33, 34, 35
SC_UNIFORM, SC_WORKGROUP, SC_STORAGE_BUFFER = 2, 4, 12


@dataclass
class Binding:
    """One descriptor binding. kind: "storage", "uniform" or "texel"; members: the block's
    members as (name, type, offset) (type as in runtime.param_block, a struct by its
    name); structs: every struct member type by name -> its members likewise;
    non_writable / non_readable: the access decorations of member 0."""

    set: int
    binding: int
    kind: str
    block: str
    members: list
    structs: dict
    non_writable: bool
    non_readable: bool


def _string(words) -> str:
    raw = np.asarray(words, dtype="<u4").tobytes()
    return raw[:raw.index(b"\0")].decode()


class Module:
    """Parsed SPIR-V words: names, decorations and types by result id."""

    def __init__(self, spirv: bytes):
        words = np.frombuffer(spirv, dtype="<u4")
        assert words[0] == MAGIC, "not SPIR-V (or not little-endian)"
        self.names, self.member_names = {}, {}
        self.decorations, self.member_decorations = {}, {}
        self.types, self.constants, self.variables = {}, {}, {}
        i = 5
        while i < len(words):
            count, op = int(words[i]) >> 16, int(words[i]) & 0xFFFF
            args = [int(w) for w in words[i + 1:i + count]]
            i += count
            if op == OP_NAME:
                self.names[args[0]] = _string(args[1:])
            elif op == OP_MEMBER_NAME:
                self.member_names[(args[0], args[1])] = _string(args[2:])
            elif op == OP_DECORATE:
                self.decorations.setdefault(args[0], {})[args[1]] = args[2:]
            elif op == OP_MEMBER_DECORATE:
                self.member_decorations.setdefault((args[0], args[1]), {})[args[2]] = \
                    args[3:]
            elif op in (OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_VECTOR, OP_TYPE_ARRAY,
                        OP_TYPE_RUNTIME_ARRAY, OP_TYPE_STRUCT, OP_TYPE_POINTER,
                        OP_TYPE_IMAGE, OP_TYPE_SAMPLED_IMAGE):
                self.types[args[0]] = (op, args[1:])
            elif op == OP_CONSTANT:
                self.constants[args[1]] = args[2]
            elif op == OP_VARIABLE:
                self.variables[args[1]] = (args[0], args[2])

    def type_name(self, tid: int, structs: dict) -> str:
        """A type as runtime.param_block writes it ("ivec4", "vec4[2]", "TensorMeta";
        an array whose stride is not 16 gets "/stride N"); structs met are added to
        ``structs``."""
        op, args = self.types[tid]
        if op == OP_TYPE_INT:
            return "int" if args[1] else "uint"
        if op == OP_TYPE_FLOAT:
            return {32: "float", 16: "float16_t"}.get(args[0], f"float{args[0]}")
        if op == OP_TYPE_VECTOR:
            base = self.type_name(args[0], structs)
            return {"int": "ivec", "uint": "uvec", "float": "vec"}.get(base, base) + \
                str(args[1])
        if op in (OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY):
            elem = self.type_name(args[0], structs)
            length = str(self.constants[args[1]]) if op == OP_TYPE_ARRAY else ""
            stride = self.decorations.get(tid, {}).get(ARRAY_STRIDE, [0])[0]
            suffix = "" if op == OP_TYPE_RUNTIME_ARRAY or stride == 16 else \
                f"/stride {stride}"
            return f"{elem}[{length}]{suffix}"
        if op == OP_TYPE_STRUCT:
            name = self.names.get(tid, f"struct{tid}")
            structs[name] = self.members(tid, structs)
            return name
        return f"type{tid}"

    def members(self, struct_id: int, structs: dict) -> list:
        """(name, type, offset) of each member of struct ``struct_id``."""
        _, member_types = self.types[struct_id]
        return [(self.member_names.get((struct_id, k), f"member{k}"),
                 self.type_name(t, structs),
                 self.member_decorations.get((struct_id, k), {}).get(OFFSET, [None])[0])
                for k, t in enumerate(member_types)]

    def _texel_buffer(self, tid: int) -> bool:
        """Whether type ``tid`` is a sampled image of dimension Buffer (samplerBuffer)."""
        op, args = self.types.get(tid, (None, ()))
        if op != OP_TYPE_SAMPLED_IMAGE:
            return False
        image_op, image = self.types.get(args[0], (None, ()))
        return image_op == OP_TYPE_IMAGE and image[1] == DIM_BUFFER and image[5] == 1

    def bindings(self) -> dict[int, Binding]:
        """Binding number -> Binding of every descriptor-set variable."""
        out = {}
        for var, (ptr_type, storage) in self.variables.items():
            deco = self.decorations.get(var, {})
            if BINDING not in deco:
                continue
            struct_id = self.types[ptr_type][1][1]
            if self._texel_buffer(struct_id):
                # Sampled (1) buffer image: read-only by nature.
                out[deco[BINDING][0]] = Binding(
                    set=deco.get(DESCRIPTOR_SET, [None])[0], binding=deco[BINDING][0],
                    kind="texel", block="", members=[(self.names.get(var, ""),
                                                      "samplerBuffer", None)],
                    structs={}, non_writable=True, non_readable=False)
                continue
            struct_deco = self.decorations.get(struct_id, {})
            if storage == SC_STORAGE_BUFFER or BUFFER_BLOCK in struct_deco:
                kind = "storage"
            elif storage == SC_UNIFORM and BLOCK in struct_deco:
                kind = "uniform"
            else:
                kind = f"storage class {storage}"
            structs = {}
            access = self.member_decorations.get((struct_id, 0), {})
            out[deco[BINDING][0]] = Binding(
                set=deco.get(DESCRIPTOR_SET, [None])[0], binding=deco[BINDING][0],
                kind=kind, block=self.names.get(struct_id, ""),
                members=self.members(struct_id, structs), structs=structs,
                non_writable=NON_WRITABLE in access, non_readable=NON_READABLE in access)
        return out

    def byte_size(self, tid: int) -> int:
        """Bytes of scalar, vector, array or struct type ``tid``, elements packed
        without padding (shared variables carry no layout decorations)."""
        op, args = self.types[tid]
        if op in (OP_TYPE_INT, OP_TYPE_FLOAT):
            return args[0] // 8
        if op == OP_TYPE_VECTOR:
            return args[1] * self.byte_size(args[0])
        if op == OP_TYPE_ARRAY:
            return self.constants[args[1]] * self.byte_size(args[0])
        if op == OP_TYPE_STRUCT:
            return sum(self.byte_size(t) for t in args)
        raise ValueError(f"type {tid} (opcode {op}) has no fixed size")

    def workgroup_bytes(self) -> dict[str, int]:
        """Name -> bytes of every shared (Workgroup storage class) variable."""
        return {self.names.get(var, f"var{var}"): self.byte_size(self.types[ptr][1][1])
                for var, (ptr, storage) in self.variables.items()
                if storage == SC_WORKGROUP}
