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
from vkdelegate.errors import DeviceLimitError, ResourceLimitError
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


def _over_the_device(limit_of=None) -> int:
    """A Dim max that sizes an n x 4 float32 tensor just past this device's
    maxStorageBufferRange (so the delegate falls back to the CPU) while staying within
    the default load limits; skips where the two cross."""
    from vkdelegate.limits import DEFAULT_LIMITS
    from vkdelegate.runtime.device import default_device

    n = default_device().info.max_storage_buffer_range // 16 + 1
    if n * 16 * 3 > DEFAULT_LIMITS.max_device_bytes or n * 16 > DEFAULT_LIMITS.max_tensor_bytes:
        pytest.skip("this device's maxStorageBufferRange is past the default load limits")
    return n


def test_dynamic_upper_bound_is_named(caplog):
    # The Dim max sizes the delegate's tensors past the device's storage-buffer range.
    n = _over_the_device()
    program = _lower(torch.randn(8, 4), dynamic=({0: Dim("n", min=2, max=n)},))
    assert _limit_of(program) is not None
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.WARNING, logger="vkdelegate"):
        torch.testing.assert_close(program(x), ReluTimesTwo()(x))
    text = " ".join(r.getMessage() for r in caplog.records if r.name == "vkdelegate")
    assert "sized for the upper bound of dynamic dims; export with a smaller Dim max" \
        in text


def test_report_says_which_delegate_fell_back_and_why(tmp_path):
    """program.report said "2 of 2 nodes delegated ... 0 on CPU" after a delegate
    over a device limit fell back to the CPU; now it names the partition and the limit
    (until the program is closed), and the saved file stores no fallback."""
    n = _over_the_device()
    program = _lower(torch.randn(8, 4), dynamic=({0: Dim("n", min=2, max=n)},))
    before = str(program.report)
    # relu and mul: one fused elementwise node
    assert before.startswith("vkdelegate: 1 of 1 nodes delegated to Vulkan in 1 "
                             "partition(s); 0 on CPU")
    program.build()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(program(x), ReluTimesTwo()(x))
    after = str(program.report)
    assert after.startswith("vkdelegate: 0 of 1 nodes on Vulkan in 0 partition(s); 1 on "
                            "CPU, 1 of them in partition(s) 0, delegated but over a "
                            "limit of this device, so run on the CPU reference executor")
    assert "method 'forward', delegate 0: tensor" in after
    assert "maxStorageBufferRange" in after and "Dim max" in after
    assert program.methods["forward"].report.fallbacks.keys() == {0}
    program.save(tmp_path / "p.vkp")
    from vkdelegate import load
    assert str(load(tmp_path / "p.vkp").report) == before
    program.close()
    assert str(program.report) == before


def test_without_torch_the_error_is_raised(monkeypatch):
    n = _over_the_device()
    program = _lower(torch.randn(8, 4), dynamic=({0: Dim("n", min=2, max=n)},))
    monkeypatch.setattr(program_module, "_torch_or_none", lambda: None)
    with pytest.raises(DeviceLimitError, match=r"method 'forward', delegate 0: .*needs "
                                               r"\d+ bytes.*sized for the upper bound "
                                               r"of dynamic dims"):
        program.build()


def test_over_the_load_limits_runs_nowhere(caplog):
    # Dim max 10**9 sizes the tensors at 16 GB, over max_tensor_bytes: the load limits
    # bound what a program may allocate, so there is no CPU fallback either.
    program = _lower(torch.randn(8, 4), dynamic=({0: Dim("n", min=2, max=10**9)},))
    with pytest.raises(ResourceLimitError, match=r"method 'forward', delegate 0: value 0: "
                                                 r"tensor float32 \[1000000000, 4\] in bytes "
                                                 r"is 16,000,000,000, over the load limit "
                                                 r"max_tensor_bytes=.*sized for the upper "
                                                 r"bound of dynamic dims"):
        program(torch.randn(8, 4))
    assert not [r for r in caplog.records if r.name == "vkdelegate"]
