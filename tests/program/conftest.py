"""Fixtures for end-to-end lowering tests: the executors delegates run on."""
import pytest

# None if the Vulkan runtime can run here, else why not (tests import this name).
from tests.vulkan_skip import vulkan_unavailable as _vulkan_available


@pytest.fixture(params=["reference", "vulkan"])
def executor(request):
    """Run each test with delegates on the CPU reference executor and on Vulkan."""
    if request.param == "vulkan":
        reason = _vulkan_available()
        if reason:
            pytest.skip(reason)
    return request.param
