"""This file's op families on a device without 8/16-bit storage (bool, int8 and fp16
held in 32-bit words): bool results, bool conditions, int8 wrapping, fp16 rounding and
int64 indices must be the same as with narrow storage. Torch-free: hand-built graph,
numpy reference."""
import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.runtime import Device


@pytest.fixture(scope="module")
def wide_device(vk_device):
    dev = Device(vk_device.info.name, validation=True, small_storage=False)
    yield dev
    dev.close()


def test_elementwise_and_reductions_on_wide_storage(wide_device):
    rng = np.random.default_rng(5)
    x, y = rand(rng, (5, 7), "float16"), rand(rng, (7,), "float16")
    a, b = rand(rng, (5, 7), "int8"), rand(rng, (5, 7), "int8")
    m = GraphMaker()
    ix, iy, ia, ib = (m.input(v.shape, v.dtype.name) for v in (x, y, a, b))
    gt = m.op("aten.gt.Tensor", [ix, iy], (5, 7), "bool")
    nt = m.op("aten.logical_not.default", [gt], (5, 7), "bool")
    w = m.op("aten.where.self", [nt, ix, iy], (5, 7), "float16")
    s = m.op("aten.add.Tensor", [ia, ib, m.scalar(3)], (5, 7), "int8")
    anyv = m.op("aten.any.dim", [gt, m.scalar(1), m.scalar(False)], (5,), "bool")
    mul = m.op("aten.mul.Tensor", [ix, m.scalar(0.1)], (5, 7), "float16")
    am = m.op("aten.argmax.default", [mul, m.scalar(1), m.scalar(False)], (5,), "int64")
    sm = m.op("aten._softmax.default", [mul, m.scalar(-1), m.scalar(False)], (5, 7),
              "float16")
    for v in (s, anyv, mul, am, nt, sm, w):
        m.output(v)

    gt_ref = x > y
    s_ref = (a.astype(np.int64) + 3 * b.astype(np.int64)).astype(np.int8)  # wraps
    mul_ref = (x.astype(np.float32) * np.float32(0.1)).astype(np.float16)
    e = np.exp(mul_ref.astype(np.float32) - mul_ref.astype(np.float32).max(1, keepdims=True))
    sm_ref = e / e.sum(1, keepdims=True)
    with m.build(wide_device) as graph:
        assert graph.resolve(gt).device_dtype == "int32"
        assert graph.resolve(mul).device_dtype == "float32"
        got = graph.execute([x, y, a, b])
    np.testing.assert_array_equal(got[0], s_ref)
    np.testing.assert_array_equal(got[1], gt_ref.any(1))
    np.testing.assert_array_equal(got[2], mul_ref)  # rounded to fp16 exactly
    np.testing.assert_array_equal(got[3], mul_ref.argmax(1))
    assert got[3].dtype == np.int64
    np.testing.assert_array_equal(got[4], ~gt_ref)
    # fp16 softmax: fp32 math, one rounding to fp16 (ulp 2**-11 near 0.5).
    np.testing.assert_allclose(got[5].astype(np.float32), sm_ref, rtol=2e-3, atol=1e-3)
    np.testing.assert_array_equal(got[6], np.where(~gt_ref, x, np.broadcast_to(y, x.shape)))
    assert not wide_device.validation_messages
