"""Declared shader variants: every (shader, defines) an op family can ask for.

Op families declare their variants when they register (``declare``), so that
``vkdelegate build-shaders`` can compile all of them ahead of time and a test can check
that every registered (op, dtype) has one. The runtime compiles on demand whatever a
node asks for; a declared list is a promise, not a restriction.
"""
from __future__ import annotations

from typing import Mapping

_VARIANTS: dict[tuple, tuple[str, dict]] = {}


def variant_key(shader: str, defines: Mapping[str, str]) -> tuple:
    """Hashable identity of a variant."""
    return (shader, tuple(sorted((k, str(v)) for k, v in defines.items())))


def declare(shader: str, defines: Mapping[str, str]) -> None:
    """Record that some op may compile ``shader`` with ``defines``."""
    key = variant_key(shader, defines)
    _VARIANTS.setdefault(key, (shader, {k: str(v) for k, v in defines.items()}))


def all_variants() -> list[tuple[str, dict]]:
    """Every declared variant (after ``vkdelegate.ops.registry.load_all()``)."""
    return [_VARIANTS[k] for k in sorted(_VARIANTS)]
