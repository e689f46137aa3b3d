"""KV-cache update ops on Vulkan against PyTorch eager: index_copy, index_put
(accumulate=False), slice_scatter, select_scatter, copy, vkdelegate.slice_scatter_at
and ExecuTorch's llama.update_cache, functional and on a registered cache buffer
updated in place (run twice: the second call must see the first call's write)."""
import pytest
import torch
from torch import nn

from vkdelegate import to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.errors import VkDelegateError

from tests.ops.harness import check_op, delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from tests.torch_version import needs_torch_213

custom_ops.ensure_defined()
MOVE = [torch.float32, torch.float16, torch.int32, torch.int64, torch.int8, torch.uint8,
        torch.bool]


def _data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 4
    return x > 0 if dtype == torch.bool else x.to(dtype)


@pytest.mark.parametrize("dtype", MOVE)
def test_index_copy(dtype):
    x, src = _data((2, 3, 6, 4), dtype, 1), _data((2, 3, 2, 4), dtype, 2)
    check_op(lambda x, i, s: x.index_copy(2, i, s), (x, torch.tensor([4, 1]), src),
             ops=["aten.index_copy.default"])


@pytest.mark.parametrize("dtype", MOVE)
def test_index_put_one_index_tensor(dtype):
    x, v = _data((2, 3, 6, 4), dtype, 3), _data((2, 3, 2, 4), dtype, 4)
    index = torch.tensor([-1, 2])  # index_put wraps negative indices
    check_op(lambda x, i, v: torch.ops.aten.index_put(x, [None, None, i], v), (x, index, v),
             ops=["aten.index_put.default"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_index_put_broadcast_scalar_value(dtype):
    x = _data((3, 5), dtype, 5)
    check_op(lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v),
             (x, torch.tensor([0, 3]), torch.tensor(7).to(dtype)),
             ops=["aten.index_put.default"])


@pytest.mark.parametrize("dtype", MOVE)
def test_slice_scatter_and_select_scatter(dtype):
    x, src, row = _data((2, 8, 3), dtype, 6), _data((2, 3, 3), dtype, 7), _data((2, 3), dtype, 8)
    check_op(lambda x, s: torch.slice_scatter(x, s, 1, 2, 8, 2), (x, src),
             ops=["aten.slice_scatter.default"])
    check_op(lambda x, r: torch.select_scatter(x, r, 1, -3), (x, row),
             ops=["aten.select_scatter.default"])


@pytest.mark.parametrize("dtype", MOVE)
def test_copy_broadcasts_into_self(dtype):
    x, src = _data((2, 3, 4), dtype, 9), _data((3, 1), dtype, 10)
    check_op(lambda x, s: torch.ops.aten.copy(x, s), (x, src), ops=["aten.copy.default"])


@pytest.mark.parametrize("dtype", MOVE)
def test_slice_scatter_at_reads_the_position_tensor(dtype):
    x, src = _data((1, 2, 8, 4), dtype, 11), _data((1, 2, 3, 4), dtype, 12)
    op = torch.ops.vkdelegate.slice_scatter_at
    check_op(lambda x, s, p: op(x, s, 2, p), (x, src, torch.tensor([5])),
             ops=["vkdelegate.slice_scatter_at.default"])


class Cache(nn.Module):
    """A [1, H, S, D] cache buffer written at the positions ``pos`` in place (``kind``:
    the write as a model writes it), returned with a value computed from it."""

    def __init__(self, kind: str, dtype):
        super().__init__()
        self.kind = kind
        shape = (1, 8, 2, 4) if kind == "update_cache" else (1, 2, 8, 4)
        self.register_buffer("cache", torch.zeros(shape, dtype=dtype))

    def forward(self, k, pos):
        if self.kind == "index_copy":
            self.cache.index_copy_(2, pos, k)
        elif self.kind == "index_put":
            self.cache[:, :, pos] = k
        elif self.kind == "slice_item":
            p = pos[0].item()
            self.cache[:, :, p:p + k.shape[2]] = k
        elif self.kind == "update_cache":
            torch.ops.llama.update_cache(k.transpose(1, 2), self.cache, pos[0].item())
        elif self.kind == "slice_scatter":  # accumulates into rows 2..3 every call
            self.cache.copy_(torch.slice_scatter(self.cache, self.cache[:, :, 2:4] + k, 2, 2, 4))
        elif self.kind == "select_scatter":  # accumulates into row 5 every call
            self.cache.copy_(torch.select_scatter(self.cache, self.cache[:, :, 5] + k[:, :, 0],
                                                  2, 5))
        return self.cache * 2


KINDS = ["index_copy", "index_put", "slice_item", "update_cache", "slice_scatter",
         "select_scatter"]


def _positions(kind, start):
    return torch.tensor([start, start + 1]) if kind.startswith("index") else torch.tensor([start])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", KINDS)
@needs_torch_213
def test_cache_buffer_updated_in_place_persists(kind, dtype):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    eager = Cache(kind, dtype)
    k0 = _data((1, 2, 2, 4), dtype, 13)
    program = to_backend(torch.export.export(Cache(kind, dtype), (k0, _positions(kind, 0))))
    assert " 0 on CPU" in str(program.report), program.report
    ops = [op for op, _ in delegated_nodes(program)]
    assert ops and "aten._local_scalar_dense.default" not in ops
    assert len(program.methods["forward"].plan["nodes"]) <= 3  # delegate + getitems
    for step, start in enumerate((1, 4, 6)):
        k = _data((1, 2, 2, 4), dtype, 20 + step)
        pos = _positions(kind, start)
        want, got = eager(k, pos), program(k, pos)
        assert torch.equal(got, want), f"{kind} call {step}"
        # The cache stays on the device: only k and the position are uploaded.
        graph = program.runner("forward").delegates[0].loaded
        assert graph.last_transfer["upload_bytes"] <= (k.numel() + pos.numel()) * 4
    assert program.runner("forward").states_on_device == ["b_cache"]
    # Every write so far is in the returned cache: earlier calls' rows persist (or, for
    # the accumulating kinds, the rows hold the sum of all three calls' k).
    if kind in ("slice_scatter", "select_scatter"):
        assert torch.count_nonzero(got[0, 0]) >= 4
    else:
        assert torch.count_nonzero(got[0, 0] if kind != "update_cache" else got[0, :, 0]) > 8


@needs_torch_213
def test_cache_position_out_of_range_raises():
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    k = torch.randn(1, 2, 2, 4)
    for kind, bad in (("slice_item", [7]), ("update_cache", [7]), ("index_copy", [8, 1]),
                      ("index_put", [-9, 0])):
        program = to_backend(torch.export.export(Cache(kind, torch.float32),
                                                 (k, _positions(kind, 0))))
        with pytest.raises(VkDelegateError, match="out of range"):
            program(k, torch.tensor(bad))
        with pytest.raises((IndexError, RuntimeError)):  # eager refuses it too
            Cache(kind, torch.float32)(k, torch.tensor(bad))


@pytest.mark.parametrize("kind", ["slice_item", "update_cache", "index_copy"])
@needs_torch_213
def test_prefill_of_dynamic_length_then_decode(kind):
    # T rows at a time (a Dim), the position read on the device: prefill 3, decode 2+2.
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    T = torch.export.Dim("T", min=2, max=7)
    pos = torch.arange(3) if kind == "index_copy" else torch.tensor([0])
    shapes = ({2: T}, {0: T}) if kind == "index_copy" else ({2: T}, None)
    ep = torch.export.export(Cache(kind, torch.float32), (torch.randn(1, 2, 3, 4), pos),
                             dynamic_shapes=shapes)
    program = to_backend(ep)
    assert "slice_scatter_at" in str(delegated_nodes(program)) or kind == "index_copy"
    eager, start = Cache(kind, torch.float32), 0
    for t in (3, 2, 2):
        k = _data((1, 2, t, 4), torch.float32, 30 + t + start)
        pos = torch.arange(start, start + t) if kind == "index_copy" else torch.tensor([start])
        assert torch.equal(program(k, pos), eager(k, pos)), (kind, t)
        start += t


@pytest.mark.parametrize("executor", ["vulkan", "reference"])
def test_cache_state_survives_save_and_load(tmp_path, executor):
    if vulkan_unavailable() and executor == "vulkan":
        pytest.skip(vulkan_unavailable())
    from vkdelegate import VulkanPartitioner, load

    eager = Cache("update_cache", torch.float32)
    k = torch.randn(1, 2, 2, 4)
    program = to_backend(torch.export.export(Cache("update_cache", torch.float32),
                                             (k, torch.tensor([0]))),
                         VulkanPartitioner({"executor": executor}))
    for start in (0, 2):
        k = _data((1, 2, 2, 4), torch.float32, 40 + start)
        assert torch.equal(program(k, torch.tensor([start])), eager(k, torch.tensor([start])))
    program.save(tmp_path / "cache.vkdp")
    loaded = load(tmp_path / "cache.vkdp")
    k = _data((1, 2, 2, 4), torch.float32, 50)
    assert torch.equal(loaded(k, torch.tensor([4])), eager(k, torch.tensor([4])))


# ---- vkdelegate.index_put_pair (passes/pair_cache_updates) --------------------------
def _two_puts(x, x2, i, v, v2):
    put = torch.ops.aten.index_put
    return put(x, [None, None, i], v), put(x2, [None, None, i], v2)


@pytest.mark.parametrize("dtype", MOVE)
def test_index_put_pair_is_two_index_puts(dtype):
    """Two index_puts at one index become one index_put_pair: eager's values, bitwise."""
    x, x2 = _data((2, 3, 6, 4), dtype, 40), _data((2, 3, 6, 4), dtype, 41)
    v, v2 = _data((2, 3, 2, 4), dtype, 42), _data((2, 3, 2, 4), dtype, 43)
    index = torch.tensor([-1, 2])  # wrapped from the end, as index_put does
    args = (x, x2, index, v, v2)
    program = check_op(_two_puts, args, ops=["vkdelegate.index_put_pair.default"])
    ops = [op for op, _ in delegated_nodes(program)]
    assert "aten.index_put.default" not in ops, ops
    for got, want in zip(program(*args), _two_puts(*args)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_index_puts_of_other_sizes_are_not_paired():
    x, x2 = _data((1, 2, 6, 4), torch.float32, 44), _data((1, 2, 6, 8), torch.float32, 45)
    v, v2 = _data((1, 2, 1, 4), torch.float32, 46), _data((1, 2, 1, 8), torch.float32, 47)
    program = check_op(_two_puts, (x, x2, torch.tensor([3]), v, v2),
                       ops=["aten.index_put.default"])
    ops = [op for op, _ in delegated_nodes(program)]
    assert ops.count("aten.index_put.default") == 2 and "vkdelegate.index_put_pair.default" \
        not in ops


def test_index_put_pair_rule_refuses_mismatches():
    from vkdelegate.ops.families.cache_update import index_put_pair_rule
    from vkdelegate.ops.registry import NodeSpec, TensorSpec

    def t(shape, dtype="float16"):
        return TensorSpec(dtype=dtype, shape=tuple(shape))

    def rule(x, x2, indices, v, v2):
        return index_put_pair_rule(NodeSpec(op="vkdelegate.index_put_pair.default",
                                             args=(x, x2, indices, v, v2), outputs=(x, x2)))
    c, i, v = t((1, 2, 8, 4)), t((1,), "int64"), t((1, 2, 1, 4))
    assert rule(c, c, [None, None, i], v, v) is None
    assert "differ" in rule(c, t((1, 2, 8, 2)), [None, None, i], v, v)
    assert "values" in rule(c, c, [None, None, i], v, t((1, 2, 1, 2)))
    assert rule(c, c, [None, None, i], t((1, 1, 1, 1)), t((1, 1, 1, 1))) is not None
    assert rule(c, c, [None, i, i], v, v) is not None
    assert rule(c, c, [None, None, t((1,), "float32")], v, v) is not None


class KVCache(nn.Module):
    """A layer's K and V buffers written at ``pos`` in place, as HF's StaticLayer does."""

    def __init__(self, dtype):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 8, 4, dtype=dtype))
        self.register_buffer("v", torch.zeros(1, 2, 8, 4, dtype=dtype))

    def forward(self, k, v, pos):
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        return self.k * 2 + self.v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@needs_torch_213
def test_paired_cache_writes_run_in_place_and_persist(dtype):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    eager = KVCache(dtype)
    k0, v0 = _data((1, 2, 1, 4), dtype, 50), _data((1, 2, 1, 4), dtype, 51)
    program = to_backend(torch.export.export(KVCache(dtype), (k0, v0, torch.tensor([0]))))
    ops = [op for op, _ in delegated_nodes(program)]
    assert ops.count("vkdelegate.index_put_pair.default") == 1, ops
    for step, start in enumerate((0, 3, 7)):
        k, v = _data((1, 2, 1, 4), dtype, 60 + step), _data((1, 2, 1, 4), dtype, 70 + step)
        pos = torch.tensor([start])
        assert torch.equal(program(k, v, pos), eager(k, v, pos)), step
        graph = program.runner("forward").delegates[0].loaded
        assert graph.last_transfer["upload_bytes"] <= (2 * k.numel() + 1) * 8
    assert sorted(program.runner("forward").states_on_device) == ["b_k", "b_v"]
    with pytest.raises(VkDelegateError, match="out of range"):
        program(k, v, torch.tensor([8]))
