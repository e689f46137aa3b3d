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
import secrets
import struct
import zlib

from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits, check_limit, resolve_limits
from vkdelegate.serialization.manifest_json import parse_manifest

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
        # id(object added) -> (the object, its index): a weight every method's
        # delegates share (fx_values.ConstantCache, a loaded program's views) is
        # hashed once, not per method.
        self._seen: dict[int, tuple] = {}

    def add(self, data) -> int:
        """The segment index holding ``data`` (bytes or a buffer such as a loaded
        program's memoryview; an existing index if the bytes repeat)."""
        seen = self._seen.get(id(data))
        if seen is not None:
            return seen[1]
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self._index:
            self._index[digest] = len(self.segments)
            self.segments.append(bytes(data))
        self._seen[id(data)] = (data, self._index[digest])
        return self._index[digest]


def check_overwrite(path) -> None:
    """Refuse to save over ``path`` unless it is absent, empty or a program file: a
    model's weights (``lower-llm CKPT -o CKPT/model.safetensors``) or any other file of
    the user's is not replaced. Raises VkDelegateError naming ``path``."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise VkDelegateError(f"cannot save the program to {path}: it is a directory")
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except FileNotFoundError:
        return
    except OSError:
        return  # unreadable: the write reports what is wrong with the path
    if head and head != MAGIC:
        raise VkDelegateError(f"cannot save the program to {path}: that file exists and "
                              f"is not a vkdelegate program file (it starts with "
                              f"{head!r}); it was not overwritten: delete it or choose "
                              f"another name")


def write_program(path, manifest: dict, segments: list[bytes]) -> None:
    """Write ``manifest`` (JSON-ready dict) and ``segments`` to ``path``.

    The ``format``, ``version`` and ``segments`` keys of the manifest are set here.
    The file is written next to ``path`` under a temporary name and renamed over it
    when complete, so a failed write (a full disk) leaves a file already at ``path``
    as it was. Raises VkDelegateError naming ``path`` when it cannot be written (a
    missing folder, a directory, no permission, no space) or holds a file that is not
    a program file (``check_overwrite``).
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
    path = os.fspath(path)
    check_overwrite(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        # O_EXCL on a fresh random name; mode 0o666 less the umask, as open() gives.
        name = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                     0o666)
        tmp = name
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(text)
            f.write(b"\0" * (data_offset - HEADER_SIZE - len(text)))
            for data, entry in zip(segments, table):
                f.write(data)
                f.write(b"\0" * (_align(len(data)) - len(data)))
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if not os.path.isdir(folder):
            reason = f"folder {folder} does not exist"
        raise VkDelegateError(f"cannot save the program to {path}: {reason}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _segment_ranges(table, data_size: int, where: str, limits: LoadLimits
                    ) -> list[tuple[int, int, str]]:
    """(offset, size, sha256) of each segment-table entry, checked: a list of at most
    ``limits.max_segments`` entries, int offsets and sizes inside the data section,
    and no two entries covering overlapping but different byte ranges (the writer
    stores each content once; overlaps only come from crafting)."""
    if not isinstance(table, list):
        raise VkDelegateError(f"{where}: manifest segments must be a list, got "
                              f"{type(table).__name__}")
    check_limit("segment count", len(table), limits.max_segments, "max_segments", where)
    ranges = []
    for i, entry in enumerate(table):
        if not isinstance(entry, dict):
            raise VkDelegateError(f"{where}: segment {i} entry is malformed: must be a "
                                  f"dict, got {type(entry).__name__}")
        for key in ("offset", "size"):
            if not _is_int(entry.get(key)):
                raise VkDelegateError(f"{where}: segment {i} entry is malformed: {key} "
                                      f"must be an int, got {entry.get(key)!r}")
        start, size, digest = entry["offset"], entry["size"], entry.get("sha256")
        if not isinstance(digest, str):
            raise VkDelegateError(f"{where}: segment {i} entry is malformed: sha256 "
                                  f"must be a str, got {type(digest).__name__}")
        if start < 0 or size < 0 or start + size > data_size:
            raise VkDelegateError(f"{where}: segment {i} (offset {start}, size {size}) "
                                  f"lies outside the data section of {data_size} bytes")
        ranges.append((start, size, digest))
    # Sorted by start, a range overlaps an earlier one iff it starts before the
    # furthest end so far; an empty range overlaps nothing.
    order = sorted((r[0], r[1], i) for i, r in enumerate(ranges) if r[1] > 0)
    furthest = None  # (end, index) of the range that reaches furthest
    for start, size, i in order:
        if furthest is not None and start < furthest[0]:
            j = furthest[1]
            if ranges[j][:2] != (start, size):
                first, second = sorted((i, j))
                a, b = ranges[first], ranges[second]
                raise VkDelegateError(
                    f"{where}: segments {first} (bytes {a[0]}..{a[0] + a[1]}) and "
                    f"{second} (bytes {b[0]}..{b[0] + b[1]}) overlap")
        if furthest is None or start + size > furthest[0]:
            furthest = (start + size, i)
    return ranges


