"""cat (and stack) and split_with_sizes (split, chunk) against eager."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import check_op, delegated_nodes
from tests.ops.movement_data import rand

MOVE_DTYPES = ["float32", "float16", "int32", "int64", "int8", "uint8", "bool"]
CAT = "aten.cat.default"
SPLIT = "aten.split_with_sizes.default"


@pytest.mark.parametrize("shapes, dim", [
    (((3, 7), (3, 2)), 1),
    (((3, 7), (5, 7), (1, 7)), 0),
    (((2, 3, 5), (2, 1, 5), (2, 0, 5)), -2),     # a size-0 part
    (((11,), (3,)), 0),
    (((2, 3, 1, 5, 1, 7), (2, 3, 1, 5, 1, 2)), 5),
    (((2, 3, 1, 5, 1, 7), (2, 3, 4, 5, 1, 7)), 2),
    (((3, 5), (0,)), 0),                          # ATen skips 1-D empty tensors
])
def test_cat(shapes, dim):
    inputs = tuple(rand(*s, seed=i) for i, s in enumerate(shapes))
    check_op(lambda *xs: torch.cat(xs, dim), inputs, ops=[CAT])


def test_cat_same_tensor_twice_and_stack():
    check_op(lambda x, y: (torch.cat([x, y, x], 1), torch.stack([x, y], -1)),
             (rand(3, 5), rand(3, 5, seed=1)), ops=[CAT])


@pytest.mark.parametrize("shape, fn", [
    ((3, 7), lambda x: x.split(2, 1)),
    ((3, 7), lambda x: x.split([2, 0, 5], 1)),
    ((11, 2), lambda x: x.split([5, 6])),
    ((3, 7), lambda x: x.chunk(3, -1)),
    ((2, 3, 1, 5, 1, 7), lambda x: x.split([1, 4], 3)),
], ids=["split2", "sizes_with_zero", "dim0", "chunk", "rank6"])
def test_split(shape, fn):
    # torch 2.13 exports x.split(2, 1) as split_with_sizes, older versions as split.Tensor
    program = check_op(fn, (rand(*shape),), ops=[])
    assert {name for name, _ in delegated_nodes(program)} & {SPLIT, "aten.split.Tensor"}


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_every_dtype(dtype):
    def fn(x, y):
        a, b = torch.cat([x, y], 1).split([4, 5], 1)
        return b, a
    check_op(fn, (rand(3, 7, dtype=dtype), rand(3, 2, dtype=dtype, seed=1)),
             ops=[CAT, SPLIT], rtol=0, atol=0)


def test_resize():
    """Batch is dynamic; cat and split act on the static dim."""
    def fn(x, y):
        a, b, c = torch.cat([x, y], -1).split([1, 3, 4], -1)
        return c, a, torch.cat([x, x], 0)
    batch = Dim("batch", min=1, max=9)
    check_op(fn, (rand(9, 5), rand(9, 3, seed=1)), ops=[CAT, SPLIT],
             dynamic_shapes=({0: batch}, {0: batch}),
             resize_inputs=[(rand(2, 5, seed=2), rand(2, 3, seed=3))])


def test_split_along_a_dynamic_dim_stays_on_cpu():
    from vkdelegate import VulkanPartitioner
    ep = torch.export.export(_Halves(), (rand(8, 3),),
                             dynamic_shapes=({0: Dim("b", min=2, max=16) * 2},))
    report = VulkanPartitioner().report(ep.run_decompositions())
    splits = [d for d in report.cpu_nodes if d.op == SPLIT]
    # the split sizes are SymInts (x.shape[0] // 2), which split reads only at load
    assert splits and "argument 1 is a symbolic size, which this op reads only at " \
        "load" in splits[0].reasons


class _Halves(torch.nn.Module):
    def forward(self, x):
        return x.chunk(2)


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_executorch_split_tensor(vk_device, dtype):
    """ET-VK blobs keep split.Tensor (equal pieces, the last smaller)."""
    from tests.ops.et_graphs import run_et_node
    x = rand(3, 11, dtype=dtype)
    run_et_node(vk_device, "aten.split.Tensor", [x, 4, 1], list(x.split(4, 1)))
    run_et_node(vk_device, "aten.split.Tensor", [x, 2, -2], list(x.split(2, -2)))
