"""The program file: one file holding every method of a lowered program.

Layout (little-endian), chosen so that loading never runs code from the file (no
pickle; JSON and raw bytes only) and every byte is checked before use:

| bytes | field |
|---|---|
| 0..8 | magic ``VKDPROG1`` |
| 8..12 | header length, u32 = 64 |
| 12..16 | CRC-32 of the manifest, u32 |
| 16..24 | manifest offset, u64 |
| 24..32 | manifest size, u64 |
| 32..40 | data offset, u64 (64-byte aligned) |
| 40..48 | data size, u64 |
| 48..64 | zero |

The manifest is UTF-8 JSON: ``{"format": "vkdelegate-program", "version": 1,
"segments": [{"offset", "size", "sha256"}], ...}`` plus what the program layer puts
in it. Segments are 64-byte-aligned byte ranges of the data section (delegate blobs,
constants), each stored once: ``SegmentTable.add`` deduplicates by SHA-256 of the
content, and ``read_program`` verifies every segment's hash.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib

from vkdelegate.errors import VkDelegateError

MAGIC = b"VKDPROG1"
HEADER = struct.Struct("<8sIIQQQQ16x")
HEADER_SIZE = HEADER.size  # 64
ALIGNMENT = 64
FORMAT_NAME = "vkdelegate-program"
FORMAT_VERSION = 1


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class SegmentTable:
    """Collects byte segments for writing, storing identical content once."""

    def __init__(self):
        self.segments: list[bytes] = []
        self._index: dict[str, int] = {}

    def add(self, data: bytes) -> int:
        """The segment index holding ``data`` (an existing one if the bytes repeat)."""
        data = bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self._index:
            self._index[digest] = len(self.segments)
            self.segments.append(data)
        return self._index[digest]


def write_program(path, manifest: dict, segments: list[bytes]) -> None:
    """Write ``manifest`` (JSON-ready dict) and ``segments`` to ``path``.

    The ``format``, ``version`` and ``segments`` keys of the manifest are set here.
    """
    table, offset = [], 0
    for data in segments:
        table.append({"offset": offset, "size": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()})
        offset = _align(offset + len(data))
    manifest = dict(manifest, format=FORMAT_NAME, version=FORMAT_VERSION, segments=table)
    text = json.dumps(manifest, separators=(",", ":"), allow_nan=True).encode()
    data_offset = _align(HEADER_SIZE + len(text))
    header = HEADER.pack(MAGIC, HEADER_SIZE, zlib.crc32(text), HEADER_SIZE, len(text),
                         data_offset, offset)
    with open(path, "wb") as f:
        f.write(header)
        f.write(text)
        f.write(b"\0" * (data_offset - HEADER_SIZE - len(text)))
        for data, entry in zip(segments, table):
            f.write(data)
            f.write(b"\0" * (_align(len(data)) - len(data)))


def read_program(path) -> tuple[dict, list[memoryview]]:
    """The manifest and the verified segments of a program file.

    Raises VkDelegateError naming the file and the problem for a file that is not a
    program file (wrong magic, e.g. a pickle or a zip), is truncated, or whose
    manifest or any segment does not match its checksum, and for a ``path`` that is
    not a str or os.PathLike (open() would take an int as a file descriptor).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise VkDelegateError(f"program file path must be a str or os.PathLike, got "
                              f"{type(path).__name__} {path!r}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise VkDelegateError(f"cannot read program file {path}: {exc}") from exc
    where = f"program file {path}"
    if raw[:8] == MAGIC and len(raw) < HEADER_SIZE:
        raise VkDelegateError(f"{where} is truncated: {len(raw)} bytes, the header "
                              f"alone is {HEADER_SIZE}")
    if raw[:8] != MAGIC:
        hint = " (it looks like a pickle)" if raw[:1] == b"\x80" else ""
        hint = " (it looks like a zip/torch.save file)" if raw[:2] == b"PK" else hint
        raise VkDelegateError(f"{where} is not a vkdelegate program: bad magic "
                              f"{raw[:8]!r}{hint}")
    _, hlen, crc, m_off, m_size, d_off, d_size = HEADER.unpack_from(raw)
    if hlen != HEADER_SIZE or m_off + m_size > len(raw) or d_off + d_size > len(raw):
        raise VkDelegateError(f"{where} is truncated or has a corrupt header "
                              f"(file size {len(raw)}, data ends at {d_off + d_size})")
    text = raw[m_off:m_off + m_size]
    if zlib.crc32(text) != crc:
        raise VkDelegateError(f"{where}: manifest checksum mismatch (file corrupted)")
    try:
        manifest = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VkDelegateError(f"{where}: manifest is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise VkDelegateError(f"{where}: manifest is not a {FORMAT_NAME} manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise VkDelegateError(f"{where}: format version {manifest.get('version')!r} is "
                              f"not supported (this vkdelegate reads {FORMAT_VERSION})")
    data = memoryview(raw)[d_off:d_off + d_size]
    segments = []
    for i, entry in enumerate(manifest.get("segments", [])):
        try:
            start, size, digest = int(entry["offset"]), int(entry["size"]), entry["sha256"]
        except (KeyError, TypeError, ValueError):
            raise VkDelegateError(f"{where}: segment {i} entry is malformed") from None
        if start < 0 or size < 0 or start + size > len(data):
            raise VkDelegateError(f"{where}: segment {i} (offset {start}, size {size}) "
                                  f"lies outside the data section of {len(data)} bytes")
        seg = data[start:start + size]
        if hashlib.sha256(seg).hexdigest() != digest:
            raise VkDelegateError(f"{where}: segment {i} checksum mismatch (file corrupted)")
        segments.append(seg)
    return manifest, segments


def list_delegate_blobs(path) -> list[tuple[str, bytes, dict]]:
    """(label, blob bytes, named data) of every delegate in a program file, in method
    order; for ``vkdelegate inspect``. Raises VkDelegateError for a bad file."""
    manifest, segments = read_program(path)
    found = []
    try:
        for name, method in manifest["methods"].items():
            for i, d in enumerate(method["delegates"]):
                named = {k: bytes(segments[v]) for k, v in d["named_data"].items()}
                found.append((f"{path} method {name!r} delegate {i}",
                              bytes(segments[d["blob"]]), named))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise VkDelegateError(f"program file {path}: malformed manifest "
                              f"({type(exc).__name__}: {exc})") from exc
    return found