def _check_padding(raw, manifest: tuple[int, int], d_off: int, ranges, where: str
                   ) -> None:
    """Every byte of the file that neither the header, the manifest nor a segment
    covers is the writer's zero padding (to the 64-byte alignments), so that a flipped
    byte anywhere fails the load, not only one inside a checksummed range (read_program
    has checked that the file ends with its data section). Raises VkDelegateError
    naming the first nonzero padding byte."""
    covered = sorted([(0, HEADER_SIZE), manifest] +
                     [(d_off + start, d_off + start + size) for start, size, _ in ranges
                      if size > 0])
    at = 0
    for start, end in covered + [(len(raw), len(raw))]:
        if start > at:
            gap = raw[at:start]
            if any(gap):
                first = at + next(i for i, b in enumerate(gap) if b)
                raise VkDelegateError(f"{where}: byte {first} (padding between the "
                                      f"checksummed parts) is not zero (file corrupted)")
        at = max(at, end)


def read_program(path, limits: "LoadLimits | None" = None
                 ) -> tuple[dict, list[memoryview]]:
    """The manifest and the verified segments of a program file.

    Raises VkDelegateError naming the file and the problem for a file that is not a
    program file (wrong magic, e.g. a pickle or a zip), is truncated, or whose
    manifest or any segment does not match its checksum, and for a ``path`` that is
    not a str or os.PathLike (open() would take an int as a file descriptor), and
    for a nonzero padding byte or bytes after the data section (``_check_padding``:
    no byte of the file goes unchecked).
    limits: the budget (``vkdelegate.limits.LoadLimits``, None: the defaults); a
    manifest nested deeper than ``max_json_depth`` or with more than
    ``max_segments`` segments raises ResourceLimitError. Segment offsets and sizes
    must be ints inside the data section, and two entries may cover the same bytes
    only exactly.
    """
    limits = resolve_limits(limits)
    if not isinstance(path, (str, os.PathLike)):
        raise VkDelegateError(f"program file path must be a str or os.PathLike, got "
                              f"{type(path).__name__} {path!r}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise VkDelegateError(f"cannot read program file {path}: "
                              f"{exc.strerror or exc}") from exc
    where = f"program file {path}"
    if raw[:8] == MAGIC and len(raw) < HEADER_SIZE:
        raise VkDelegateError(f"{where} is truncated: {len(raw)} bytes, the header "
                              f"alone is {HEADER_SIZE}")
    if not raw:
        raise VkDelegateError(f"{where} is empty (0 bytes), not a vkdelegate program")
    if raw[:8] != MAGIC:
        hint = " (it looks like a pickle)" if raw[:1] == b"\x80" else ""
        hint = " (it looks like a zip/torch.save file)" if raw[:2] == b"PK" else hint
        raise VkDelegateError(f"{where} is not a vkdelegate program: bad magic "
                              f"{raw[:8]!r}{hint}")
    _, hlen, crc, m_off, m_size, d_off, d_size = HEADER.unpack_from(raw)
    if any(raw[48:HEADER_SIZE]):
        raise VkDelegateError(f"{where} has a corrupt header: its reserved bytes 48..64 "
                              f"are not zero")
    if hlen != HEADER_SIZE or m_off + m_size > len(raw) or d_off + d_size > len(raw):
        raise VkDelegateError(f"{where} is truncated or has a corrupt header (file size "
                              f"{len(raw)}; the header says: header {hlen} bytes (expected "
                              f"{HEADER_SIZE}), manifest ends at {m_off + m_size}, data "
                              f"ends at {d_off + d_size})")
    if d_off + d_size < len(raw):
        extra = len(raw) - d_off - d_size
        raise VkDelegateError(f"{where} has {extra} byte{'s' if extra != 1 else ''} after "
                              f"its data section (which ends at byte {d_off + d_size}): "
                              f"not a file save() wrote as it is (appended to, or a "
                              f"corrupt header)")
    text = raw[m_off:m_off + m_size]
    if zlib.crc32(text) != crc:
        raise VkDelegateError(f"{where}: manifest checksum mismatch (file corrupted)")
    manifest = parse_manifest(bytes(text), where, limits)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise VkDelegateError(f"{where}: manifest is not a {FORMAT_NAME} manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise VkDelegateError(f"{where}: format version {manifest.get('version')!r} is "
                              f"not supported (this vkdelegate reads {FORMAT_VERSION})")
    data = memoryview(raw)[d_off:d_off + d_size]
    ranges = _segment_ranges(manifest.get("segments", []), len(data), where, limits)
    _check_padding(raw, (m_off, m_off + m_size), d_off, ranges, where)
    segments = []
    for i, (start, size, digest) in enumerate(ranges):
        seg = data[start:start + size]
        if hashlib.sha256(seg).hexdigest() != digest:
            raise VkDelegateError(f"{where}: segment {i} checksum mismatch (file corrupted)")
        segments.append(seg)
    return manifest, segments


def list_delegate_blobs(path, limits: "LoadLimits | None" = None
                        ) -> list[tuple[str, bytes, dict]]:
    """(label, blob bytes, named data) of every delegate in a program file, in method
    order; for ``vkdelegate inspect``. Raises VkDelegateError for a bad file
    (ResourceLimitError for one over ``limits``, see ``read_program``)."""
    manifest, segments = read_program(path, limits)
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
