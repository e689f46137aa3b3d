"""build_vkgraph on modules whose ATen graphs use many argument kinds (strings,
optional tensor lists, dtypes, int64/bool tensors, float lists, multi-output ops),
each checked against eager by running the serialized graph with ATen ops."""
import pytest
import torch
import torch.nn.functional as F

from .export_helpers import build
from .test_builder import check_against_eager


class ConvBnHardswish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3, stride=2, padding=1, groups=1)
        self.bn = torch.nn.BatchNorm2d(5)

    def forward(self, x):
        return F.hardswish(self.bn(self.conv(x)))


class Pooling(torch.nn.Module):
    def forward(self, x):
        y, idx = F.max_pool2d(x, 2, return_indices=True)
        return F.adaptive_avg_pool2d(x, (3, 1)), y, idx


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class EmbeddingNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, ids):
        return F.gelu(self.norm(self.emb(ids)), approximate="tanh")


class Indexing(torch.nn.Module):
    def forward(self, x, idx, mask):
        y = x[:, idx]                                   # index.Tensor with [None, idx]
        z = torch.where(mask, x, torch.full_like(x, -3.0))
        return y, z.cumsum(dim=1, dtype=torch.float64), x.argmax(dim=0)


class Resize(torch.nn.Module):
    def forward(self, x):
        return (F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False),
                torch.clamp(x, min=-1, max=0.5))


CASES = {
    "conv_bn_hardswish": (ConvBnHardswish, lambda g: (torch.randn(2, 3, 11, 7, generator=g),)),
    "pooling": (Pooling, lambda g: (torch.randn(1, 2, 6, 5, generator=g),)),
    "attention": (Attention, lambda g: tuple(torch.randn(1, 2, 5, 4, generator=g) for _ in range(3))),
    "embedding_norm": (EmbeddingNorm, lambda g: (torch.randint(0, 11, (3, 7), generator=g),)),
    "indexing": (Indexing, lambda g: (torch.randn(3, 5, generator=g), torch.tensor([4, 0, 2]),
                                      torch.rand(3, 5, generator=g) > 0.5)),
    "resize": (Resize, lambda g: (torch.randn(1, 2, 3, 5, generator=g),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_module_matches_eager(name):
    torch.manual_seed(0)
    factory, make_inputs = CASES[name]
    module = factory().eval()
    args = make_inputs(torch.Generator().manual_seed(1))
    part = build(module, args)
    check_against_eager(module, args, part=part)
