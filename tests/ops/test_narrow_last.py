"""vkdelegate.narrow_last (a part of the last dim, made by passes/merge_linears) on
Vulkan against PyTorch eager: bound inside its input's memory with no dispatch where
the part is a contiguous, aligned byte range of an intermediate, else one copy."""
from unittest import mock

import pytest
import torch

from vkdelegate.backend import custom_ops
from vkdelegate.ops.families import movement

from tests.ops.harness import check_op

custom_ops.ensure_defined()
narrow = torch.ops.vkdelegate.narrow_last
OP = "vkdelegate.narrow_last.default"


class _Count:
    """Counts the copies narrow_last records (copy_last_part: one affine copy, its only
    dispatch)."""

    def __init__(self):
        self.copies = 0
        self._real = movement.copy_last_part

    def __call__(self, *args, **kwargs):
        self.copies += 1
        return self._real(*args, **kwargs)


def _parts(x):
    # x * 2: an intermediate (graph inputs and outputs keep memory of their own); the
    # parts feed a view, an add and a mul, as q/k/v feed views and gate/up the SwiGLU.
    # Parts of 32 elements: their offsets (128 or 64 bytes apart) meet lavapipe's
    # 64-byte buffer alignment.
    y = x * 2
    a = narrow(y, 0, 32) + 1
    b = narrow(y, 32, 32).view(*y.shape[:-1], 4, 8) * 3
    c = narrow(y, 64, 32) - 1
    return a, b, c


def test_narrow_last_cpu_kernel():
    x = torch.randn(2, 3, 10)
    got = narrow(x, 3, 4)
    assert got.is_contiguous()
    torch.testing.assert_close(got, x[..., 3:7], rtol=0, atol=0)


# Copies and additions of fp16 numbers: eager's own rounding, exact up to the one
# multiply-add rounding (fp16 ulp of |x| < 8 is below 1e-2).
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float16, 1e-2)])
def test_one_row_parts_alias(dtype, tol):
    torch.manual_seed(0)
    count = _Count()
    with mock.patch.object(movement, "copy_last_part", count):
        check_op(_parts, (torch.randn(1, 1, 96).to(dtype),), ops=[OP], rtol=tol, atol=tol)
    assert count.copies == 0  # every part bound inside y's memory


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float16, 1e-2)])
def test_rows_parts_copy(dtype, tol):
    # Three rows: each part is strided in y, so each is a copy.
    torch.manual_seed(1)
    count = _Count()
    with mock.patch.object(movement, "copy_last_part", count):
        check_op(_parts, (torch.randn(1, 3, 96).to(dtype),), ops=[OP], rtol=tol, atol=tol)
    assert count.copies == 3


def test_unaligned_part_copies():
    # A part starting 1 element (2 bytes) in: no buffer can be bound there, so the
    # runtime gives it memory of its own and the op copies.
    torch.manual_seed(2)
    count = _Count()
    with mock.patch.object(movement, "copy_last_part", count):
        check_op(lambda x: narrow(x * 2, 1, 5) + 1, (torch.randn(1, 1, 9).half(),),
                 ops=[OP], rtol=1e-2, atol=1e-2)
    assert count.copies == 1


def test_part_of_an_input_is_a_copy():
    count = _Count()
    with mock.patch.object(movement, "copy_last_part", count):
        check_op(lambda x: narrow(x, 4, 4), (torch.randn(1, 12),), ops=[OP], rtol=0, atol=0)
    assert count.copies == 1
