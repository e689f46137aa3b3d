"""LoweredProgram lifetime: an unclosed program frees its Vulkan objects when dropped,
and close() from another thread waits for a call in flight."""
import threading

import pytest
import torch
from torch import nn

from tests.slow_fence import slow_fence_wait
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend

_WHY = vulkan_unavailable()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def _program():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 8), nn.ReLU()).eval()
    x = torch.randn(4, 16)
    ep = torch.export.export(module, (x,))
    return module, to_backend(ep, VulkanPartitioner({"executor": "vulkan"})), x


def _graph_resources(program):
    (delegate,) = program.runner("forward").delegates
    return delegate.loaded._res


def test_dropped_program_releases_its_graphs():
    module, program, x = _program()
    torch.testing.assert_close(program(x), module(x), rtol=1e-5, atol=1e-5)
    res = _graph_resources(program)
    assert not res.released
    del program  # no close(), no gc.collect(): nothing keeps it alive
    assert res.released and res.fence is None
    assert res not in res.device._graphs


def test_close_from_another_thread_waits_for_the_call(monkeypatch):
    module, program, x = _program()
    program.build()
    in_wait = slow_fence_wait(monkeypatch)
    result = {}

    def call():
        try:
            result["out"] = program(x)
        except Exception as exc:  # reported below
            result["error"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    assert in_wait.wait(10)
    res = _graph_resources(program)
    program.close()
    worker.join(10)
    assert "error" not in result, result.get("error")
    torch.testing.assert_close(result["out"], module(x), rtol=1e-5, atol=1e-5)
    assert res.released
    monkeypatch.undo()
    # A program is rebuilt by its next call after close().
    torch.testing.assert_close(program(x), module(x), rtol=1e-5, atol=1e-5)
    program.close()
