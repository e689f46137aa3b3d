"""index_select, embedding, index.Tensor (1-4 index tensors) and gather against eager:
negative indices, int32 and int64 indices, every data dtype, resizes."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.harness import check_op
from tests.ops.movement_data import rand

MOVE_DTYPES = ["float32", "float16", "int32", "int64", "int8", "uint8", "bool"]


def _idx(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize("shape, dim, index", [
    ((3, 7), 1, _idx(0, 3, 3, 6)),
    ((3, 7), 0, _idx(2, 0)),
    ((2, 3, 5, 7), -2, _idx(4, 0, 1, 1, 2)),
    ((2, 3, 1, 5, 1, 7), 5, _idx(6, 0)),
    ((3, 7), 1, _idx(dtype=torch.int64).reshape(0)),     # empty index
    ((3, 7), 1, _idx(5, 1, dtype=torch.int32)),
])
def test_index_select(shape, dim, index):
    check_op(lambda x, i: x.index_select(dim, i), (rand(*shape), index),
             ops=["aten.index_select.default"])


@pytest.mark.parametrize("indices", [
    _idx(0, 3, 9), _idx(0, 3, 9, 1).reshape(2, 2), _idx(4, 2, dtype=torch.int32),
    _idx(1, 2, 3, 4, 5, 6, 7, 8).reshape(2, 1, 2, 2),
])
def test_embedding(indices):
    check_op(lambda w, i: F.embedding(i, w), (rand(10, 5), indices),
             ops=["aten.embedding.default"])


@pytest.mark.parametrize("fn, index", [
    (lambda x, i: x[i], _idx(0, 4, 4, 1)),
    (lambda x, i: x[:, i], _idx(-1, 0, -7)),               # negative indices wrap
    (lambda x, i: x[:, :, i], _idx(2, 0, 1, 1, 0, 2).reshape(2, 3)),
    (lambda x, i: x[i], _idx(3, 1, dtype=torch.int32)),
], ids=["dim0", "negative", "2d_index", "int32"])
def test_index_tensor(fn, index):
    check_op(fn, (rand(5, 7, 3), index), ops=["aten.index.Tensor"])


@pytest.mark.parametrize("fn, indices", [
    (lambda x, i, j: x[i, j], (_idx(0, 4, -1), _idx(2, -7, 6))),           # same shapes
    (lambda x, i, j: x[i[:, None], j], (_idx(1, 3), _idx(0, 6, 2))),       # outer product
    (lambda x, i, j: x[:, i, j], (_idx(0, 1, 2, 0).reshape(2, 2), _idx(1))),
    (lambda x, i, j, k: x[i, j, k], (_idx(4, 0), _idx(0, 6), _idx(-1, 1))),
], ids=["same_shape", "broadcast_outer", "leading_slice", "three"])
def test_index_tensor_with_several_index_tensors(fn, indices):
    check_op(fn, (rand(5, 7, 3), *indices), ops=["aten.index.Tensor"])


def test_index_tensor_padding_mask_pattern_with_resize():
    """HF's sdpa padding mask: mask[batch_idx[:, None, None, None], kv_idx[None, None,
    None, :]], with dynamic batch and length; int32 indices; bool data."""
    def fn(mask):
        n, length = mask.shape
        b = torch.arange(n)[:, None, None, None]
        kv = torch.arange(length)[None, None, None, :]
        return mask.bool()[b, kv]
    n, length = Dim("n", min=1, max=6), Dim("length", min=2, max=40)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    check_op(fn, (mask,), ops=["aten.index.Tensor"], dynamic_shapes=({0: n, 1: length},),
             resize_inputs=[(torch.randint(0, 2, (6, 33)),), (torch.ones(1, 2, dtype=torch.int64),)])


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_index_tensor_several_indices_every_dtype(dtype):
    check_op(lambda x, i, j: x[i[:, None], j],
             (rand(5, 7, dtype=dtype), _idx(4, 0, dtype=torch.int32),
              _idx(6, 0, 1, dtype=torch.int32)),
             ops=["aten.index.Tensor"], rtol=0, atol=0)


def test_index_tensor_several_indices_out_of_range_raises():
    from vkdelegate import VulkanPartitioner, to_backend
    from vkdelegate.errors import VkDelegateError

    class TwoIndices(torch.nn.Module):
        def forward(self, x, i, j):
            return x[i, j]
    x, i, j = rand(5, 7), _idx(0, 1), _idx(2, 3)
    program = to_backend(torch.export.export(TwoIndices(), (x, i, j)), VulkanPartitioner())
    assert not program.methods["forward"].report.cpu_nodes
    torch.testing.assert_close(program(x, i, j), x[i, j])
    with pytest.raises(VkDelegateError, match="out of range for dims 0..1"):
        program(x, i, _idx(2, 7))


def test_index_tensor_on_separated_dims_stays_on_cpu():
    from vkdelegate import VulkanPartitioner

    class Separated(torch.nn.Module):
        def forward(self, x, i, j):
            return x[i, :, j]
    ep = torch.export.export(Separated(), (rand(5, 7, 3), _idx(0, 1), _idx(2, 0)))
    report = VulkanPartitioner().report(ep.run_decompositions())
    reasons = [d.reasons for d in report.cpu_nodes if d.op == "aten.index.Tensor"]
    assert reasons == [["index.Tensor with index tensors on dims [0, 2], which are not "
                        "consecutive"]]


@pytest.mark.parametrize("shape, dim, index_shape", [
    ((3, 7), 1, (3, 4)),
    ((3, 7), 0, (5, 7)),
    ((3, 5, 7), -1, (2, 5, 3)),                 # index smaller than the input elsewhere
    ((2, 3, 1, 5, 1, 7), 3, (2, 3, 1, 4, 1, 7)),
])
def test_gather(shape, dim, index_shape):
    size = shape[dim]
    index = torch.randint(-size, size, index_shape, generator=torch.Generator().manual_seed(3))
    index = index.remainder(size)   # gather takes no negative indices
    check_op(lambda x, i: x.gather(dim, i), (rand(*shape), index),
             ops=["aten.gather.default"])


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_every_dtype(dtype):
    def fn(x, i, g):
        return (x.index_select(1, i), F.embedding(i, x), x[:, i], x.gather(1, g))
    ops = ["aten.index_select.default", "aten.embedding.default", "aten.index.Tensor",
           "aten.gather.default"]
    check_op(fn, (rand(5, 7, dtype=dtype), _idx(4, 0, 2), _idx(6, 0, 1, 1, 5).reshape(5, 1)),
             ops=ops, rtol=0, atol=0)


def test_int32_indices():
    def fn(x, i):
        return x.index_select(0, i), F.embedding(i, x), x[i]
    check_op(fn, (rand(5, 7), _idx(4, 0, 3, dtype=torch.int32)),
             ops=["aten.index_select.default", "aten.embedding.default",
                  "aten.index.Tensor"])


def test_resize():
    """Dynamic number of indices and dynamic data rows."""
    n, rows = Dim("n", min=1, max=6), Dim("rows", min=2, max=9)

    def fn(x, i, g):
        return x.index_select(1, i), F.embedding(i, x), x[:, i], x.gather(0, g)
    gi = _idx(1, 0, 1, 0, 1, 1).reshape(2, 3)
    check_op(fn, (rand(9, 3), _idx(2, 0, 1, 1, 0, 2), gi), ops=[
        "aten.index_select.default", "aten.embedding.default", "aten.index.Tensor",
        "aten.gather.default"],
        dynamic_shapes=({0: rows}, {0: n}, None),
        resize_inputs=[(rand(4, 3, seed=1), _idx(1, 2), gi)])


def test_zero_dim_inputs():
    """0-d data (one row) with index_select, and a 0-d index with gather."""
    x = torch.tensor(2.5)
    check_op(lambda x, i, j: (x.index_select(0, i), x.gather(0, j)),
             (x, _idx(0), torch.tensor(0)),
             ops=["aten.index_select.default", "aten.gather.default"])


# ---- out-of-range indices: eager raises, so must we (the shader's error flag) ----------
_RANGE_CASES = {
    # op: (fn, data, good index, index too large, index too negative)
    "aten.index_select.default": (lambda x, i: x.index_select(0, i), rand(3, 7),
                                  _idx(2, 0, 1), _idx(3, 0, 1), _idx(-1, 0, 1)),
    "aten.embedding.default": (lambda w, i: F.embedding(i, w), rand(10, 5),
                               _idx(9, 0, 4), _idx(10, 0, 4), _idx(-1, 0, 4)),
    "aten.index.Tensor": (lambda x, i: x[i], rand(3, 7),            # -3..2 allowed
                          _idx(2, -3, -1), _idx(3, 0, 1), _idx(-4, 0, 1)),
    "aten.gather.default": (lambda x, i: x.gather(1, i), rand(3, 7),
                            _idx(6, 0, 3).reshape(3, 1), _idx(7, 0, 3).reshape(3, 1),
                            _idx(-1, 0, 3).reshape(3, 1)),
}


@pytest.mark.parametrize("op", list(_RANGE_CASES))
def test_out_of_range_index_raises(op):
    """Each bad index raises VkDelegateError naming the node's op (eager raises too);
    the same lowered program then still gives eager's values for good indices, so the
    error flag was reset."""
    from vkdelegate.errors import VkDelegateError

    fn, data, good, *bad = _RANGE_CASES[op]
    lowered = check_op(fn, (data, good), ops=[op])
    for index in bad:
        with pytest.raises((IndexError, RuntimeError)):
            fn(data, index)
        with pytest.raises(VkDelegateError, match=rf"node \d+ \({op}\): an index is out "
                                                  rf"of range for dim \d+ of size"):
            lowered(data, index)
        torch.testing.assert_close(lowered(data, good), fn(data, good), rtol=0, atol=0)


def test_out_of_range_names_the_failing_node():
    """With two checked nodes in one graph, the error names the one whose index was
    bad and the size of its indexed dim (7, not the index_select's 3)."""
    from vkdelegate.errors import VkDelegateError

    def fn(x, i, g):
        return x.index_select(0, i), x.gather(1, g)
    x, i, g = rand(3, 7), _idx(2, 0), _idx(1, 6, 0).reshape(3, 1)
    lowered = check_op(fn, (x, i, g), ops=["aten.index_select.default",
                                          "aten.gather.default"])
    with pytest.raises(VkDelegateError, match=r"\(aten.gather.default\): an index is out "
                                              r"of range for dim 1 of size 7 \(valid "
                                              r"indices: 0\.\.6\)"):
        lowered(x, i, _idx(1, 9, 0).reshape(3, 1))
    with pytest.raises(VkDelegateError, match=r"\(aten.index_select.default\).* size 3"):
        lowered(x, _idx(0, 3), g)


@pytest.mark.parametrize("staging, profile", [(True, False), (False, True)])
def test_out_of_range_staged_and_profiled(staging, profile):
    """The flag is read right after the fence wait with staged inputs/outputs (the
    discrete-GPU path) and with the profiling command buffer too."""
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    def fn(x, i):
        return x[:, i]
    x, good = rand(3, 7), _idx(6, -7, 2)
    lowered = check_op(fn, (x, good), ops=["aten.index.Tensor"])
    (delegate,) = lowered.methods["forward"].delegates
    with load_delegate(delegate.blob, staging=staging) as graph:
        if profile and graph.device.timestamp_bits == 0:
            pytest.skip("no timestamp queries on this device")
        with pytest.raises(VkDelegateError, match=r"index.Tensor\): an index is out of "
                                                  r"range for dim 1 of size 7"):
            graph.execute([x.numpy(), _idx(7, 0, 0).numpy()], profile=profile)
        (got,) = graph.execute([x.numpy(), good.numpy()], profile=profile)
        torch.testing.assert_close(torch.from_numpy(got), fn(x, good), rtol=0, atol=0)
