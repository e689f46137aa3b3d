"""Fused attention (aten.scaled_dot_product_attention, et_vk.sdpa) on Vulkan against
eager F.scaled_dot_product_attention: causal (L != S too), bool and float masks with
broadcasting, GQA ratios 1..8, head dims 16..256, sequence lengths 1..4096, fp32 and
fp16, fully masked rows, resize; an nn.MultiheadAttention lowered with SDPA whole; the
reference executor; per-node decomposition of the SDPAs Vulkan cannot run."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.harness import check_op
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend

SDPA = "aten.scaled_dot_product_attention.default"
OPS = [SDPA]
# fp32: one fp32 accumulation order against another (eager CPU's flash kernel), sums of
# at most a few thousand O(1) terms.
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
# fp16: both sides round the O(1) output to fp16 (half an ulp, 2^-12 relative), and eager
# rounds its own intermediates (scaled q, probabilities) to fp16 where we keep fp32:
# a few ulps at 1.0 (2^-10 each).
FP16_TOL = dict(rtol=4e-3, atol=4e-3)
ensure_defined()


def _qkv(b, hq, hk, lq, s, e, ev=None, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    ev = e if ev is None else ev
    return (torch.randn(b, hq, lq, e).to(dtype), torch.randn(b, hk, s, e).to(dtype),
            torch.randn(b, hk, s, ev).to(dtype))


def _sdpa(**kw):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


def _masked(**kw):
    return lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)


@pytest.mark.parametrize("lq,s", [(1, 1), (7, 7), (7, 9), (9, 7), (64, 64), (129, 129),
                                  (1, 129), (129, 33)])
@pytest.mark.parametrize("causal", [False, True])
def test_lengths_and_causal(lq, s, causal):
    check_op(_sdpa(is_causal=causal), _qkv(2, 2, 2, lq, s, 32), ops=OPS, **FP32_TOL)


@pytest.mark.parametrize("e,ev", [(32, 32), (64, 64), (128, 128), (256, 256), (16, 48),
                                  (5, 3), (200, 72)])
def test_head_dims(e, ev):
    check_op(_sdpa(is_causal=True), _qkv(1, 2, 2, 19, 37, e, ev), ops=OPS, **FP32_TOL)


@pytest.mark.parametrize("hk", [8, 4, 2, 1])
def test_grouped_query_attention(hk):
    check_op(_sdpa(enable_gqa=True, is_causal=True), _qkv(2, 8, hk, 13, 21, 32),
             ops=OPS, **FP32_TOL)


def test_broadcast_kv_heads_without_gqa_and_rank3():
    check_op(_sdpa(), _qkv(2, 4, 1, 9, 11, 16), ops=OPS, **FP32_TOL)
    torch.manual_seed(1)
    check_op(_sdpa(is_causal=True),
             (torch.randn(3, 10, 24), torch.randn(3, 12, 24), torch.randn(3, 12, 8)),
             ops=OPS, **FP32_TOL)


def test_custom_scale():
    check_op(_sdpa(scale=0.37), _qkv(1, 2, 2, 17, 23, 64), ops=OPS, **FP32_TOL)
    check_op(_masked(scale=2.0), _qkv(1, 2, 2, 5, 6, 8) + (torch.randn(5, 6),),
             ops=OPS, **FP32_TOL)


@pytest.mark.parametrize("shape", [(9, 33), (2, 1, 1, 33), (1, 3, 9, 33), (2, 3, 9, 33),
                                   (1, 33), (2, 1, 9, 1)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_broadcast_masks(shape, kind):
    torch.manual_seed(3)
    if kind == "bool":
        mask = torch.rand(shape) > 0.3
        mask[..., 0] = True  # no fully masked row here (see test_fully_masked_rows)
    else:
        mask = torch.randn(shape) * 2
    check_op(_masked(), _qkv(2, 3, 3, 9, 33, 32) + (mask,), ops=OPS, **FP32_TOL)


def test_fully_masked_rows():
    # Eager (CPU flash kernel and the math decomposition) gives 0 for a row whose
    # scores are all -inf, from a bool mask or a float one.
    q, k, v = _qkv(1, 2, 2, 6, 40, 32)
    mask = torch.rand(6, 40) > 0.5
    mask[1] = False
    mask[4] = False
    check_op(_masked(), (q, k, v, mask), ops=OPS, **FP32_TOL)
    fmask = torch.where(mask, torch.randn(6, 40), torch.tensor(float("-inf")))
    check_op(_masked(), (q, k, v, fmask), ops=OPS, **FP32_TOL)
    check_op(_masked(), (q.half(), k.half(), v.half(), mask), ops=OPS, **FP16_TOL)


@pytest.mark.parametrize("mode", ["none", "causal", "bool", "float"])
def test_fp16(mode):
    q, k, v = _qkv(2, 4, 2, 37, 70, 64, dtype=torch.float16)
    torch.manual_seed(5)
    if mode in ("none", "causal"):
        check_op(_sdpa(is_causal=mode == "causal", enable_gqa=True), (q, k, v), ops=OPS,
                 **FP16_TOL)
        return
    mask = torch.rand(37, 70) > 0.4 if mode == "bool" else torch.randn(1, 4, 37, 70).half()
    check_op(_masked(enable_gqa=True), (q, k, v, mask), ops=OPS, **FP16_TOL)


def test_fp16_large_scores():
    # Q.K of 256 terms of magnitude 9: past fp16's range (65504) before the scale,
    # fine with fp32 accumulation; eager's CPU kernel also accumulates in fp32.
    q, k, v = _qkv(1, 1, 1, 8, 8, 256)
    check_op(_sdpa(), ((q.abs() * 3 + 9).half(), (k.abs() * 3 + 9).half(), v.half()),
             ops=OPS, **FP16_TOL)


def test_long_sequence_1024():
    check_op(_sdpa(is_causal=True), _qkv(1, 2, 1, 1024, 1024, 64), ops=OPS, **FP32_TOL)


@pytest.mark.slow
def test_long_sequence_4096():
    check_op(_sdpa(is_causal=True), _qkv(1, 1, 1, 4096, 4096, 32), ops=OPS, **FP32_TOL)


def test_resize():
    length, keys = Dim("length", min=1, max=80), Dim("keys", min=1, max=100)
    q, k, v = _qkv(1, 2, 2, 40, 60, 32)
    m = torch.randn(40, 60)
    small = _qkv(1, 2, 2, 3, 100, 32, seed=1) + (torch.randn(3, 100),)
    large = _qkv(1, 2, 2, 80, 1, 32, seed=2) + (torch.randn(80, 1),)
    check_op(_masked(), (q, k, v, m), ops=OPS, **FP32_TOL,
             dynamic_shapes=({2: length}, {2: keys}, {2: keys}, {0: length, 1: keys}),
             resize_inputs=[small, large])


def test_causal_tile_skip_is_exact():
    # Issue 14's early exit: skipping fully masked key tiles gives the same bits.
    args = _qkv(1, 2, 2, 100, 150, 64)
    fn = _sdpa(is_causal=True)
    with_skip = check_op(fn, args, ops=OPS, **FP32_TOL)
    without = check_op(fn, args, ops=OPS, **FP32_TOL,
                       options={"sdpa_skip_masked_tiles": False})
    assert torch.equal(with_skip(*args), without(*args))


def test_et_vk_sdpa():
    # ExecuTorch's op: additive mask, its reference softmax makes fully masked rows NaN.
    q, k, v = _qkv(1, 4, 4, 11, 20, 32)
    mask = torch.randn(11, 20)
    mask[3] = float("-inf")
    et = ["et_vk.sdpa.default"]
    check_op(lambda q, k, v, m: torch.ops.et_vk.sdpa(q, k, v, m), (q, k, v, mask), ops=et,
             **FP32_TOL)
    check_op(lambda q, k, v: torch.ops.et_vk.sdpa(q, k, v, None, 0.5),
             (q.half(), k.half(), v.half()), ops=et, **FP16_TOL)


class _Block(torch.nn.Module):
    """A pre-norm-free attention block: MultiheadAttention (batch_first) with a mask."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x, mask):
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


