"""Delegates over a device limit: DeviceLimitError at build, CPU fallback with a warning.

The limit checks run before anything is allocated, so the dynamic case (a Dim max
that sizes a tensor at 16 GB) allocates nothing large.
"""
import logging

import pytest
import torch
from torch.export import Dim

from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import program as program_module
from vkdelegate.errors import DeviceLimitError
from tests.vulkan_skip import vulkan_unavailable

pytestmark = pytest.mark.skipif(bool(vulkan_unavailable()),
                                reason=vulkan_unavailable() or "")


class ReluTimesTwo(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def _lower(x, dynamic=None):
    ep = torch.export.export(ReluTimesTwo(), (x,), dynamic_shapes=dynamic)
    return to_backend(ep, VulkanPartitioner({"executor": "vulkan"}))


@pytest.fixture(scope="module")
def big_input():
    # 1x32x1024x1100 float32 = 144179200 bytes, over lavapipe's 128 MiB
    # maxStorageBufferRange (and a typical limit elsewhere is 2**31 - 1 or more).
    return torch.randn(1, 32, 1024, 1100, generator=torch.Generator().manual_seed(0))


def _limit_of(program):
    """The DeviceLimitError building the delegate raises, or None if it fits."""
    from vkdelegate.runtime import load_delegate

    blob = program.methods["forward"].delegates[0]
    try:
        load_delegate(blob.blob, blob.named_data).close()
    except DeviceLimitError as exc:
        return exc
    return None


def test_over_storage_buffer_range_runs_on_cpu_with_a_warning(big_input, caplog):
    program = _lower(big_input)
    assert program.num_delegates() == 1
    error = _limit_of(program)  # the runtime's error is the dedicated subclass
    if error is None or "maxStorageBufferRange" not in str(error):
        pytest.skip("this device's maxStorageBufferRange holds 144 MB")
    with caplog.at_level(logging.WARNING, logger="vkdelegate"):
        out = program(big_input)
    torch.testing.assert_close(out, ReluTimesTwo()(big_input))
    warnings = [r for r in caplog.records if r.name == "vkdelegate"]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "method 'forward', delegate 0" in text
    assert "maxStorageBufferRange" in text and "CPU reference executor" in text
    assert "dynamic dims" not in text
    program(big_input)  # built once: no second warning
    assert len([r for r in caplog.records if r.name == "vkdelegate"]) == 1


def test_dynamic_upper_bound_is_named(caplog):
    # Dim max 10**9 sizes the delegate's tensors for 10**9 x 4 float32 = 16 GB.
    program = _lower(torch.randn(8, 4), dynamic=({0: Dim("n", min=2, max=10**9)},))
    assert _limit_of(program) is not None  # 16 GB is over every device's limits
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.WARNING, logger="vkdelegate"):
        torch.testing.assert_close(program(x), ReluTimesTwo()(x))
    text = " ".join(r.getMessage() for r in caplog.records if r.name == "vkdelegate")
    assert "sized for the upper bound of dynamic dims; export with a smaller Dim max" \
        in text


def test_without_torch_the_error_is_raised(monkeypatch):
    program = _lower(torch.randn(8, 4), dynamic=({0: Dim("n", min=2, max=10**9)},))
    monkeypatch.setattr(program_module, "_torch_or_none", lambda: None)
    with pytest.raises(DeviceLimitError, match=r"method 'forward', delegate 0: .*needs "
                                               r"\d+ bytes.*sized for the upper bound "
                                               r"of dynamic dims"):
        program.build()
