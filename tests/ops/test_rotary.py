"""Rotary embeddings and gated MLPs on Vulkan against PyTorch eager: ExecuTorch's
et_vk.apply_rotary_emb (interleaved pairs), HF's rotate_half form (fused into
vkdelegate.rotary_half by passes/fuse_rotary, and unfused) and the SwiGLU (Llama) /
GeGLU (Gemma, gelu tanh) MLPs, each with every node on Vulkan."""
import pytest
import torch
from torch import nn

from vkdelegate.backend import custom_ops

from tests.ops.harness import check_op, delegated_nodes

custom_ops.ensure_defined()


def _freqs(seq, half, dtype):
    inv = 1.0 / (10000 ** (torch.arange(half).float() / half))
    angles = torch.outer(torch.arange(seq).float(), inv)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_et_vk_apply_rotary_emb(dtype, tol):
    g = torch.Generator().manual_seed(0)
    xq = torch.randn(1, 5, 4, 8, generator=g).to(dtype)
    xk = torch.randn(1, 5, 2, 8, generator=g).to(dtype)
    cos, sin = _freqs(5, 4, dtype)
    op = torch.ops.et_vk.apply_rotary_emb
    # The op's CPU kernel against the complex-number form ExecuTorch's rope.py uses.
    want = torch.view_as_real(torch.view_as_complex(xq.float().reshape(1, 5, 4, 4, 2))
                              * torch.polar(torch.ones(5, 4), torch.atan2(
                                  sin.float(), cos.float()))[None, :, None]).flatten(3)
    torch.testing.assert_close(op(xq, xk, cos, sin)[0].float(), want, rtol=tol, atol=tol)
    check_op(lambda q, k, c, s: op(q, k, c, s), (xq, xk, cos, sin),
             ops=["et_vk.apply_rotary_emb.default"], rtol=tol, atol=tol)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class HFRotary(nn.Module):
    """transformers' apply_rotary_pos_emb (Llama, Qwen2, Mistral, Gemma)."""

    def forward(self, q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _hf_inputs(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 6, 8, generator=g).to(dtype)
    k = torch.randn(1, 2, 6, 8, generator=g).to(dtype)
    cos, sin = (torch.cat([f, f], -1)[None] for f in _freqs(6, 4, dtype))
    return q, k, cos, sin


# fp16: the fused op rounds once where eager rounds after each of mul, mul and add.
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 4e-3)])
def test_hf_rotate_half_is_fused(dtype, tol):
    # q's and k's rotary_half share cos and sin: paired into one rotary_half_pair.
    program = check_op(HFRotary(), _hf_inputs(dtype),
                       ops=["vkdelegate.rotary_half_pair.default"], rtol=tol, atol=tol)
    assert " 0 on CPU" in str(program.report), program.report
    ops = [op for op, _ in delegated_nodes(program)]
    assert ops.count("vkdelegate.rotary_half_pair.default") == 1
    assert "vkdelegate.rotary_half.default" not in ops
    assert "aten.cat.default" not in ops and "aten.neg.default" not in ops


class RotaryAlsoReturned(HFRotary):
    """rotate_half(q) is also an output: the pass must leave q's pattern alone (its
    slice/neg/cat/mul/add run unfused, on Vulkan) and fuse k's."""

    def forward(self, q, k, cos, sin):
        return super().forward(q, k, cos, sin)[0], _rotate_half(q)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_hf_rotate_half_with_a_shared_intermediate_is_not_fused(dtype, tol):
    program = check_op(RotaryAlsoReturned(), _hf_inputs(dtype),
                       ops=["aten.cat.default", "aten.neg.default", "aten.slice.Tensor"],
                       rtol=tol, atol=tol)
    assert " 0 on CPU" in str(program.report), program.report
    ops = [op for op, _ in delegated_nodes(program)]
    assert ops.count("vkdelegate.rotary_half.default") == 1


