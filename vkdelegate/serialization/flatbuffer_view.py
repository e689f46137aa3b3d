"""Bounds-checked access to the tables, vectors and strings of one flatbuffer.

The ``flatbuffers`` Python package has no verifier: its ``Table`` accessors trust every
offset, so a corrupt buffer gives IndexError, struct.error or garbage. This module is
the verifier. Each read checks that what it reads lies inside the buffer (and a table
field inside its table) before touching it, and raises :class:`VkDelegateError` naming
what was read and at which byte offset. Reads are proportional to the bytes they
return and nothing recurses, so no input can make it hang.
"""
from __future__ import annotations

import struct

from vkdelegate.errors import VkDelegateError

_SIZES = {"b": 1, "B": 1, "?": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "d": 8}


class FlatbufferView:
    """Read-only view of a flatbuffer ``buf`` (bytes-like, offsets relative to its start)."""

    def __init__(self, buf: bytes | memoryview, name: str = "flatbuffer", base: int = 0):
        """``base``: where ``buf`` starts in the enclosing file, so that errors give
        the byte offset a user sees in a hex dump of the file."""
        self.buf = memoryview(buf).cast("B")
        self.size = len(self.buf)
        self.name = name
        self.base = base

    def fail(self, message: str, offset: int) -> VkDelegateError:
        return VkDelegateError(f"{self.name}: {message} (at byte {self.base + offset})")

    def need(self, offset: int, size: int, what: str) -> None:
        """Raises unless bytes [offset, offset+size) lie inside the buffer."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise self.fail(f"{what} ({size} bytes) runs past the end of the "
                            f"{self.size}-byte buffer", offset)

    def scalar(self, fmt: str, offset: int, what: str):
        self.need(offset, _SIZES[fmt], what)
        return struct.unpack_from("<" + fmt, self.buf, offset)[0]

    def uoffset(self, offset: int, what: str) -> int:
        """Follows the uoffset stored at ``offset``; returns the absolute target."""
        target = offset + self.scalar("I", offset, what)
        if target >= self.size:
            raise self.fail(f"{what} points to byte {target}, outside the "
                            f"{self.size}-byte buffer", offset)
        return target

    def root(self, identifier: bytes, root_name: str) -> "TableView":
        if self.size < 8:
            raise self.fail(f"buffer of {self.size} bytes is too short for a flatbuffer", 0)
        found = bytes(self.buf[4:8])
        if found != identifier:
            raise self.fail(f"file identifier is {found!r}, expected {identifier!r}", 4)
        return self.table(self.uoffset(0, "root table offset"), root_name)

    def table(self, pos: int, what: str) -> "TableView":
        vtable = pos - self.scalar("i", pos, f"{what} vtable offset")
        vt_size = self.scalar("H", vtable, f"{what} vtable size")
        if vt_size < 4 or vt_size % 2:
            raise self.fail(f"{what} has a vtable of invalid size {vt_size}", vtable)
        self.need(vtable, vt_size, f"{what} vtable")
        table_size = self.scalar("H", vtable + 2, f"{what} table size")
        if table_size < 4:
            raise self.fail(f"{what} has invalid table size {table_size}", vtable + 2)
        self.need(pos, table_size, what)
        return TableView(self, pos, vtable, vt_size, table_size, what)


class TableView:
    """One table: fields by slot, with the schema default when a field is absent."""

    def __init__(self, fb: FlatbufferView, pos: int, vtable: int, vt_size: int,
                 table_size: int, what: str):
        self.fb, self.pos, self.vtable = fb, pos, vtable
        self.vt_size, self.table_size, self.what = vt_size, table_size, what

    def _field(self, slot: int, size: int, name: str) -> int:
        """Absolute offset of field ``slot`` (0 when absent)."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vt_size:
            return 0
        rel = self.fb.scalar("H", self.vtable + entry, f"{self.what} vtable entry")
        if rel == 0:
            return 0
        if rel < 4 or rel + size > self.table_size:
            raise self.fb.fail(f"{self.what} field {name!r} lies outside its "
                               f"{self.table_size}-byte table", self.pos + rel)
        return self.pos + rel

    def scalar(self, slot: int, fmt: str, default, name: str):
        at = self._field(slot, _SIZES[fmt], name)
        return default if at == 0 else self.fb.scalar(fmt, at, f"{self.what}.{name}")

    def _target(self, slot: int, name: str) -> int:
        at = self._field(slot, 4, name)
        return 0 if at == 0 else self.fb.uoffset(at, f"{self.what}.{name}")

    def table(self, slot: int, name: str) -> "TableView | None":
        target = self._target(slot, name)
        return None if target == 0 else self.fb.table(target, f"{self.what}.{name}")

    def string(self, slot: int, name: str) -> str | None:
        target = self._target(slot, name)
        if target == 0:
            return None
        what = f"{self.what}.{name}"
        length = self.fb.scalar("I", target, f"{what} length")
        self.fb.need(target + 4, length + 1, f"string {what}")  # +1: NUL terminator
        try:
            return bytes(self.fb.buf[target + 4:target + 4 + length]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fb.fail(f"string {what} is not valid UTF-8 ({exc.reason})",
                               target + 4 + exc.start) from None

    def vector(self, slot: int, fmt: str, name: str) -> list:
        """A vector of scalars; ``[]`` when the field is absent."""
        target = self._target(slot, name)
        if target == 0:
            return []
        what = f"{self.what}.{name}"
        count = self.fb.scalar("I", target, f"{what} length")
        self.fb.need(target + 4, count * _SIZES[fmt], f"vector {what} of {count} items")
        return list(struct.unpack_from(f"<{count}{fmt}", self.fb.buf, target + 4))

    def length(self, slot: int, name: str) -> int:
        """The item count of a vector field (0 when absent), without reading items."""
        target = self._target(slot, name)
        return 0 if target == 0 else self.fb.scalar("I", target, f"{self.what}.{name} length")

    def tables(self, slot: int, name: str) -> list["TableView"]:
        """A vector of tables; ``[]`` when the field is absent."""
        target = self._target(slot, name)
        if target == 0:
            return []
        what = f"{self.what}.{name}"
        count = self.fb.scalar("I", target, f"{what} length")
        self.fb.need(target + 4, count * 4, f"vector {what} of {count} items")
        return [self.fb.table(self.fb.uoffset(target + 4 + 4 * i, f"{what}[{i}]"),
                              f"{what}[{i}]") for i in range(count)]

    def byte_vector(self, slot: int, name: str) -> memoryview:
        """A ``[ubyte]`` vector as a memoryview of the buffer (no copy); empty when
        the field is absent."""
        target = self._target(slot, name)
        if target == 0:
            return self.fb.buf[0:0]
        what = f"{self.what}.{name}"
        count = self.fb.scalar("I", target, f"{what} length")
        self.fb.need(target + 4, count, f"vector {what} of {count} bytes")
        return self.fb.buf[target + 4:target + 4 + count]
