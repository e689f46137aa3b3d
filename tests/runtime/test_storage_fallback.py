"""Narrow dtypes on a device without 8/16-bit storage: held in 32-bit words, with
stores that round (fp16) or wrap (int8/uint8) exactly like the narrow type."""
import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.runtime import Device


@pytest.fixture(scope="module")
def wide_device(vk_device):
    dev = Device(vk_device.info.name, validation=True, small_storage=False)
    yield dev
    dev.close()


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_wraps_between_nodes(wide_device, dtype):
    # (a + 3 * b) overflows the narrow type; relu must see the wrapped value.
    rng = np.random.default_rng(21)
    a, b = rand(rng, (5, 37), dtype), rand(rng, (37,), dtype)
    m = GraphMaker()
    ia, ib = m.input(a.shape, dtype), m.input(b.shape, dtype)
    add = m.op("aten.add.Tensor", [ia, ib, m.scalar(3)], a.shape, dtype)
    m.output(m.op("aten.relu.default", [add], a.shape, dtype))
    wrapped = (a.astype(np.int64) + 3 * b.astype(np.int64)).astype(dtype)
    with m.build(wide_device) as graph:
        assert graph.resolve(add).device_dtype == "int32"
        np.testing.assert_array_equal(graph.execute([a, b])[0], np.maximum(wrapped, 0))
    assert not wide_device.validation_messages


def test_fp16_rounds_between_nodes(wide_device):
    rng = np.random.default_rng(22)
    x, y = rand(rng, (29, 7), "float16"), rand(rng, (7,), "float16")
    m = GraphMaker()
    ix, iy = m.input(x.shape, "float16"), m.input(y.shape, "float16")
    s = m.op("aten.sub.Tensor", [ix, iy, m.scalar(1.0)], x.shape, "float16")
    m.output(m.op("aten.mm.default", [s, m.constant(rand(rng, (7, 3), "float16"))],
                  (29, 3), "float16"))
    m.output(s)
    with m.build(wide_device) as graph:
        out, diff = graph.execute([x, y])
    # The stored difference is exactly the fp16-rounded value.
    np.testing.assert_array_equal(diff, (x.astype(np.float32) - y).astype(np.float16))
    assert out.dtype == np.float16
    assert not wide_device.validation_messages