def _lowered(fn, inputs):
    from vkdelegate import VulkanPartitioner, to_backend

    class M(nn.Module):
        def forward(self, *args):
            return fn(*args)
    return to_backend(torch.export.export(M(), inputs), VulkanPartitioner())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shapes", [((1, 4, 6, 8), (1, 2, 6, 8), (1, 6, 8)),
                                    ((1, 32, 1, 64), (1, 8, 1, 64), (1, 1, 64)),
                                    ((3, 10), (5, 10), (10,))])
def test_rotary_half_pair_is_bitwise_the_single_op(dtype, shapes):
    """The paired op's outputs have the bits two unpaired rotary_half dispatches give
    (each lowered alone, so the pass has nothing to pair) and its CPU kernel's."""
    from tests.ops.harness import vulkan_unavailable

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    g = torch.Generator().manual_seed(3)
    qs, ks, fs = shapes
    q, k = torch.randn(qs, generator=g).to(dtype), torch.randn(ks, generator=g).to(dtype)
    ang = torch.rand(fs, generator=g) * 6
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    if len(qs) == 4:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    single, pair = torch.ops.vkdelegate.rotary_half, torch.ops.vkdelegate.rotary_half_pair
    paired = _lowered(lambda a, b, c, s: pair(a, b, c, s), (q, k, cos, sin))
    ops = [op for op, _ in delegated_nodes(paired)]
    assert ops == ["vkdelegate.rotary_half_pair.default"], ops
    out_q, out_k = paired(q, k, cos, sin)
    for x, out in ((q, out_q), (k, out_k)):
        alone = _lowered(lambda a, c, s: single(a, c, s), (x, cos, sin))
        want = alone(x, cos, sin)
        assert out.dtype == x.dtype and torch.equal(out, want)
        # the CPU kernel (fp32 math, one rounding): the same up to fp32 contraction
        torch.testing.assert_close(out, single(x, cos, sin), rtol=1e-5, atol=1e-5)


def test_rotary_half_pair_rule_refuses_bad_shapes():
    from vkdelegate.ops.families.rotary import _pair_rule
    from vkdelegate.ops.registry import NodeSpec, TensorSpec

    def t(shape, dtype="float32"):
        return TensorSpec(dtype=dtype, shape=tuple(shape))

    def rule(q, k, c, s):
        return _pair_rule(NodeSpec(op="vkdelegate.rotary_half_pair.default",
                                   args=(q, k, c, s), outputs=(q, k)))
    ok = (t((1, 4, 1, 8)), t((1, 2, 1, 8)), t((1, 1, 1, 8)), t((1, 1, 1, 8)))
    assert rule(*ok) is None
    assert "even" in rule(t((1, 4, 1, 7)), t((1, 2, 1, 7)), t((1, 1, 1, 7)), t((1, 1, 1, 7)))
    assert "dtype" in rule(ok[0], t((1, 2, 1, 8), "float16"), ok[2], ok[3])
    assert "broadcast" in rule(ok[0], ok[1], t((1, 1, 2, 8)), t((1, 1, 2, 8)))
    assert rule(ok[0], ok[1], ok[2], t((1, 1, 1, 4))) is not None


class GatedMLP(nn.Module):
    """HF LlamaMLP (SwiGLU: silu) and GemmaMLP (GeGLU: gelu approximate='tanh')."""

    def __init__(self, act):
        super().__init__()
        self.gate, self.up = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
        self.down, self.act = nn.Linear(32, 16, bias=False), act

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("act", [nn.SiLU(), nn.GELU(approximate="tanh")],
                         ids=["swiglu", "geglu"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 5e-3)])
def test_gated_mlp_lowers_with_every_node_on_vulkan(act, dtype, tol):
    torch.manual_seed(2)
    mlp = GatedMLP(act).to(dtype)
    program = check_op(mlp, (torch.randn(1, 3, 16).to(dtype),), ops=[], rtol=tol, atol=tol)
    assert " 0 on CPU" in str(program.report), program.report
    assert delegated_nodes(program)


