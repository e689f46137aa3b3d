"""The VH00 header at the start of a delegate blob (docs/DESIGN.md section 3).

Layout, little-endian, 30 bytes (the blob pads it to 32):

======  ==========================================================
bytes   field
======  ==========================================================
0..4    zero (so the magic sits where a flatbuffer's identifier would)
4..8    magic ``VH00``
8..10   header length, u16 = 30
10..14  flatbuffer offset, u32
14..18  flatbuffer size, u32
18..22  constants offset, u32
22..30  constants size, u64
======  ==========================================================
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from vkdelegate.errors import VkDelegateError

MAGIC = b"VH00"
HEADER_LENGTH = 30
_FORMAT = "<4s4sHIIIQ"
assert struct.calcsize(_FORMAT) == HEADER_LENGTH


@dataclass(frozen=True)
class BlobHeader:
    """Where the flatbuffer and the constants section lie in a blob (byte offsets and
    sizes from the blob's start)."""

    flatbuffer_offset: int
    flatbuffer_size: int
    constants_offset: int
    constants_size: int

    def to_bytes(self) -> bytes:
        """The 30 header bytes. Raises VkDelegateError if a field does not fit."""
        try:
            return struct.pack(_FORMAT, b"\0\0\0\0", MAGIC, HEADER_LENGTH,
                               self.flatbuffer_offset, self.flatbuffer_size,
                               self.constants_offset, self.constants_size)
        except struct.error as exc:
            raise VkDelegateError(f"blob header field out of range: {self}") from exc

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> "BlobHeader":
        """Parses and checks the header of the blob ``data`` (the whole blob, so that
        the regions can be checked against its size).

        Raises VkDelegateError for a short blob, a wrong magic or length, or a
        flatbuffer or constants region outside the blob or overlapping another.
        """
        size = len(data)
        if size < HEADER_LENGTH:
            raise VkDelegateError(f"delegate blob is {size} bytes, shorter than its "
                                  f"{HEADER_LENGTH}-byte VH00 header")
        _, magic, length, fb_off, fb_size, c_off, c_size = struct.unpack_from(_FORMAT, data)
        if magic != MAGIC:
            raise VkDelegateError(f"not a Vulkan delegate blob: magic at byte 4 is "
                                  f"{bytes(magic)!r}, expected {MAGIC!r}")
        if length != HEADER_LENGTH:
            raise VkDelegateError(f"VH00 header length at byte 8 is {length}, "
                                  f"expected {HEADER_LENGTH}")
        header = cls(fb_off, fb_size, c_off, c_size)
        if fb_off < HEADER_LENGTH or fb_size == 0 or fb_off + fb_size > size:
            raise VkDelegateError(
                f"VH00 header: flatbuffer region [{fb_off}, {fb_off + fb_size}) (bytes "
                f"10..18) is empty or not inside the {size}-byte blob after the header")
        # An empty constants section may sit at the padded end of the flatbuffer, past
        # the last byte of the blob; only a non-empty one must lie inside it.
        if c_off < fb_off + fb_size or (c_size and c_off + c_size > size):
            raise VkDelegateError(
                f"VH00 header: constants region [{c_off}, {c_off + c_size}) (bytes "
                f"18..30) overlaps the flatbuffer or runs past the {size}-byte blob")
        return header
