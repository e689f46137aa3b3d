"""clone and _to_copy (dtype conversions) against eager.

Conversions follow torch: float -> integer truncates toward zero, anything -> bool is
x != 0, bool -> number is 0/1, fp32 -> fp16 rounds to nearest even. Input values stay
inside the target's range (out-of-range float -> integer casts are undefined in C++ and
differ between torch's CPU kernels).
"""
import numpy as np
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op
from tests.ops.movement_data import TORCH_DTYPES, rand
from vkdelegate.kernels.affine_copy import MOVE_DTYPES

CONVERT_DTYPES = ["float32", "float16", "float64", "int32", "int64", "int8", "uint8",
                  "bool"]
TO_COPY = "aten._to_copy.default"


def _source(dtype: str, target: str) -> torch.Tensor:
    """Values of ``dtype`` that fit ``target``, with fractions, negatives and zeros."""
    gen = torch.Generator().manual_seed(len(dtype) * 31 + len(target))
    x = torch.randn(3, 5, 7, generator=gen) * 40
    x[0, 0, :3] = torch.tensor([0.0, -0.0, 0.5])
    if target == "uint8" or dtype == "uint8":
        x = x.abs()
    if target == "int8" or dtype == "int8":
        x = x.clamp(-120, 120)
    if dtype == "bool":
        return x > 0
    if not TORCH_DTYPES[dtype].is_floating_point:
        x = x.round()
    return x.to(TORCH_DTYPES[dtype])


@pytest.mark.parametrize("source", CONVERT_DTYPES)
def test_to_copy(source):
    """One program converts ``source`` to every other dtype (but int32 / int64 to
    float64 and float64 to an integer or bool, which stay on the CPU:
    tests/ops/test_int64_range.py)."""
    targets = [t for t in CONVERT_DTYPES if t != source
               and not (t == "float64" and source in ("int32", "int64"))
               and not (source == "float64" and t not in ("float32", "float16"))]

    def fn(*xs):
        return tuple(x.to(TORCH_DTYPES[t]) for x, t in zip(xs, targets))
    # fp16 holds 11 significant bits: values near 40 round by up to 2^-6 (rtol 1e-3 is
    # more than enough); float64 results are computed in fp32 (rtol 1e-6).
    check_op(fn, tuple(_source(source, t) for t in targets), ops=[TO_COPY],
             rtol=1e-3 if source == "float16" or "float16" in targets else 1e-6, atol=0)


def test_float_to_int_truncates_toward_zero():
    x = torch.tensor([-2.9, -2.5, -0.7, 0.0, 0.7, 2.5, 2.9, 100.99, -100.99])
    check_op(lambda x: (x.int(), x.to(torch.int8), x.long()), (x,), ops=[TO_COPY])


def test_fp16_rounding_is_exact():
    """fp32 -> fp16 must round to nearest even, bit for bit as torch."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(5)) * 1000
    check_op(lambda x: x.half(), (x,), ops=[TO_COPY], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64", "int8", "uint8",
                                   "bool"])
def test_clone(dtype):
    check_op(_Clone(), (rand(2, 3, 1, 5, 1, 7, dtype=dtype),), ops=["aten.clone.default"],
             rtol=0, atol=0)


class _Clone(torch.nn.Module):
    def forward(self, x):
        return x.clone()


def test_resize():
    batch = Dim("batch", min=1, max=11)
    check_op(lambda x: (x.half(), x.int(), x.clone()), (rand(11, 5) * 10,),
             ops=[TO_COPY, "aten.clone.default"], dynamic_shapes=({0: batch},),
             resize_inputs=[(rand(3, 5, seed=1) * 10,)], rtol=1e-3)


@pytest.mark.parametrize("source", CONVERT_DTYPES)
def test_executorch_to_dim_order_copy(vk_device, source):
    """ET-VK's _to_dim_order_copy converts like _to_copy; a dim_order (channels last
    here) changes strides, never values."""
    from tests.ops.et_graphs import run_et_node
    for target in CONVERT_DTYPES:
        x = _source(source, target)
        dim_order = [0, 2, 1] if target == source else None
        # fp16 and fp64 results: see test_to_copy for the tolerance
        run_et_node(vk_device, "dim_order_ops._to_dim_order_copy.default",
                    [x, None, None, None, None, False, dim_order],
                    x.to(TORCH_DTYPES[target]),
                    rtol=1e-3 if "float16" in (source, target) else 1e-6)


@pytest.mark.parametrize("dtype", sorted(MOVE_DTYPES))
def test_executorch_prepack(vk_device, dtype):
    """ET-VK's et_vk.prepack copies a constant into the tensor its consumer reads."""
    from tests.ops.et_graphs import run_et_node
    x = _source(dtype, dtype)
    run_et_node(vk_device, "et_vk.prepack.default", [x], x.clone())