class RotaryCacheWrite(nn.Module):
    """A decoder layer's rotary embedding and K/V cache writes (fuse_rotary's pair, then
    two index_puts at one position tensor, as HF's StaticLayer exports them); with
    ``keep_k`` k' is also an output, so pair_cache_updates must not fuse it; ``v_first``
    writes the values' cache first (the fused op's destinations swapped)."""

    def __init__(self, keep_k=False, v_first=False):
        super().__init__()
        self.keep_k, self.v_first = keep_k, v_first

    def forward(self, q, k, v, cos, sin, kc, vc, pos):
        qr, kr = torch.ops.vkdelegate.rotary_half_pair(q, k, cos, sin)
        put = torch.ops.aten.index_put
        if self.v_first:
            vc2 = put(vc, [None, None, pos], v)
            kc2 = put(kc, [None, None, pos], kr)
        else:
            kc2 = put(kc, [None, None, pos], kr)
            vc2 = put(vc, [None, None, pos], v)
        return (qr, kc2, vc2) + ((kr,) if self.keep_k else ())


def _rotary_cache_inputs(dtype, t, pos):
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, t, 8, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, t, 8, generator=g).to(dtype) for _ in range(2))
    ang = torch.rand(1, 1, t, 8, generator=g) * 6
    kc, vc = (torch.randn(1, 2, 10, 8, generator=g).to(dtype) for _ in range(2))
    return q, k, v, ang.cos().to(dtype), ang.sin().to(dtype), kc, vc, torch.tensor(pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t, pos, v_first", [(1, [4], False), (1, [-1], True),
                                             (3, [7, 0, 2], False)])
def test_rotary_and_cache_writes_are_one_dispatch_bitwise(dtype, t, pos, v_first):
    """rotary_half_pair + index_put_pair -> rotary_index_put_pair: the caches and q'
    have the bits of the two unfused ops (the same graph with k' also returned, which
    keeps them apart) and, up to fp32 contraction, of the CPU kernels."""
    from tests.ops.harness import vulkan_unavailable

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    from vkdelegate import VulkanPartitioner, to_backend

    inputs = _rotary_cache_inputs(dtype, t, pos)
    fused = to_backend(torch.export.export(RotaryCacheWrite(v_first=v_first), inputs),
                       VulkanPartitioner())
    ops = [op for op, _ in delegated_nodes(fused)]
    assert ops.count("vkdelegate.rotary_index_put_pair.default") == 1, ops
    assert not {"vkdelegate.rotary_half_pair.default", "vkdelegate.index_put_pair.default",
                "aten.index_put.default"} & set(ops), ops
    apart = to_backend(torch.export.export(RotaryCacheWrite(True, v_first), inputs),
                       VulkanPartitioner())
    assert "vkdelegate.rotary_index_put_pair.default" not in \
        [op for op, _ in delegated_nodes(apart)]
    got, want = fused(*inputs), apart(*inputs)[:3]
    eager = RotaryCacheWrite(v_first=v_first)(*inputs)
    for g_, w_, e_ in zip(got, want, eager):
        assert g_.dtype == e_.dtype and torch.equal(g_, w_)
        torch.testing.assert_close(g_, e_, rtol=1e-5, atol=1e-5)


def test_rotary_cache_write_out_of_range_position_raises():
    from tests.ops.harness import vulkan_unavailable

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    from vkdelegate import VulkanPartitioner, to_backend
    from vkdelegate.errors import VkDelegateError

    inputs = _rotary_cache_inputs(torch.float32, 1, [4])
    program = to_backend(torch.export.export(RotaryCacheWrite(), inputs), VulkanPartitioner())
    assert "vkdelegate.rotary_index_put_pair.default" in \
        [op for op, _ in delegated_nodes(program)]
    with pytest.raises(VkDelegateError, match="out of range"):
        program(*inputs[:-1], torch.tensor([10]))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_rotary_cache_write_against_eager(dtype, tol, index_dtype):
    """rotary_index_put_pair against eager (the pair's CPU kernels: fp32 math, one
    rounding), with int64 and int32 positions."""
    inputs = list(_rotary_cache_inputs(dtype, 2, [5, 1]))
    inputs[-1] = inputs[-1].to(index_dtype)
    check_op(RotaryCacheWrite(), tuple(inputs),
             ops=["vkdelegate.rotary_index_put_pair.default"], rtol=tol, atol=tol)