def test_multihead_attention_lowers_sdpa_whole():
    torch.manual_seed(0)
    x = torch.randn(2, 10, 32)
    mask = torch.rand(10, 10) > 0.7  # MultiheadAttention's bool mask: True = masked
    mask[:, 0] = False
    program = check_op(_Block(), (x, mask), ops=OPS, rtol=1e-4, atol=1e-5)
    ops = [name for d in program.methods["forward"].report.decisions
           for name in [d.op] if "scaled_dot_product" in name or "softmax" in name]
    assert ops == [SDPA], ops


def test_reference_executor_runs_sdpa():
    q, k, v = _qkv(1, 2, 1, 9, 12, 16)
    mask = torch.rand(9, 12) > 0.5

    class M(torch.nn.Module):
        def forward(self, q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    ep = torch.export.export(M(), (q, k, v, mask))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    assert program.methods["forward"].report.decisions[0].partition is not None
    torch.testing.assert_close(program(q, k, v, mask), M()(q, k, v, mask), rtol=1e-6, atol=1e-6)


def test_dropout_node_decomposed_others_kept_whole():
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return (F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    + F.scaled_dot_product_attention(q, k, v, dropout_p=0.5))

    x = torch.randn(1, 2, 8, 16)
    ep = torch.export.export(M().train(), (x, x, x))
    graph = VulkanPartitioner().prepare(ep).gm.graph
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert targets.count(SDPA) == 1
    assert "aten.native_dropout.default" in targets  # the other one, decomposed
