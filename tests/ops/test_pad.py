"""constant_pad_nd (asymmetric, negative, fill values) and reflection/replication
padding (exported as arange + index.Tensor) against eager."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.harness import check_op
from tests.ops.movement_data import rand

MOVE_DTYPES = ["float32", "float16", "int32", "int64", "int8", "uint8", "bool"]
PAD = "aten.constant_pad_nd.default"


@pytest.mark.parametrize("shape, pad, value", [
    ((3, 7), (1, 2), 0.0),
    ((3, 7), (1, 2, 3, 0), 2.5),
    ((2, 3, 5, 7), (0, 1, 0, 1), 0.0),            # TF-style SAME: pad after only
    ((2, 3, 5, 7), (1, 2, 2, 1), -1.0),           # asymmetric both ways
    ((2, 3, 5, 7), (-1, 2, 1, -2), 0.0),          # negative pads crop
    ((3, 7), (-3, -4), 0.0),                      # cropped to size 0
    ((2, 3, 1, 5, 1, 7), (1, 1, 0, 2, 1, 0, 0, 0, 2, 1, 1, 1), 3.0),  # rank 6, 6 dims
    ((5,), (2, 3), float("-inf")),
])
def test_constant_pad(shape, pad, value):
    check_op(lambda x: F.pad(x, pad, value=value), (rand(*shape),), ops=[PAD])


def test_efficientnet_same_padding():
    """EfficientNet's TF 'SAME' padding for a stride-2 3x3 conv on an odd input."""
    def same_pad(x):
        ih, iw = x.shape[-2:]
        ph = max((-(-ih // 2) - 1) * 2 + 3 - ih, 0)
        pw = max((-(-iw // 2) - 1) * 2 + 3 - iw, 0)
        return F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
    check_op(same_pad, (rand(1, 3, 29, 37),), ops=[PAD])


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_every_dtype(dtype):
    # 2.7 becomes 2 in an integer tensor and True in a bool tensor, as in eager.
    value = 2.7 if dtype in ("float32", "float16") else 2
    check_op(lambda x: F.pad(x, (1, -1, 2, 0), value=value),
             (rand(3, 5, dtype=dtype),), ops=[PAD], rtol=0, atol=0)


def test_integer_tensor_truncates_a_float_fill():
    check_op(lambda x: F.pad(x, (1, 1), value=-2.7), (rand(3, 5, dtype="int32"),),
             ops=[PAD])


@pytest.mark.parametrize("mode, shape, pad", [
    ("reflect", (2, 3, 7), (2, 3)),
    ("reflect", (2, 3, 5, 7), (1, 2, 3, 1)),
    ("replicate", (2, 3, 7), (3, 1)),
    ("replicate", (2, 3, 5, 7), (2, 0, 1, 3)),
])
def test_reflection_and_replication_pad(mode, shape, pad):
    check_op(lambda x: F.pad(x, pad, mode=mode), (rand(*shape),),
             ops=["aten.index.Tensor"])


def test_resize():
    """The padded (last) dim is dynamic too: the plan follows the new size."""
    batch, width = Dim("batch", min=1, max=5), Dim("width", min=2, max=7)
    check_op(lambda x: F.pad(x, (1, -1, 2, -1), value=1.5), (rand(5, 3, 7),), ops=[PAD],
             dynamic_shapes=({0: batch, 2: width},),
             resize_inputs=[(rand(2, 3, 4, seed=1),), (rand(5, 3, 2, seed=2),)])


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=1, max_size=4),
       data=st.data())
def test_pad_shape_matches_torch(shape, data):
    """Output sizes for any pad list (negative values crop) equal torch's, and sizes
    torch refuses (negative results) raise VkDelegateError."""
    from vkdelegate.ops.families.pad import pad_shape
    from vkdelegate.errors import VkDelegateError
    pad = data.draw(st.lists(st.integers(-4, 4), min_size=0, max_size=2 * len(shape))
                    .filter(lambda p: len(p) % 2 == 0))
    try:
        expected = tuple(F.pad(torch.empty(shape, device="meta"), pad).shape)
    except RuntimeError:
        with pytest.raises(VkDelegateError):
            pad_shape(shape, pad)
        return
    assert pad_shape(shape, pad) == expected
