"""Op-test session bookkeeping for the registry coverage test.

The coverage test (test_registry_coverage.py) compares the registry's claims with what
the op tests ran, so it must run after all of them and only when all of them ran.
This hook moves it to the end of the session and records in ``coverage.PARTIAL`` why
the selection is partial (-k/-m, node ids, deselected or uncollected test files), in
which case the coverage test skips with that reason.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.ops import coverage

_HERE = Path(__file__).resolve().parent
_COVERAGE_FILE = "test_registry_coverage.py"
_deselected_here: list[str] = []


def _is_here(item) -> bool:
    return Path(str(item.path)).resolve().parent == _HERE


def pytest_deselected(items):
    _deselected_here.extend(item.nodeid for item in items if _is_here(item))


def _partial_reason(config, items) -> "str | None":
    if hasattr(config, "workerinput"):  # pytest-xdist: each worker runs a share
        return "tests spread over pytest-xdist workers (run tests/ops without -n)"
    if config.option.keyword:
        return f"tests selected with -k {config.option.keyword!r}"
    if config.option.markexpr:
        return f"tests selected with -m {config.option.markexpr!r}"
    if any("::" in str(arg) for arg in config.args):
        return "tests selected by node id"
    if _deselected_here:
        return f"{len(_deselected_here)} op test(s) deselected, e.g. {_deselected_here[0]}"
    collected = {Path(str(item.path)).resolve().name for item in items if _is_here(item)}
    missing = sorted(p.name for p in _HERE.glob("test_*.py") if p.name not in collected)
    if missing:
        return f"op test files not collected in this session: {', '.join(missing)}"
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    # trylast: after -k/-m/--lf deselection, so ``items`` is the final selection.
    coverage.PARTIAL = _partial_reason(config, items)
    last = [i for i in items if _is_here(i) and Path(str(i.path)).name == _COVERAGE_FILE]
    items[:] = [i for i in items if i not in last] + last
