"""``ReferenceDecoder``: a small Llama-style decoder of our own, without transformers.

RMSNorm, rotary position embeddings (HF "rotate half" convention), grouped-query
attention through ``scaled_dot_product_attention`` with a causal mask over the whole
static cache, SwiGLU MLP, tied or separate output head. It has the decoder interface
``lower`` uses (``embed``, ``logits``, a ``kv_cache`` submodule, see
``vkdelegate.llm.decoder``), so ``lower(ReferenceDecoder(...), n)`` gives the same
methods as for a HF model. ``forward(tokens)`` is the cache-free eager reference:
logits [1, T, V] of a whole sequence.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vkdelegate.llm.decoder import KVCache


class _Layer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)

    def forward(self, x, cos, sin, mask, cache=None, positions=None):
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:  # (k buffer, v buffer): write at the positions, read all
            cache[0].index_copy_(2, positions, k)
            cache[1].index_copy_(2, positions, v)
            k, v = cache
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           enable_gqa=self.heads != self.kv_heads)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class ReferenceDecoder(nn.Module):
    """A decoder-only LM: ``vocab`` tokens, ``layers`` layers of width ``dim`` with
    ``heads`` query and ``kv_heads`` key/value heads, SwiGLU of ``hidden``, rotary
    base ``theta``, cache of ``max_seq_len`` positions (float32 weights, random)."""

    def __init__(self, vocab: int = 256, dim: int = 64, layers: int = 2, heads: int = 4,
                 kv_heads: int = 2, hidden: int = 128, max_seq_len: int = 128,
                 theta: float = 10000.0, tied: bool = True):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(_Layer(dim, heads, kv_heads, hidden)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.head = None if tied else nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        self.kv_cache = KVCache([kv_heads] * layers, [head_dim] * layers, max_seq_len,
                                torch.float32)
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def _tables(self, positions):
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos()[None, None], angles.sin()[None, None]

    def _out(self, x):
        x = self.norm(x)
        return x @ self.embed_tokens.weight.T if self.head is None else self.head(x)

    def embed(self, tokens):
        return self.embed_tokens(tokens)

    def logits(self, embeds, start_pos):
        """Logits [V] after ``embeds`` [1, T, D] written at ``start_pos`` (int64[1])."""
        t = embeds.shape[1]
        positions = torch.arange(t, dtype=torch.int64) + start_pos
        cos, sin = self._tables(positions)
        keys = torch.arange(self.kv_cache.max_seq_len, dtype=torch.int64)
        mask = keys[None, :] <= positions[:, None]  # causal over the whole cache
        x = embeds
        for i, layer in enumerate(self.layers):
            cache = (getattr(self.kv_cache, f"k_{i}"), getattr(self.kv_cache, f"v_{i}"))
            x = layer(x, cos, sin, mask, cache, positions)
        return self._out(x[:, -1:])[0, -1]

    def forward(self, tokens):
        """Cache-free reference: logits [1, T, V] of ``tokens`` [1, T]."""
        t = tokens.shape[1]
        cos, sin = self._tables(torch.arange(t))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self._out(x)
