"""Transformer encoder blocks with the FUSED attention (issue 11's "must show"):
nn.MultiheadAttention with a key-padding mask and an attention mask, transformers'
own BertLayer (its real modeling code, tiny seeded config) and a ViT block (a
pre-norm block, and transformers' ViTLayer) each lower to ONE partition with every
node on Vulkan, static and with a dynamic sequence length, match eager, and run again
after resizing (the harness runs the resized inputs, then the first ones again).

fp32 tolerance 1e-4 (the issue's); fp16: every stored intermediate is rounded to fp16
(2**-11 relative) through a few chained products, softmax and matrix products
accumulate in fp32."""
import pytest
import torch
import torch.nn as nn
from torch.export import Dim

from tests.ops.harness import check_op
from tests.ops.test_attention_graphs import _VitBlock  # a pre-norm ViT block on nn.MultiheadAttention
from tests.torch_version import needs_torch_213

FP16_TOL = dict(rtol=1e-2, atol=1e-2)
SDPA = "aten.scaled_dot_product_attention.default"
#: HF's layers transpose their heads around the SDPA: passes/sdpa_seq_first takes them in.
SEQ_FIRST = "vkdelegate.sdpa_seq_first.default"


def _one_partition(program) -> None:
    """Every node on Vulkan, in one partition (a getitem of a delegate's outputs is
    no node of its own)."""
    for method in program.methods.values():
        report = method.report
        cpu = [d for d in report.cpu_nodes if d.op != "operator.getitem"]
        assert not cpu, str(report)
        assert report.num_partitions == 1, str(report)


def _tol(dtype):
    return FP16_TOL if dtype == torch.float16 else {}


def _inputs_at(n: int, dtype, *makers):
    g = torch.Generator().manual_seed(n)
    return tuple(make(n, g, dtype) for make in makers)


# ---- nn.MultiheadAttention with key_padding_mask and attn_mask ----------------------
class _Mha(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x, key_padding_mask, attn_mask):
        return self.attn(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                         need_weights=False)[0]


def _mha_inputs(n, g, dtype):
    x = torch.randn(2, n, 16, generator=g).to(dtype)
    kpm = torch.zeros(2, n, dtype=torch.bool)
    kpm[0, max(1, n - 2):] = True  # padded tail of the first sequence
    am = torch.rand(n, n, generator=g) > 0.7
    am.fill_diagonal_(False)  # no fully masked row: eager gives NaN rows there
    return x, kpm, am


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@needs_torch_213
def test_multihead_attention_masks_one_partition(dtype, dynamic):
    torch.manual_seed(0)
    seq = Dim("seq", min=2, max=24)
    shapes = ({1: seq}, {1: seq}, {0: seq, 1: seq}) if dynamic else None
    program = check_op(_Mha().to(dtype), _mha_inputs(9, None, dtype), ops=[SDPA],
                       dynamic_shapes=shapes,
                       resize_inputs=[_mha_inputs(n, None, dtype) for n in (24, 3)]
                       if dynamic else None, **_tol(dtype))
    _one_partition(program)


# ---- transformers' BertLayer ---------------------------------------------------------
def _bert_layer(dtype):
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertLayer
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_attention_heads=4,
                                     intermediate_size=64, hidden_act="gelu",
                                     attn_implementation="sdpa")
    return BertLayer(config).eval().to(dtype)


class _Bert(nn.Module):
    """BertLayer with BertModel's additive extended mask ((1 - mask) * finfo.min, in
    the hidden dtype, broadcast over heads and query rows)."""

    def __init__(self, dtype):
        super().__init__()
        self.layer = _bert_layer(dtype)

    def forward(self, hidden, attention_mask):
        ext = attention_mask[:, None, None, :].to(hidden.dtype)
        ext = (1.0 - ext) * torch.finfo(hidden.dtype).min
        out = self.layer(hidden, attention_mask=ext)
        return out[0] if isinstance(out, tuple) else out


def _bert_inputs(n, g, dtype):
    hidden = torch.randn(2, n, 32, generator=g).to(dtype)
    mask = torch.ones(2, n, dtype=torch.int64)
    mask[1, max(1, n - 3):] = 0
    return hidden, mask


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_hf_bert_layer_one_partition(dtype, dynamic):
    module = _Bert(dtype)
    seq = Dim("seq", min=2, max=40)
    program = check_op(module, _bert_inputs(11, None, dtype), ops=[SEQ_FIRST],
                       dynamic_shapes=({1: seq}, {1: seq}) if dynamic else None,
                       resize_inputs=[_bert_inputs(n, None, dtype) for n in (40, 4)]
                       if dynamic else None, **_tol(dtype))
    _one_partition(program)


# ---- ViT blocks ----------------------------------------------------------------------
class _HfVitLayer(nn.Module):
    def __init__(self):
        super().__init__()
        transformers = pytest.importorskip("transformers")
        from transformers.models.vit.modeling_vit import ViTLayer
        torch.manual_seed(0)
        config = transformers.ViTConfig(hidden_size=32, num_attention_heads=4,
                                        intermediate_size=64, attn_implementation="sdpa")
        self.layer = ViTLayer(config)

    def forward(self, x):
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


def _tokens(n, g, dtype):
    return torch.randn(2, n, 32, generator=g).to(dtype)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("block", ["prenorm", "hf_vit"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_vit_block_one_partition(block, dtype, dynamic):
    torch.manual_seed(0)
    module = (_VitBlock(32, 4) if block == "prenorm" else _HfVitLayer()).eval().to(dtype)
    tokens = Dim("tokens", min=2, max=50)
    program = check_op(module, _inputs_at(17, dtype, _tokens),
                       ops=[SDPA if block == "prenorm" else SEQ_FIRST],
                       dynamic_shapes=({1: tokens},) if dynamic else None,
                       resize_inputs=[_inputs_at(n, dtype, _tokens) for n in (50, 5)]
                       if dynamic else None, **_tol(dtype))
    _one_partition(program)
