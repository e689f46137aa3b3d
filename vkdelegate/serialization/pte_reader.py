"""ExecuTorch program (.pte) bytes -> dataclasses, verifying as it reads.

The schema is ExecuTorch 1.5.1's ``exir/_serialize/program.fbs`` (file identifier
``ET12``) and ``scalar_type.fbs``; only the fields vkdelegate runs are decoded. A .pte
is: the Program flatbuffer, whose first bytes after the root offset and identifier
hold the extended header (``eh00``: header length, program size, segment base offset,
segment data size), then the segments (delegate blobs, named data, the constant
segment) at ``segment_base_offset + DataSegment.offset``.

A .pte is untrusted data: every offset goes through :mod:`flatbuffer_view`, every
union tag and enum value must be one the schema declares, every value index must
exist, segments must lie inside the file, and the value and instruction counts fit
the load limits. Anything else raises :class:`VkDelegateError` naming the file, the
field and the index or byte offset. Torch-free.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits, check_limit, resolve_limits
from vkdelegate.serialization.flatbuffer_view import FlatbufferView, TableView

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
_HEADER = struct.Struct("<4sIQQ")  # magic, length, program size, segment base offset

#: KernelTypes union members, by tag (1-based; 0 is NONE).
VALUE_KINDS = ("Null", "Int", "Bool", "Double", "Tensor", "String", "IntList",
               "DoubleList", "BoolList", "TensorList", "OptionalTensorList")
#: InstructionArguments union members, by tag.
INSTRUCTION_KINDS = ("KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall",
                     "FreeCall")
#: ScalarType codes vkdelegate runs -> numpy dtype name (bfloat16: see the loader).
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64",
                5: "float16", 6: "float32", 7: "float64", 11: "bool", 15: "bfloat16"}
_LIST_FORMATS = {"IntList": "q", "DoubleList": "d", "BoolList": "?",
                 "TensorList": "i", "OptionalTensorList": "i"}


@dataclass
class PteTensor:
    """A Tensor EValue: dtype (numpy name), sizes (upper bounds when dynamic),
    ``dynamic`` (shape_dynamism is not STATIC), ``constant`` bytes (None for one that
    gets its data at run time)."""

    dtype: str
    sizes: list
    dynamic: bool = False
    constant: "memoryview | None" = None


@dataclass
class PteValue:
    """One EValue: ``kind`` (a VALUE_KINDS name) and its payload (a PteTensor, a
    scalar, a str, or a list: of items for Double/BoolList, of value indices else)."""

    kind: str
    value: object = None


@dataclass
class PteInstruction:
    """``kind`` (an INSTRUCTION_KINDS name), ``index`` (op or delegate index), args."""

    kind: str
    index: int = 0
    args: list = field(default_factory=list)


@dataclass
class PteDelegate:
    """A BackendDelegate: backend id and its processed bytes (the blob)."""

    backend: str
    data: bytes


@dataclass
class PtePlan:
    """One ExecutionPlan (a method)."""

    name: str
    values: list
    inputs: list
    outputs: list
    instructions: list
    operators: list  # "namespace::op.overload"
    delegates: list
    encoded_inputs: "str | None" = None
    encoded_outputs: "str | None" = None


@dataclass
class PteProgram:
    """A decoded .pte: its methods and named data (key -> bytes)."""

    plans: list
    named_data: dict


def is_pte(head: bytes) -> bool:
    """Whether bytes that start a file look like an ExecuTorch program."""
    return len(head) >= 8 and head[4:8] == FILE_IDENTIFIER


def _fail(where: str, message: str) -> VkDelegateError:
    return VkDelegateError(f"{where}: {message}")


def _header(raw: memoryview, where: str) -> tuple[int, int, int]:
    """(program size, segment base offset, end of the segment data) from ``eh00``."""
    if len(raw) < 8 + _HEADER.size:
        raise _fail(where, f"{len(raw)} bytes are too few for a program with its "
                           f"extended header")
    magic, length, program_size, base = _HEADER.unpack_from(raw, 8)
    if magic != HEADER_MAGIC:  # an old program without the header: no segments
        return len(raw), 0, len(raw)
    if length < _HEADER.size or 8 + length > len(raw):
        raise _fail(where, f"extended header length {length} is invalid")
    if not 0 < program_size <= len(raw):
        raise _fail(where, f"extended header says the program is {program_size} bytes; "
                           f"the file has {len(raw)}")
    if base and not program_size <= base <= len(raw):
        raise _fail(where, f"segment base offset {base} lies outside the file "
                           f"({len(raw)} bytes, program {program_size})")
    return program_size, base, len(raw)


def _segments(program: TableView, raw: memoryview, base: int, where: str,
              limits: LoadLimits) -> list:
    check_limit("segment count", program.length(4, "segments"), limits.max_segments,
                "max_segments", where)
    out = []
    for i, t in enumerate(program.tables(4, "segments")):
        offset, size = t.scalar(0, "Q", 0, "offset"), t.scalar(1, "Q", 0, "size")
        start = base + offset
        if base == 0 or start + size > len(raw):
            raise _fail(where, f"segment {i} (offset {offset}, size {size}) lies "
                               f"outside the file's segment data")
        out.append(raw[start:start + size])
    return out


def _segment(segments: list, index: int, what: str, where: str) -> memoryview:
    if not 0 <= index < len(segments):
        raise _fail(where, f"{what} refers to segment {index}; the file has "
                           f"{len(segments)}")
    return segments[index]


class _Constants:
    """Where constant tensor data lives: the constant segment or the (deprecated)
    inline constant_buffer."""

    def __init__(self, program: TableView, segments: list, where: str, limits):
        self.where = where
        seg = program.table(5, "constant_segment")
        self.offsets = seg.vector(1, "Q", "offsets") if seg is not None else []
        self.data = (_segment(segments, seg.scalar(0, "I", 0, "segment_index"),
                              "constant_segment", where) if self.offsets else None)
        check_limit("constant buffer count", program.length(2, "constant_buffer"),
                    limits.max_segments, "max_segments", where)
        self.inline = program.tables(2, "constant_buffer") if not self.offsets else []

    def get(self, index: int, nbytes: int, what: str) -> memoryview:
        if self.offsets:
            if not 0 < index < len(self.offsets):
                raise _fail(self.where, f"{what}: constant {index} does not exist (the "
                                        f"constant segment has {len(self.offsets)})")
            start = self.offsets[index]
            if start + nbytes > len(self.data):
                raise _fail(self.where, f"{what}: {nbytes} bytes at {start} run past "
                                        f"the {len(self.data)}-byte constant segment")
            return self.data[start:start + nbytes]
        if not 0 < index < len(self.inline):
            raise _fail(self.where, f"{what}: constant buffer {index} does not exist "
                                    f"(the program has {len(self.inline)})")
        data = self.inline[index].byte_vector(0, "storage")
        if len(data) < nbytes:
            raise _fail(self.where, f"{what}: constant buffer {index} holds "
                                    f"{len(data)} bytes, not {nbytes}")
        return data[:nbytes]


def _tensor(t: TableView, what: str, constants: _Constants, limits) -> PteTensor:
    code = t.scalar(0, "b", 0, "scalar_type")
    if code not in SCALAR_TYPES:
        raise _fail(constants.where, f"{what} has scalar type {code}, which vkdelegate "
                                     f"does not run")
    dtype = SCALAR_TYPES[code]
    sizes = t.vector(2, "i", "sizes")
    if any(s < 0 for s in sizes):
        raise _fail(constants.where, f"{what} has a negative size in {sizes}")
    order = t.vector(3, "B", "dim_order")
    if order and order != list(range(len(sizes))):
        raise _fail(constants.where, f"{what} has dim order {order}; vkdelegate runs "
                                     f"contiguous tensors only")
    dynamism = t.scalar(8, "b", 0, "shape_dynamism")
    if dynamism not in (0, 1, 2):
        raise _fail(constants.where, f"{what} shape_dynamism is {dynamism}")
    buffer = t.scalar(5, "I", 0, "data_buffer_idx")
    planned = t.table(6, "allocation_info") is not None
    tensor = PteTensor(dtype, sizes, dynamism != 0)
    if buffer and planned:
        raise _fail(constants.where, f"{what} is a mutable tensor with an initial "
                                     f"state, which vkdelegate does not run yet")
    if buffer:
        if t.table(9, "extra_tensor_info") is not None:
            raise _fail(constants.where, f"{what} keeps its data outside the file "
                                         f"(a .ptd), which vkdelegate does not read")
        count = 1
        for s in sizes:
            count *= s
        nbytes = count * (2 if dtype == "bfloat16" else _ITEMSIZE[dtype])
        check_limit("constant tensor bytes", nbytes, limits.max_tensor_bytes,
                    "max_tensor_bytes", f"{constants.where}, {what}")
        tensor.constant = constants.get(buffer, nbytes, what)
    return tensor


_ITEMSIZE = {"uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2,
             "float32": 4, "float64": 8, "bool": 1}


def _value(v: TableView, i: int, constants: _Constants, limits) -> PteValue:
    what = f"value {i}"
    tag = v.scalar(0, "B", 0, "val_type")
    if not 1 <= tag <= len(VALUE_KINDS):
        raise _fail(constants.where, f"{what} has union tag {tag}; KernelTypes tags are "
                                     f"1..{len(VALUE_KINDS)}")
    kind = VALUE_KINDS[tag - 1]
    t = v.table(1, "val")
    if t is None:
        raise _fail(constants.where, f"{what} ({kind}) has a type tag but no table")
    if kind == "Null":
        return PteValue(kind)
    if kind == "Tensor":
        return PteValue(kind, _tensor(t, what, constants, limits))
    if kind in _LIST_FORMATS:
        items = t.vector(0, _LIST_FORMATS[kind], "items")
        return PteValue(kind, [bool(x) for x in items] if kind == "BoolList" else items)
    if kind == "Int":
        return PteValue(kind, t.scalar(0, "q", 0, "int_val"))
    if kind == "Bool":
        return PteValue(kind, bool(t.scalar(0, "B", 0, "bool_val")))
    if kind == "Double":
        return PteValue(kind, t.scalar(0, "d", 0.0, "double_val"))
    return PteValue(kind, t.string(0, "string_val") or "")


def _check_indices(plan: PtePlan, where: str) -> None:
    """Every value index an instruction, list or the method's inputs/outputs use
    exists (a -1 only in an OptionalTensorList)."""
    n = len(plan.values)

    def check(idx, what, optional=False):
        if not (0 <= idx < n or (optional and idx == -1)):
            raise _fail(where, f"{what} refers to value {idx}; the method has {n}")

    for k, v in enumerate(plan.values):
        if v.kind in ("IntList", "TensorList", "OptionalTensorList"):
            for idx in v.value:
                check(idx, f"value {k} ({v.kind})", v.kind == "OptionalTensorList")
    for label, ids in (("inputs", plan.inputs), ("outputs", plan.outputs)):
        for idx in ids:
            check(idx, f"method {label}")
    for k, ins in enumerate(plan.instructions):
        for idx in ins.args:
            check(idx, f"instruction {k} ({ins.kind})")


def _instruction(t: TableView, k: int, where: str) -> PteInstruction:
    tag = t.scalar(0, "B", 0, "instr_args_type")
    if not 1 <= tag <= len(INSTRUCTION_KINDS):
        raise _fail(where, f"instruction {k} has union tag {tag}; InstructionArguments "
                           f"tags are 1..{len(INSTRUCTION_KINDS)}")
    kind = INSTRUCTION_KINDS[tag - 1]
    body = t.table(1, "instr_args")
    if body is None:
        raise _fail(where, f"instruction {k} ({kind}) has a type tag but no table")
    if kind in ("KernelCall", "DelegateCall"):
        return PteInstruction(kind, body.scalar(0, "i", 0, "index"),
                              body.vector(1, "i", "args"))
    if kind == "FreeCall":
        return PteInstruction(kind, 0, [body.scalar(0, "i", 0, "value_index")])
    return PteInstruction(kind)  # control flow: refused by the loader, by name


def _plan(p: TableView, delegate_data: list, segments: list, constants: _Constants,
          where: str, limits: LoadLimits) -> PtePlan:
    name = p.string(0, "name") or "forward"
    w = f"{where}, method {name!r}"
    constants.where = w
    check_limit("value count", p.length(2, "values"), limits.max_values, "max_values", w)
    chains = p.tables(5, "chains")
    if len(chains) != 1:
        raise _fail(w, f"has {len(chains)} chains; vkdelegate runs methods of one chain")
    check_limit("instruction count", chains[0].length(2, "instructions"),
                limits.max_nodes, "max_nodes", w)
    meta = p.table(1, "container_meta_type")
    operators = []
    for t in p.tables(6, "operators"):
        op, overload = t.string(0, "name") or "", t.string(1, "overload") or ""
        operators.append(f"{op}.{overload}" if overload else op)
    delegates = []
    for k, t in enumerate(p.tables(7, "delegates")):
        ref = t.table(1, "processed")
        if ref is None:
            raise _fail(w, f"delegate {k} has no processed data")
        location, index = ref.scalar(0, "b", 0, "location"), ref.scalar(1, "I", 0, "index")
        if location == 0:
            if not 0 <= index < len(delegate_data):
                raise _fail(w, f"delegate {k} refers to inline data {index}; the program "
                               f"has {len(delegate_data)}")
            data = delegate_data[index].byte_vector(0, "data")
        elif location == 1:
            data = _segment(segments, index, f"delegate {k}", w)
        else:
            raise _fail(w, f"delegate {k} has data location {location}")
        delegates.append(PteDelegate(t.string(0, "id") or "", bytes(data)))
    plan = PtePlan(
        name=name,
        values=[_value(t, i, constants, limits) for i, t in enumerate(p.tables(2, "values"))],
        inputs=p.vector(3, "i", "inputs"), outputs=p.vector(4, "i", "outputs"),
        instructions=[_instruction(t, k, w)
                      for k, t in enumerate(chains[0].tables(2, "instructions"))],
        operators=operators, delegates=delegates,
        encoded_inputs=meta.string(0, "encoded_inp_str") if meta else None,
        encoded_outputs=meta.string(1, "encoded_out_str") if meta else None)
    _check_indices(plan, w)
    return plan


def read_pte(data: "bytes | memoryview", where: str = ".pte",
             limits: "LoadLimits | None" = None) -> PteProgram:
    """Decode and verify an ExecuTorch program.

    data: the whole file. where: names it in errors (e.g. "program file m.pte").
    limits: the budget; counts of segments, values and instructions and each constant
    tensor's bytes over it raise ResourceLimitError.
    Raises VkDelegateError for a wrong identifier, a malformed extended header or
    flatbuffer, a segment outside the file, an unknown union tag, scalar type or
    enum value, a value index out of range, mutable tensors with an initial state or
    data outside the file, and control-flow methods of several chains.
    """
    limits = resolve_limits(limits)
    raw = memoryview(data).cast("B")
    if not is_pte(bytes(raw[:8])):
        raise _fail(where, f"not an ExecuTorch program (bytes 4..8 are "
                           f"{bytes(raw[4:8])!r}, expected {FILE_IDENTIFIER!r})")
    program_size, base, _ = _header(raw, where)
    fb = FlatbufferView(raw[:program_size], f"{where} (program flatbuffer)")
    program = fb.root(FILE_IDENTIFIER, "Program")
    segments = _segments(program, raw, base, where, limits)
    named = {}
    for t in program.tables(7, "named_data"):
        key = t.string(0, "key") or ""
        named[key] = bytes(_segment(segments, t.scalar(1, "I", 0, "segment_index"),
                                    f"named data {key!r}", where))
    constants = _Constants(program, segments, where, limits)
    delegate_data = program.tables(3, "backend_delegate_data")
    plans = [_plan(p, delegate_data, segments, constants, where, limits)
             for p in program.tables(1, "execution_plan")]
    if not plans:
        raise _fail(where, "has no execution plan (method)")
    return PteProgram(plans, named)