@pytest.mark.parametrize("dtype", sorted(MOVE_DTYPES))
def test_executorch_alias_and_clone_dim_order(vk_device, dtype):
    """ET-VK's alias_copy(self) and _clone_dim_order(self, non_blocking, dim_order) are
    copies (a dim_order changes strides, never values)."""
    from tests.ops.et_graphs import run_et_node
    x = _source(dtype, dtype)
    run_et_node(vk_device, "aten.alias_copy.default", [x], x.clone())
    run_et_node(vk_device, "dim_order_ops._clone_dim_order.default",
                [x, False, list(range(x.dim()))[::-1]], x.clone())


@pytest.fixture(scope="module")
def wide_device(vk_device):
    """The test device with 8/16-bit storage turned off: narrow dtypes in 32-bit words."""
    from vkdelegate.runtime import Device
    dev = Device(vk_device.info.name, validation=True, small_storage=False)
    yield dev
    dev.close()


@pytest.mark.parametrize("source, target", [
    ("int32", "int8"), ("int32", "uint8"), ("float32", "float16"), ("float32", "bool"),
    ("int32", "bool"),
])
def test_narrow_dtypes_between_nodes_without_small_storage(wide_device, source, target):
    """On a device without 8/16-bit storage a narrow tensor lives in a 32-bit word: the
    conversion must store it rounded (fp16) or wrapped (int8/uint8) so that the next
    node reads what eager holds. Each output converts back to the wide dtype, which
    shows the stored narrow values exactly: the conversion itself, then a pad (fill
    value) and an index_select reading it."""
    from tests.runtime.graphs import GraphMaker
    gen = torch.Generator().manual_seed(9)
    if source == "int32":
        x = torch.randint(-1000, 1000, (5, 7), generator=gen, dtype=torch.int32)
    else:
        x = torch.randn(5, 7, generator=gen) * 100
    index = torch.tensor([4, 0, 2, 2])
    narrow = x.to(TORCH_DTYPES[target])
    padded = torch.nn.functional.pad(narrow, (1, 2), value=1)
    expected = [narrow.to(x.dtype), padded.to(x.dtype),
                padded.index_select(0, index).to(x.dtype)]

    m = GraphMaker()
    nones = [m.scalar(None)] * 4 + [m.scalar(False), m.scalar(None)]
    ix, ii = m.input(x.shape, source), m.input(index.shape, "int64")
    a = m.op(TO_COPY, [ix] + nones, x.shape, target)
    p = m.op("aten.constant_pad_nd.default", [a, m.scalar([1, 2]), m.scalar(1)], (5, 10),
             target)
    s = m.op("aten.index_select.default", [p, m.scalar(0), ii], (4, 10), target)
    for t, shape in ((a, x.shape), (p, (5, 10)), (s, (4, 10))):
        m.output(m.op(TO_COPY, [t] + nones, shape, source))
    with m.build(wide_device) as graph:
        assert graph.resolve(a).device_dtype in ("int32", "float32")
        got = graph.execute([x.numpy(), index.numpy()])
    for out, ref in zip(got, expected):
        np.testing.assert_array_equal(out, ref.numpy())
    assert not wide_device.validation_messages


def test_fp16_rounding_in_32bit_words_at_the_edges(wide_device):
    """fp32 -> fp16 stored in a 32-bit word (no 16-bit storage): every rounding case of
    IEEE round-to-nearest-even against torch's .half(): ties both ways, the largest
    finite value and the overflow threshold 65520, fp16 subnormals and the underflow
    threshold 2^-25, signed zeros, infinities, NaN, and random values of every binade."""
    from tests.runtime.graphs import GraphMaker
    ulp = 2.0 ** -10
    edges = [0.0, -0.0, 1.0, 1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2 ** -20,
             65504.0, 65519.99, 65520.0, -65520.0, 1e6, 2.0 ** -14, 2.0 ** -24,
             2.0 ** -25, 2.0 ** -25 + 2.0 ** -40, 3 * 2.0 ** -25, 2.0 ** -26, -2.0 ** -24,
             6.1e-5, float("inf"), float("-inf"), float("nan")]
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(2000, generator=gen) * torch.exp2(
        torch.randint(-30, 17, (2000,), generator=gen).float())
    x = torch.cat([torch.tensor(edges), wide])
    m = GraphMaker()
    nones = [m.scalar(None)] * 4 + [m.scalar(False), m.scalar(None)]
    ix = m.input(x.shape, "float32")
    narrow = m.op(TO_COPY, [ix] + nones, x.shape, "float16")
    m.output(m.op(TO_COPY, [narrow] + nones, x.shape, "float32"))
    with m.build(wide_device) as graph:
        assert graph.resolve(narrow).device_dtype == "float32"
        got = graph.execute([x.numpy()])[0]
    expected = x.half().float().numpy()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
    assert not wide_device.validation_messages
