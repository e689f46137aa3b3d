"""DelegateGraph lifetime: a finalizer for unclosed graphs, close() against calls in
flight in other threads, Device.close() with graphs still open."""
import os
import threading
import time
import weakref

import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from tests.slow_fence import slow_fence_wait
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import Device
from tests.vulkan_skip import requires_vulkan


def _relu_graph(device, shape=(8, 33)):
    m = GraphMaker()
    ix = m.input(shape)
    m.output(m.op("aten.relu.default", [ix], shape))
    return m.build(device)


def _own_device():
    return Device(validation=os.environ.get("VKDELEGATE_VALIDATION") == "1")


def test_dropped_graph_is_released_without_gc(vk_device):
    graph = _relu_graph(vk_device)
    res = graph._res
    ref = weakref.ref(graph)
    assert res in vk_device._graphs and res.fence is not None
    del graph  # no close(): the finalizer frees it, and no cycle keeps it alive
    assert ref() is None
    assert res.released and res.fence is None and res.cmd is None
    assert res not in vk_device._graphs
    assert res.allocator.allocated_bytes == 0


def test_close_is_idempotent_and_calls_after_it_raise(vk_device):
    graph = _relu_graph(vk_device)
    x = rand(np.random.default_rng(1), (8, 33))
    np.testing.assert_array_equal(graph.execute([x])[0], np.maximum(x, 0))
    graph.close()
    graph.close()
    with pytest.raises(VkDelegateError, match="closed"):
        graph.execute([x])
    with pytest.raises(VkDelegateError, match="closed"):
        graph.bind_state(0, 0, x)


def test_close_waits_for_a_call_in_flight(vk_device, monkeypatch):
    # The call in flight is held inside its fence wait until close() has been
    # called from the main thread: close must wait for it, not destroy its fence.
    in_wait = slow_fence_wait(monkeypatch)
    graph = _relu_graph(vk_device)
    x = rand(np.random.default_rng(2), (8, 33))
    result = {}

    def call():
        try:
            result["out"] = graph.execute([x])[0]
        except Exception as exc:  # reported below, not lost in the thread
            result["error"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    assert in_wait.wait(10)
    start = time.perf_counter()
    graph.close()
    waited = time.perf_counter() - start
    worker.join(10)
    assert "error" not in result, result.get("error")
    np.testing.assert_array_equal(result["out"], np.maximum(x, 0))
    assert waited > 0.1  # close blocked until the call had read its outputs
    assert graph._res.released
    with pytest.raises(VkDelegateError, match="closed"):
        graph.execute([x])


def test_close_against_many_threads_calling(vk_device):
    graph = _relu_graph(vk_device, (64, 257))
    x = rand(np.random.default_rng(3), (64, 257))
    want = np.maximum(x, 0)
    outcomes, started = [], threading.Barrier(5)

    def loop():
        started.wait()
        while True:
            try:
                np.testing.assert_array_equal(graph.execute([x])[0], want)
                outcomes.append("ok")
            except VkDelegateError as exc:
                outcomes.append(str(exc))
                return

    workers = [threading.Thread(target=loop) for _ in range(4)]
    for w in workers:
        w.start()
    started.wait()
    time.sleep(0.05)
    graph.close()
    for w in workers:
        w.join(10)
    assert not any(w.is_alive() for w in workers)
    errors = [o for o in outcomes if o != "ok"]
    assert len(errors) == 4 and all("closed" in e for e in errors), errors


@requires_vulkan
def test_device_close_closes_open_graphs_and_later_finalizers_do_nothing():
    device = _own_device()
    try:
        kept, dropped = _relu_graph(device), _relu_graph(device)
        dropped_res = dropped._res
        x = rand(np.random.default_rng(4), (8, 33))
        kept.execute([x])
    finally:
        device.close()
    assert device.closed and not device._graphs
    assert kept._res.released and dropped_res.released
    with pytest.raises(VkDelegateError, match="closed"):
        kept.execute([x])
    kept.close()  # the device is gone: nothing to free, no Vulkan call
    del kept, dropped  # their finalizers run after the device is gone: no-ops
