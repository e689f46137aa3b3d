"""Shared test fixtures.

Every test runs with the Khronos validation layer on the default Vulkan device
(VKDELEGATE_VALIDATION=1) and fails if the layer reported anything during the test.
``vk_device`` gives that device, or skips the test with a reason when there is none.
"""
import os
import sys

import pytest

os.environ.setdefault("VKDELEGATE_VALIDATION", "1")


@pytest.fixture(autouse=True)
def _fail_on_validation_messages():
    device_module = sys.modules.get("vkdelegate.runtime.device")
    if device_module is not None:
        device_module.drain_validation_messages()
    yield
    device_module = sys.modules.get("vkdelegate.runtime.device")
    if device_module is not None:
        messages = device_module.drain_validation_messages()
        if messages:
            pytest.fail("Vulkan validation layer reported:\n" + "\n".join(messages))


@pytest.fixture(scope="session")
def vk_device():
    try:
        from vkdelegate.runtime import default_device

        return default_device()
    except Exception as exc:  # no loader, no driver or no validation layer installed
        pytest.skip(f"no Vulkan device with validation available: {exc}")
