"""Attention and masking graphs on Vulkan against eager, with the exact set of ops left
on the CPU: the decomposed scaled_dot_product_attention (bool / float mask, causal),
nn.MultiheadAttention with key-padding and attention masks, nn.TransformerEncoderLayer
(norm_first both ways, relu / gelu), a BERT-style self-attention with the extended
attention mask and a ViT block. What remains on the CPU belongs to other work (layer
norm); each test states it exactly so that it tightens when that lands."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.ops.harness import check_op

# fp16: softmax and matrix products accumulate in fp32, each stored intermediate is
# rounded to fp16 (2**-11 relative), through a few chained products.
FP16_TOL = dict(rtol=1e-2, atol=1e-2)
#: The fused op is blocklisted here: these tests check that the DECOMPOSED attention
#: (matmul, scale, masking, softmax) runs wholly on Vulkan; tests/ops/test_sdpa.py tests
#: the fused op.
DECOMPOSED = ["aten.scaled_dot_product_attention.default"]


def _cpu_ops(program) -> set:
    return {d.op for m in program.methods.values() for d in m.report.cpu_nodes}


class _Sdpa(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.kw)


def _qkv(dtype, shape=(2, 3, 7, 8)):
    return tuple(torch.randn(shape).to(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("form", ["bool_mask", "float_mask", "causal", "scale", "none"])
def test_decomposed_sdpa_runs_wholly_on_vulkan(form, dtype):
    torch.manual_seed(0)
    q, k, v = _qkv(dtype)
    masks, kw = (), {}
    if form == "bool_mask":
        masks = (torch.rand(7, 7) > 0.3,)
    elif form == "float_mask":
        masks = (torch.randn(2, 1, 7, 7).to(dtype),)
    elif form == "causal":
        kw = dict(is_causal=True)
    elif form == "scale":
        kw = dict(scale=0.3)
    tol = FP16_TOL if dtype == torch.float16 else {}
    program = check_op(_Sdpa(**kw), (q, k, v) + masks,
                       ops=["aten.bmm.default", "aten._softmax.default"], blocklist=DECOMPOSED,
                       **tol)
    assert _cpu_ops(program) == set()


def test_sdpa_fully_masked_row():
    # A row whose mask is all False: ATen's decomposition gives zeros (not NaN).
    torch.manual_seed(0)
    q, k, v = _qkv(torch.float32, (1, 2, 4, 8))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    program = check_op(_Sdpa(), (q, k, v, mask), ops=["aten.where.self"],
                       blocklist=DECOMPOSED)
    assert _cpu_ops(program) == set()


class _Mha(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x, key_padding_mask, attn_mask):
        return self.attn(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask)


@pytest.mark.parametrize("float_masks", [False, True])
def test_multihead_attention_with_masks(float_masks):
    torch.manual_seed(0)
    kpm = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    am = torch.rand(6, 6) > 0.8
    am.fill_diagonal_(False)
    if float_masks:
        kpm, am = kpm.float() * -1e4, am.float() * -1e4
    program = check_op(_Mha(), (torch.randn(2, 6, 16), kpm, am),
                       ops=["aten.bmm.default", "aten._softmax.default"], blocklist=DECOMPOSED)
    assert _cpu_ops(program) == set()


class _Encoder(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, **kw)

    def forward(self, x, key_padding_mask):
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(x, src_mask=causal, src_key_padding_mask=key_padding_mask)


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_layer(norm_first, activation):
    torch.manual_seed(0)
    kpm = torch.tensor([[False] * 3 + [True] * 2, [False] * 5])
    program = check_op(_Encoder(norm_first=norm_first, activation=activation),
                       (torch.randn(2, 5, 16), kpm), ops=["aten.bmm.default"],
                       blocklist=DECOMPOSED)
    assert _cpu_ops(program) == set()


class _BertSelfAttention(nn.Module):
    """transformers' BertSelfAttention (eager attention) with the extended attention
    mask of BertModel.get_extended_attention_mask, written out (transformers is not
    installed here)."""

    def __init__(self, hidden=16, heads=2):
        super().__init__()
        self.heads, self.head_size = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def _split(self, x):
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        ext = attention_mask[:, None, None, :].to(hidden_states.dtype)
        ext = (1.0 - ext) * torch.finfo(hidden_states.dtype).min
        q, k, v = (self._split(f(hidden_states)) for f in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / self.head_size ** 0.5 + ext
        context = scores.softmax(-1) @ v
        context = context.permute(0, 2, 1, 3).contiguous()
        return context.view(context.shape[0], context.shape[1], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_bert_self_attention_extended_mask(dtype):
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    program = check_op(_BertSelfAttention().to(dtype), (torch.randn(2, 5, 16).to(dtype), mask),
                       # the mask's (1 - m) * min is one fused elementwise chain
                       ops=["vkdelegate.fused_elementwise.default",
                            "aten._softmax.default"], blocklist=DECOMPOSED,
                       **(FP16_TOL if dtype == torch.float16 else {}))
    # export's _assert_tensor_metadata (the mask's dtype at .to()) is removed by the
    # remove_noops pass: it holds statically.
    assert _cpu_ops(program) == set()


class _VitBlock(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def test_vit_block():
    torch.manual_seed(0)
    program = check_op(_VitBlock(), (torch.randn(2, 5, 16),),
                       ops=["aten.gelu.default", "aten.mul.Scalar"], blocklist=DECOMPOSED)
    assert _cpu_ops(program) == set()
