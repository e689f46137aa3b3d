"""Parse a program file's JSON manifest as untrusted text.

``json.loads`` recurses once per nested array or object, so a manifest of 100,000
``[`` ends in RecursionError, and an integer literal of more than 4,300 digits in a
plain ValueError. ``parse_manifest`` measures the nesting first, with a pre-scan of
the brackets outside strings (linear, in C: a regex and a numpy cumulative sum), and
refuses a manifest deeper than ``LoadLimits.max_json_depth`` before ``json.loads``
sees it; every parse failure is a VkDelegateError naming the file.

``Infinity``, ``-Infinity`` and ``NaN`` stay allowed: the writer emits them for
float arguments of CPU glue ops (``scalar_tensor(inf)``, a ``-inf`` pad value), and
every field that must be an integer (segment offsets, shapes, indices) is checked to
be an ``int`` where it is read, so a non-finite number there is refused by name.
"""
from __future__ import annotations

import json
import re

import numpy as np

from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits, check_limit

# A JSON string: the alternatives are disjoint, so matching is linear in its length.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STEP = np.zeros(256, dtype=np.int64)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def json_depth(text: bytes) -> int:
    """Deepest nesting of arrays and objects in JSON ``text`` (0 for a scalar).

    Brackets inside strings do not count; for malformed text the result is only an
    estimate (the parser then refuses the text anyway).
    """
    structure = np.frombuffer(_STRING.sub(b"", text), dtype=np.uint8)
    if structure.size == 0:
        return 0
    return max(int(np.cumsum(_STEP[structure]).max()), 0)


def parse_manifest(text: bytes, where: str, limits: LoadLimits) -> object:
    """The JSON value of UTF-8 ``text``.

    Raises ResourceLimitError for nesting deeper than ``limits.max_json_depth``, and
    VkDelegateError for text that is not UTF-8 or not JSON (including an integer
    literal over Python's digit limit); ``where`` prefixes the message.
    """
    check_limit("manifest JSON nesting depth", json_depth(text), limits.max_json_depth,
                "max_json_depth", where)
    try:
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and the int digit limit; RecursionError
        # cannot happen under the depth limit but must never escape.
        raise VkDelegateError(f"{where}: manifest is not valid JSON: {exc}") from None
