"""Session-wide record of what the op tests ran on Vulkan.

``check_op`` (tests/ops/harness.py) adds one entry per delegated node it ran: the
node's ATen overload name, the graph dtypes of its tensor arguments (output last, as
in the VkGraph's OperatorCall.args), and the shader variants its impl dispatched.
tests/ops/test_registry_coverage.py compares that record with the registry's claims.
Torch-free.
"""
from __future__ import annotations

from collections import defaultdict

#: (op name, tuple of tensor dtypes in argument order, output last) seen on Vulkan.
RAN: set[tuple[str, tuple[str, ...]]] = set()

#: op name -> variant keys (vkdelegate.shaders.variants.variant_key) it dispatched.
VARIANTS: dict[str, set] = defaultdict(set)


def record(op: str, dtypes: tuple[str, ...]) -> None:
    """Note that ``op`` ran on Vulkan with tensors of ``dtypes``."""
    RAN.add((op, tuple(dtypes)))


#: False while a test runs forms the lowering never picks (a benchmark's --sweep forms,
#: checked against eager there): what they dispatch is not the declared set's concern.
RECORD_VARIANTS = True


def record_variant(op: str, key: tuple) -> None:
    """Note that ``op``'s impl dispatched the shader variant ``key`` (unless
    RECORD_VARIANTS is off)."""
    if RECORD_VARIANTS:
        VARIANTS[op].add(key)


def dtypes_seen(op: str) -> set[str]:
    """Every dtype any tensor of a recorded ``op`` node had."""
    return {dt for name, dts in RAN if name == op for dt in dts}


#: Why this session did not run every op test (set by tests/ops/conftest.py), or None.
PARTIAL: "str | None" = None
