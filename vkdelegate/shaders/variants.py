"""Declared shader variants: every (shader, defines) an op family can ask for.

Op families declare their variants when they register (``declare``, or
``declare_grid`` for the product of their variant axes), so that
``vkdelegate build-shaders`` can compile all of them ahead of time and a test can check
that every registered (op, dtype) has one. The runtime compiles on demand whatever a
node asks for; a declared list is a promise, not a restriction.

A variant may declare the Vulkan features it needs (``requires=("shaderFloat16",)``,
names of vkdelegate/capabilities.py): ``choose`` picks the first candidate the device's
capability table satisfies, and ``check`` (run before any pipeline is created) refuses
a variant whose features the device lacks, with an error naming them.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable, Mapping, Sequence

from vkdelegate.capabilities import ALL_FEATURES
from vkdelegate.errors import VkDelegateError

_VARIANTS: dict[tuple, tuple[str, dict]] = {}
_REQUIRES: dict[tuple, tuple[str, ...]] = {}  # variant key -> Vulkan feature names
_OPEN: dict[str, str] = {}  # shader -> why its variants are made per graph


def declare_open(shader: str, why: str) -> None:
    """Record that ``shader``'s variants are made per graph (a fused elementwise
    chain's body is the graph's ops), so no list can hold them all: they compile on
    first use, and the declared ones are only examples (``vkdelegate build-shaders``
    compiles those)."""
    _OPEN[shader] = why


def is_open(shader: str) -> bool:
    """Whether ``shader``'s variants are made per graph (``declare_open``)."""
    return shader in _OPEN


def variant_key(shader: str, defines: Mapping[str, str]) -> tuple:
    """Hashable identity of a variant."""
    return (shader, tuple(sorted((k, str(v)) for k, v in defines.items())))


def declare(shader: str, defines: Mapping[str, str], requires: Sequence[str] = ()) -> None:
    """Record that some op may compile ``shader`` with ``defines``, on devices that
    have every Vulkan feature in ``requires`` (VkDelegateError for a name that is not
    in vkdelegate.capabilities.ALL_FEATURES)."""
    unknown = sorted(set(requires) - ALL_FEATURES)
    if unknown:
        raise VkDelegateError(f"shader {shader}: requires unknown Vulkan feature(s) "
                              f"{', '.join(unknown)}; known: {', '.join(sorted(ALL_FEATURES))}")
    key = variant_key(shader, defines)
    _VARIANTS.setdefault(key, (shader, {k: str(v) for k, v in defines.items()}))
    if requires:
        _REQUIRES[key] = tuple(sorted(set(_REQUIRES.get(key, ())) | set(requires)))


def requirements(shader: str, defines: Mapping[str, str]) -> tuple[str, ...]:
    """The Vulkan features variant (``shader``, ``defines``) was declared to need."""
    return _REQUIRES.get(variant_key(shader, defines), ())


def _describe(defines: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(defines.items())) or "no defines"


def check(shader: str, defines: Mapping[str, str], capabilities) -> None:
    """VkDelegateError naming the shader, the variant and the missing features when
    ``capabilities`` (a vkdelegate.capabilities.Capabilities) lacks one it requires."""
    missing = capabilities.missing(requirements(shader, defines))
    if missing:
        raise VkDelegateError(f"shader {shader} ({_describe(defines)}) needs Vulkan "
                              f"feature(s) {', '.join(missing)}, which the device lacks")


def choose(shader: str, candidates: Sequence[Mapping[str, str]], capabilities) -> dict:
    """The first of ``candidates`` (defines of ``shader``, preferred first) whose
    required features ``capabilities`` has. VkDelegateError listing each candidate
    and what it misses when none fits."""
    why = []
    for defines in candidates:
        missing = capabilities.missing(requirements(shader, defines))
        if not missing:
            return dict(defines)
        why.append(f"{_describe(defines)} needs {', '.join(missing)}")
    raise VkDelegateError(f"no variant of shader {shader} fits the device: "
                          f"{'; '.join(why) or 'no candidates'}")


def all_variants(capabilities=None) -> list[tuple[str, dict]]:
    """Every declared variant (after ``vkdelegate.ops.registry.load_all()``); with
    ``capabilities``, only those whose required features it has."""
    return [_VARIANTS[k] for k in sorted(_VARIANTS)
            if capabilities is None or not capabilities.missing(_REQUIRES.get(k, ()))]


def flag_defines(**flags: bool) -> dict[str, str]:
    """Defines for on/off shader flags: each name whose value is true, as ``"1"`` (the
    GLSL tests them with ``#ifdef``); ``flag_defines(CLAMP=True, LONG_K=False)`` gives
    ``{"CLAMP": "1"}``."""
    return {name: "1" for name, on in flags.items() if on}


def declare_grid(shaders, defines_fn: Callable[..., object], *,
                 requires: Sequence[str] = (), **axes: Iterable) -> None:
    """Declare the variants of an op's whole variant grid.

    ``axes`` maps each axis name to its values (``profile=STORAGE_PROFILES,
    dtype=DTYPES, clamp=(False, True)``); for every point of their product (in the
    order given) ``defines_fn(**point)`` gives that point's defines: one mapping, an
    iterable of mappings (several forms of one point, as ``kernels.rows.row_forms``
    gives), or None (a point the op never asks for, such as dtypes that do not
    promote). Each is declared for ``shaders`` (one name or a tuple of names), with
    ``requires`` as for ``declare``.
    """
    names = (shaders,) if isinstance(shaders, str) else tuple(shaders)
    keys = list(axes)
    for values in itertools.product(*(tuple(axes[k]) for k in keys)):
        found = defines_fn(**dict(zip(keys, values)))
        if found is None:
            continue
        for defines in ([found] if isinstance(found, Mapping) else found):
            for shader in names:
                declare(shader, defines, requires)
