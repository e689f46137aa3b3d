"""Crafted program files for the load-limit and fuzz tests: a real saved program whose
manifest text or segment table is then edited by hand (with a matching CRC)."""
from __future__ import annotations

import functools
import json
import os
import tempfile
import zlib

import torch

from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.serialization import program_file


class Glue(torch.nn.Module):
    """A delegate, CPU glue (sort: getitem), a glue constant (w) and a state."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1.0)
        # sort runs on the CPU: sorting w makes w a glue constant.
        return torch.sort(torch.relu(x))[0] + torch.sort(self.w)[0] - self.count


def example():
    """The input Glue was exported with (seeded)."""
    torch.manual_seed(1)
    return torch.randn(3, 4)


@functools.lru_cache(maxsize=1)
def _saved() -> tuple[str, bytes]:
    torch.manual_seed(0)
    ep = torch.export.export(Glue(), (example(),))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "p.vkp")
        program.save(path)
        raw = open(path, "rb").read()
    _, _, _, m_off, m_size, d_off, d_size = program_file.HEADER.unpack_from(raw)
    return raw[m_off:m_off + m_size].decode(), raw[d_off:d_off + d_size]


def manifest() -> dict:
    """A fresh copy of the saved program's manifest (segments table included)."""
    return json.loads(_saved()[0])


def data_section() -> bytes:
    """The saved program's data section (its segments' bytes)."""
    return _saved()[1]


def write_raw(path, text: "str | bytes | dict", data: "bytes | None" = None) -> str:
    """Write a program file holding manifest ``text`` verbatim (a dict is dumped with
    Infinity/NaN allowed) and the data section ``data`` (default: the saved one's),
    with a correct header and CRC, so only the content is crafted."""
    if isinstance(text, dict):
        text = json.dumps(text, allow_nan=True)
    text = text.encode() if isinstance(text, str) else text
    data = data_section() if data is None else data
    d_off = program_file._align(program_file.HEADER_SIZE + len(text))
    header = program_file.HEADER.pack(program_file.MAGIC, program_file.HEADER_SIZE,
                                      zlib.crc32(text), program_file.HEADER_SIZE,
                                      len(text), d_off, len(data))
    with open(path, "wb") as f:
        f.write(header + text + b"\0" * (d_off - program_file.HEADER_SIZE - len(text))
                + data)
    return str(path)


def json_paths(value, prefix=(), max_depth: "int | None" = None):
    """Every path (a tuple of keys and indices) inside a JSON value, ``prefix`` first;
    below ``max_depth`` keys nothing deeper is listed."""
    yield prefix
    if max_depth is not None and len(prefix) > max_depth:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from json_paths(v, prefix + (k,), max_depth)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from json_paths(v, prefix + (i,), max_depth)
