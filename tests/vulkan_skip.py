"""Why the Vulkan runtime cannot run here, for tests that skip without it.

Shared by the op harness (tests/ops/harness.py) and the end-to-end fixtures
(tests/program/conftest.py).
"""
from __future__ import annotations


def vulkan_unavailable() -> str | None:
    """None if the Vulkan runtime can run here (a loader, a driver and at least one
    device), else the reason it cannot, for pytest.skip."""
    try:
        from vkdelegate.runtime import list_devices

        if not list_devices():
            return "no Vulkan device"
    except Exception as exc:  # no loader, no driver, runtime not importable
        return f"Vulkan runtime unavailable: {type(exc).__name__}: {exc}"
    return None


def _requires_vulkan():
    import pytest

    reason = vulkan_unavailable()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


#: Marks a test that runs Vulkan work without the ``vk_device`` fixture (a subprocess,
#: the CLI, a program's default device): skipped with the reason where there is none.
requires_vulkan = _requires_vulkan()
