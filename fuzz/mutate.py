"""Structure-aware mutation of program files (an atheris custom mutator).

A program file checks a CRC-32 over its manifest and a SHA-256 per segment, so random
byte flips almost never get past ``read_program``. This mutator decodes the file,
changes one thing (a JSON value of the manifest, a segment's bytes through libFuzzer's
own mutator, or the segment table), and encodes it again with valid checksums, so the
fuzzer reaches the manifest, plan, glue and delegate code behind the checks. One
mutation in eight is a plain byte mutation, to keep the checks themselves fuzzed.
Inputs that are not program files (blobs) get plain byte mutations.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import zlib

from vkdelegate.serialization import program_file as pf

# A string value encode() replaces with that many nested lists: json.dumps cannot
# write them (it recurses), and JSON this deep is what a hostile file sends.
_DEEP = "@deep@"

# Values that sit on edges the loaders must range-check.
EDGE_INTS = [0, 1, -1, 2, 3, 7, 255, 65504, 65535, 65537, 1 << 28, (1 << 31) - 1, 1 << 31,
             1 << 32, (1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 31) - 1]
EDGE_FLOATS = [float("inf"), float("-inf"), float("nan"), 1e38, -0.0, 65505.0, 1e-45]
STRINGS = ["aten.from_file.default", "aten.full.default", "aten.empty.memory_format",
           "aten.add.Tensor", "aten.relu.default", "delegate", "getitem", "bfloat16",
           "float16", "int64", "bool", "float32", "uint64", "object", "reference",
           "vulkan", "", "x" * 300,
           # Control characters, which an error or inspect must show escaped.
           "aten.add.Tensor\x1c\n\x00\u2028"]


def decode(data: bytes):
    """(manifest dict, [segment bytes]) of a well-formed program file, else None."""
    if data[:8] != pf.MAGIC or len(data) < pf.HEADER_SIZE:
        return None
    try:
        _, _, _, m_off, m_size, d_off, d_size = pf.HEADER.unpack_from(data)
        manifest = json.loads(data[m_off:m_off + m_size].decode("utf-8"))
        section = data[d_off:d_off + d_size]
        segments = [section[int(e["offset"]):int(e["offset"]) + int(e["size"])]
                    for e in manifest.get("segments", [])]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    if not isinstance(manifest, dict):
        return None
    return manifest, segments


def encode(manifest: dict, segments: list[bytes], table=None) -> bytes:
    """A program file holding ``manifest`` and ``segments`` with valid checksums.

    table: the segment table to store (default: the true one); a mutated table is
    stored as given, with a valid CRC over the manifest."""
    body = b"".join(seg + bytes(pf._align(len(seg)) - len(seg)) for seg in segments)
    manifest = dict(manifest, segments=true_table(segments) if table is None else table)
    text = json.dumps(manifest, separators=(",", ":"), allow_nan=True)
    text = re.sub(f'"{_DEEP}(\\d+)"', lambda m: "[" * int(m[1]) + "]" * int(m[1]), text)
    text = text.encode()
    d_off = pf._align(pf.HEADER_SIZE + len(text))
    header = pf.HEADER.pack(pf.MAGIC, pf.HEADER_SIZE, zlib.crc32(text), pf.HEADER_SIZE,
                            len(text), d_off, len(body))
    return header + text + bytes(d_off - pf.HEADER_SIZE - len(text)) + bytes(body)


def true_table(segments: list[bytes]) -> list[dict]:
    """The segment table ``write_program`` would store for ``segments``."""
    entries, offset = [], 0
    for seg in segments:
        entries.append({"offset": offset, "size": len(seg),
                        "sha256": hashlib.sha256(seg).hexdigest()})
        offset += pf._align(len(seg))
    return entries


def _slots(node, out: list) -> list:
    """Every (container, key) pair under ``node``, depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for key, value in items:
        out.append((node, key))
        _slots(value, out)
    return out


def _new_value(old, rng: random.Random, slots: list):
    roll = rng.random()
    if roll < 0.15 and slots:  # another subtree of the same file: type confusion
        container, key = rng.choice(slots)
        return json.loads(json.dumps(container[key]))
    if roll < 0.2:  # deep nesting, spliced in as text by encode()
        return f"{_DEEP}{rng.choice([40, 200, 3000, 100000])}"
    if isinstance(old, bool) or roll < 0.25:
        return rng.choice([True, False, None, 0, "", [], {}])
    if isinstance(old, int):
        if rng.random() < 0.7:
            return rng.choice(EDGE_INTS)
        return old + rng.choice([-1, 1, old, -2 * old])
    if isinstance(old, float):
        return rng.choice(EDGE_FLOATS + EDGE_INTS)
    if isinstance(old, str):
        return rng.choice(STRINGS)
    if isinstance(old, list):
        if old and rng.random() < 0.5:
            return old + [old[rng.randrange(len(old))]] * rng.choice([1, 2, 1000])
        return old[:-1] if old else [rng.choice(EDGE_INTS)]
    if isinstance(old, dict):
        if old and rng.random() < 0.5:
            drop = rng.choice(list(old))
            return {k: v for k, v in old.items() if k != drop}
        return dict(old, **{rng.choice(STRINGS[:8]): rng.choice(EDGE_INTS)})
    return rng.choice(EDGE_INTS)


def _mutate_table(segments: list[bytes], rng: random.Random):
    table = true_table(segments)
    if not table:
        return rng.choice([{}, "x", [1], None])
    entry = rng.choice(table)
    roll = rng.random()
    if roll < 0.3:
        table.append(dict(entry))  # a duplicate (overlapping) segment
    elif roll < 0.6:
        entry[rng.choice(["offset", "size"])] = rng.choice(EDGE_INTS)
    elif roll < 0.8:
        table[:] = table * rng.choice([2, 50])
    else:
        return rng.choice([{}, "segments", 7, None, [table]])
    return table


def mutate(data: bytes, max_size: int, seed: int, byte_mutate) -> bytes:
    """One mutation of ``data`` (at most ``max_size`` bytes where libFuzzer's own
    mutator is used). byte_mutate: ``atheris.Mutate``."""
    rng = random.Random(seed)
    decoded = decode(data)
    if decoded is None or rng.random() < 0.125:
        return byte_mutate(data, max_size)
    manifest, segments = decoded
    roll = rng.random()
    if roll < 0.55:
        slots = _slots(manifest, [])
        slots = [s for s in slots if not (s[0] is manifest and s[1] == "segments")]
        if slots:
            container, key = rng.choice(slots)
            container[key] = _new_value(container[key], rng, slots)
        out = encode(manifest, segments)
    elif roll < 0.9 and segments:
        i = rng.randrange(len(segments))
        segments[i] = byte_mutate(bytes(segments[i]), max(64, 2 * len(segments[i])))
        out = encode(manifest, segments)
    else:
        out = encode(manifest, segments, table=_mutate_table(segments, rng))
    return out if len(out) <= max_size else byte_mutate(data, max_size)
