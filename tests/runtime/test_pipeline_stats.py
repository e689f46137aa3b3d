"""Pipeline statistics (VK_KHR_pipeline_executable_properties, runtime/pipeline_stats.py):
off by default; a clear error where the device captures none; where the driver has the
extension (the H200's NVIDIA driver; not lavapipe), every pipeline of a graph reports its
executables' statistics and the graph still computes the right result."""
import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import pipeline_stats
from vkdelegate.runtime.device import Device


def _add_graph(device, rng):
    a, b = rand(rng, (1000,)), rand(rng, (1000,))
    m = GraphMaker()
    ia, ib = m.input(a.shape), m.input(b.shape)
    m.output(m.op("aten.add.Tensor", [ia, ib, m.scalar(1)], a.shape))
    with m.build(device) as graph:
        got = graph.execute([a, b])[0]
    np.testing.assert_allclose(got, a + b, rtol=1e-6)


def test_statistics_off_by_default_name_the_switch(vk_device, monkeypatch):
    monkeypatch.delenv(pipeline_stats.ENV, raising=False)
    _add_graph(vk_device, np.random.default_rng(0))
    if vk_device.pipeline_statistics:
        pytest.skip(f"{pipeline_stats.ENV} was set when the shared device was created")
    (_, _, pipe), *_ = vk_device.pipelines.items()
    with pytest.raises(VkDelegateError, match=pipeline_stats.ENV):
        pipe.statistics()


def test_statistics_where_the_driver_has_them(vk_device):
    if pipeline_stats.EXTENSION not in vk_device.info.extensions:
        pytest.skip(f"{vk_device.info.name} lacks {pipeline_stats.EXTENSION}")
    device = Device(vk_device.info.index, pipeline_statistics=True)
    try:
        assert device.pipeline_statistics
        _add_graph(device, np.random.default_rng(1))
        items = device.pipelines.items()
        assert items
        for shader, _, pipe in items:
            exes = pipe.statistics()
            assert exes, shader
            assert all(isinstance(e.name, str) and e.statistics for e in exes), exes
    finally:
        device.close()
