"""Declared shader variants: every (shader, defines) an op family can ask for.

Op families declare their variants when they register (``declare``, or
``declare_grid`` for the product of their variant axes), so that
``vkdelegate build-shaders`` can compile all of them ahead of time and a test can check
that every registered (op, dtype) has one. The runtime compiles on demand whatever a
node asks for; a declared list is a promise, not a restriction.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable, Mapping

_VARIANTS: dict[tuple, tuple[str, dict]] = {}


def variant_key(shader: str, defines: Mapping[str, str]) -> tuple:
    """Hashable identity of a variant."""
    return (shader, tuple(sorted((k, str(v)) for k, v in defines.items())))


def declare(shader: str, defines: Mapping[str, str]) -> None:
    """Record that some op may compile ``shader`` with ``defines``."""
    key = variant_key(shader, defines)
    _VARIANTS.setdefault(key, (shader, {k: str(v) for k, v in defines.items()}))


def flag_defines(**flags: bool) -> dict[str, str]:
    """Defines for on/off shader flags: each name whose value is true, as ``"1"`` (the
    GLSL tests them with ``#ifdef``); ``flag_defines(CLAMP=True, LONG_K=False)`` gives
    ``{"CLAMP": "1"}``."""
    return {name: "1" for name, on in flags.items() if on}


def all_variants() -> list[tuple[str, dict]]:
    """Every declared variant (after ``vkdelegate.ops.registry.load_all()``)."""
    return [_VARIANTS[k] for k in sorted(_VARIANTS)]


def declare_grid(shaders, defines_fn: Callable[..., object], **axes: Iterable) -> None:
    """Declare the variants of an op's whole variant grid.

    ``axes`` maps each axis name to its values (``profile=STORAGE_PROFILES,
    dtype=DTYPES, clamp=(False, True)``); for every point of their product (in the
    order given) ``defines_fn(**point)`` gives that point's defines: one mapping, an
    iterable of mappings (several forms of one point, as ``kernels.rows.row_forms``
    gives), or None (a point the op never asks for, such as dtypes that do not
    promote). Each is declared for ``shaders`` (one name or a tuple of names).
    """
    names = (shaders,) if isinstance(shaders, str) else tuple(shaders)
    keys = list(axes)
    for values in itertools.product(*(tuple(axes[k]) for k in keys)):
        found = defines_fn(**dict(zip(keys, values)))
        if found is None:
            continue
        for defines in ([found] if isinstance(found, Mapping) else found):
            for shader in names:
                declare(shader, defines)
