"""full (zeros, ones), full_like (zeros_like, ones_like) and arange against eager.

Each creation op feeds an output of the delegate directly, so its values and dtype are
compared exactly (integers) or within fp32 rounding (floats)."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op
from tests.ops.movement_data import TORCH_DTYPES, rand

FULL_DTYPES = ["float32", "float16", "int32", "int64", "int8", "uint8", "bool"]


@pytest.mark.parametrize("dtype", FULL_DTYPES)
def test_full_zeros_ones(dtype):
    dt = TORCH_DTYPES[dtype]

    def fn(x):
        # x keeps the partition's input; the creation ops are outputs of their own.
        return (x.clone(), torch.zeros(3, 5, dtype=dt), torch.ones(7, dtype=dt),
                torch.full((2, 1, 3), 3, dtype=dt), torch.full((0, 5), 1, dtype=dt))
    check_op(fn, (rand(3, dtype=dtype),), ops=["aten.full.default"], rtol=0, atol=0)


@pytest.mark.parametrize("value, dtype", [
    (2.5, torch.float32), (-1.75, torch.float16), (1e-5, torch.float16),
    (255, torch.uint8), (-128, torch.int8), (2.9, torch.int32), (-2.9, torch.int64),
    (0.5, torch.bool), (0, torch.bool), (123456, torch.int64),
])
def test_full_value_conversion(value, dtype):
    """The fill value converts to the dtype as torch converts it (2.9 -> 2 and
    -2.9 -> -2 for integers, 0.5 -> True for bool, fp16 rounding)."""
    def fn(x):
        return x.clone(), torch.full((2, 3), value, dtype=dtype)
    check_op(fn, (rand(3),), ops=["aten.full.default"])


@pytest.mark.parametrize("dtype", FULL_DTYPES)
def test_full_like(dtype):
    def fn(x):
        return torch.zeros_like(x), torch.ones_like(x), torch.full_like(x, 7)
    check_op(fn, (rand(3, 5, dtype=dtype),), ops=["aten.full_like.default"], rtol=0,
             atol=0)


def test_full_like_with_dtype_and_resize():
    batch = Dim("batch", min=1, max=7)
    check_op(lambda x: (torch.full_like(x, 2.5), torch.ones_like(x, dtype=torch.int32)),
             (rand(7, 3),), ops=["aten.full_like.default"], dynamic_shapes=({0: batch},),
             resize_inputs=[(rand(2, 3, seed=1),)])


@pytest.mark.parametrize("args, dtype", [
    ((7,), None), ((1, 15, 2), None), ((5, -6, -3), None), ((0, 0), None),
    ((0.0, 3.5, 0.5), None), ((-1.0, 1.0, 0.1), torch.float32), ((0, 37), torch.float16),
    ((3, 10), torch.int32), ((2.0, 9.0), torch.int64), ((10, 2, -1.5), torch.float32),
], ids=lambda v: str(v))
def test_arange(args, dtype):
    def fn(x):
        return x.clone(), torch.arange(*args, dtype=dtype)
    check_op(fn, (rand(3),), ops=["aten.arange.start_step"])


@pytest.mark.parametrize("dtype", FULL_DTYPES)
def test_executorch_zeros_ones(vk_device, dtype):
    """ET-VK blobs keep zeros/ones(_like) (torch.export emits full/full_like)."""
    from tests.ops.et_graphs import run_et_node
    dt = TORCH_DTYPES[dtype]
    like = rand(3, 5, dtype=dtype)
    run_et_node(vk_device, "aten.zeros.default", [[2, 7], None, None, None, None],
                torch.zeros(2, 7, dtype=dt))
    run_et_node(vk_device, "aten.ones.default", [[5], None, None, None, None],
                torch.ones(5, dtype=dt))
    run_et_node(vk_device, "aten.zeros_like.default", [like, None, None, None, None, None],
                torch.zeros_like(like))
    run_et_node(vk_device, "aten.ones_like.default", [like, None, None, None, None, None],
                torch.ones_like(like))


@pytest.mark.parametrize("fn, op, reason", [
    (lambda x: (x.clone(), torch.full((3,), 2**40)), "aten.full.default",
     "fill value 1099511627776 does not fit int32, the device representation of int64"),
    (lambda x: (x.clone(), torch.arange(2**31 - 2, 2**31 + 1)), "aten.arange.start_step",
     "arange bound value 2147483649 does not fit int32, the device representation of "
     "int64"),
], ids=["full", "arange"])
def test_int64_values_beyond_int32_stay_on_cpu(fn, op, reason):
    """int64 tensors are held in int32 on the device: a value that does not fit keeps
    the node on the CPU (with the reason) and the program still matches eager."""
    program = check_op(fn, (rand(3),), ops=["aten.clone.default"])
    cpu = [d for m in program.methods.values() for d in m.report.cpu_nodes if d.op == op]
    assert len(cpu) == 1 and cpu[0].reasons == [reason]
