"""The delegate blob: VH00 header, VK00 flatbuffer, constants section.

Layout (docs/DESIGN.md section 3, the same as ExecuTorch's Vulkan backend)::

    [0, 30)    VH00 header (header.py), zero-padded to 32
    [32, ...)  VkGraph flatbuffer, zero-padded to a multiple of 16
    [c, ...)   constants section; each inline constant starts 16-byte aligned
               (VkBytes.offset is relative to the section's start)

``write_blob`` takes the constants section already laid out (the builder does that)
and checks that every inline VkBytes lies inside it; ``read_blob`` verifies everything
and raises only VkDelegateError.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits
from vkdelegate.serialization.flatbuffer_reader import graph_from_flatbuffer
from vkdelegate.serialization.flatbuffer_writer import graph_to_flatbuffer
from vkdelegate.serialization.header import HEADER_LENGTH, BlobHeader
from vkdelegate.serialization.vkgraph import DelegateBlob, VkGraph

#: Alignment of the flatbuffer and of the constants section, and of each constant in it.
ALIGNMENT = 16


def align(n: int, alignment: int = ALIGNMENT) -> int:
    """``n`` rounded up to a multiple of ``alignment``."""
    return (n + alignment - 1) // alignment * alignment


def _check_constants(graph: VkGraph, section_size: int) -> None:
    for i, c in enumerate(graph.constants):
        if not c.is_named and c.offset + c.length > section_size:
            raise VkDelegateError(
                f"constant {i}: bytes [{c.offset}, {c.offset + c.length}) lie outside "
                f"the {section_size}-byte constants section")


def write_blob(graph: VkGraph, constants: bytes = b"") -> bytes:
    """Serializes ``graph`` with the constants section ``constants`` into one blob.

    ``constants`` is the raw section that the inline ``graph.constants`` entries point
    into. Raises VkDelegateError if an inline constant lies outside it or a graph field
    does not fit its schema type.
    """
    _check_constants(graph, len(constants))
    fb = graph_to_flatbuffer(graph)
    fb_offset = align(HEADER_LENGTH)
    constants_offset = align(fb_offset + len(fb))
    header = BlobHeader(fb_offset, len(fb), constants_offset, len(constants))
    out = bytearray(header.to_bytes())
    out += bytes(fb_offset - len(out))
    out += fb
    out += bytes(constants_offset - len(out))
    out += constants
    return bytes(out)


def read_blob(data: bytes | bytearray | memoryview,
              limits: LoadLimits | None = None) -> DelegateBlob:
    """Parses and verifies a delegate blob.

    Returns a DelegateBlob whose ``constants_section`` is a zero-copy memoryview into
    ``data``. Raises VkDelegateError (never anything else) for a malformed header, a
    flatbuffer that fails verification, an id out of range, a ValueList that contains
    itself, or an inline constant outside the constants section; the message names the
    offset or id. ResourceLimitError (a VkDelegateError) for more nodes or values or
    deeper ValueList nesting than ``limits`` allow (None: the defaults).
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError as exc:
        raise VkDelegateError(f"delegate blob must be bytes-like, got "
                              f"{type(data).__name__}") from exc
    header = BlobHeader.from_bytes(view)
    fb = view[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size]
    graph = graph_from_flatbuffer(fb, header.flatbuffer_offset, limits)
    section = view[header.constants_offset:header.constants_offset + header.constants_size]
    _check_constants(graph, len(section))
    return DelegateBlob(graph=graph, constants_section=section, header=header)
