"""The registry's claims against what the op tests ran (runs last; see conftest.py).

Every (op, dtype) an OpSpec accepts must have run on Vulkan in some op test
(``check_op`` records it), and every shader variant an op dispatched must be declared
(``vkdelegate.shaders.variants.declare``) so that ``vkdelegate build-shaders`` compiles
it ahead of time.
"""
from __future__ import annotations

import pytest

from tests.ops import coverage
from vkdelegate.ops.registry import load_all
from vkdelegate.shaders.variants import all_variants, is_open, variant_key


def _skip_if_partial():
    if coverage.PARTIAL:
        pytest.skip(f"registry coverage needs the whole tests/ops folder: "
                    f"{coverage.PARTIAL}")


def claimed_dtypes(spec) -> set[str]:
    """Every dtype the op accepts for some tensor argument or output."""
    claimed = set(spec.dtypes)
    for dtypes in spec.arg_dtypes.values():
        claimed |= set(dtypes)
    return claimed


def test_every_claimed_op_dtype_ran_on_vulkan():
    _skip_if_partial()
    missing = []
    for name, spec in sorted(load_all().items()):
        if spec.returns == "symint":
            # Host-side SymInt ops (sym_size.int, SymInt arithmetic) read sizes the
            # runtime knows; no shader touches the tensor's data, so its dtype cannot
            # matter. tests/ops/test_symbolic_sizes.py tests them.
            continue
        seen = coverage.dtypes_seen(name)
        missing += [f"{name} {dt}" for dt in sorted(claimed_dtypes(spec) - seen)]
    assert not missing, (f"{len(missing)} claimed (op, dtype) pairs were not run by any "
                         f"check_op test in tests/ops:\n  " + "\n  ".join(missing))


def test_every_dispatched_variant_is_declared():
    _skip_if_partial()
    load_all()
    declared = {variant_key(shader, defines) for shader, defines in all_variants()}
    undeclared = sorted(f"{op}: {key[0]} {dict(key[1])}"
                        for op, keys in coverage.VARIANTS.items()
                        for key in keys - declared
                   # A fused chain's variant is its graph's (variants.declare_open).
                   if not is_open(key[0]))
    assert not undeclared, ("shader variants dispatched but not declared:\n  "
                            + "\n  ".join(undeclared))

