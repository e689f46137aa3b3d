"""Fixtures for end-to-end lowering tests: the executors delegates run on."""
import pytest


def _vulkan_available() -> str | None:
    """None if the Vulkan runtime can run here, else why not."""
    try:
        from vkdelegate.runtime import list_devices

        if not list_devices():
            return "no Vulkan device"
    except Exception as exc:  # no loader, no driver, runtime not importable
        return f"Vulkan runtime unavailable: {type(exc).__name__}: {exc}"
    return None


@pytest.fixture(params=["reference", "vulkan"])
def executor(request):
    """Run each test with delegates on the CPU reference executor and on Vulkan."""
    if request.param == "vulkan":
        reason = _vulkan_available()
        if reason:
            pytest.skip(reason)
    return request.param
