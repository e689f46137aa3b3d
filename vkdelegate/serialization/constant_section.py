"""Laying out a blob's constants: inline in its constants section, or named.

Each distinct byte string is stored once: constants are deduplicated by the SHA-256
of their bytes. Inline constants start 16-byte aligned in the section (each one is
zero-padded to a multiple of 16, as ET-VK does); named constants are stored outside
the blob, keyed by the hex SHA-256 (``VkBytes.offset == NAMED_OFFSET``), so that a
program file can keep one copy of a weight shared by several partitions.
"""
from __future__ import annotations

import hashlib

from vkdelegate.serialization.vkgraph import NAMED_OFFSET, VkBytes

ALIGNMENT = 16


class ConstantSection:
    """Collects constants for one blob.

    ``add(data)`` returns the constant id (index into ``entries``); after all adds,
    ``section`` is the constants section for ``write_blob`` and ``named_data`` the
    bytes of named constants by key.
    """

    def __init__(self, named: bool = False):
        self.named = named
        self.entries: list[VkBytes] = []
        self.named_data: dict[str, bytes] = {}
        self._section = bytearray()
        self._ids: dict[str, int] = {}

    def add(self, data: bytes, key: "str | None" = None) -> int:
        """Adds ``data`` (raw little-endian tensor bytes); returns its constant id,
        the same id for bytes seen before. ``key``: the hex SHA-256 of ``data`` where
        the caller has it (fx_values.ConstantCache)."""
        if key is None:
            key = hashlib.sha256(data).hexdigest()
        if key in self._ids:
            return self._ids[key]
        if self.named:
            self.named_data[key] = bytes(data)
            entry = VkBytes(NAMED_OFFSET, len(data), key)
        else:
            entry = VkBytes(len(self._section), len(data))
            self._section += data
            self._section += bytes(-len(self._section) % ALIGNMENT)
        self._ids[key] = len(self.entries)
        self.entries.append(entry)
        return self._ids[key]

    @property
    def section(self) -> bytes:
        return bytes(self._section)
