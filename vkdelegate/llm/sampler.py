"""The next-token sampler at the end of ``prefill`` and ``decode``, as torch ops.

``sample(logits, sampling)`` is written with plain ATen ops (softmax, sort, cumsum,
comparisons, gather), without data-dependent control flow, so that it exports into
the method's graph and only the chosen id (int64[1]) leaves the program. It is the
one place the rule lives: a device op (``vkdelegate::sample``) can replace it as a
whole (``vkdelegate.llm.decoder`` calls ``sampler.sample`` and nothing else).

The rule (issue 14): ``sampling`` = (temperature, top_k, top_p, draw), float32[4].
temperature <= 0: greedy, ``argmax`` (the first maximum, as ``torch.argmax`` and HF
greedy search). Else: p = softmax(logits / temperature); order the tokens by
descending p (``torch.sort``: ``aten.sort.default`` is on the CPU allow-list, the
stable overload is not; exact ties of p between kept and dropped tokens are left to
the sort); keep the first top_k (top_k <= 0: all); of
those keep the smallest prefix whose mass, relative to the kept top_k tokens (as HF
applies top-p after top-k), reaches top_p (a token is kept while the mass BEFORE it
is below top_p, so at least one token is); renormalise; return the first token whose
cumulative probability exceeds ``draw`` (uniform in [0, 1), drawn by the host from a
seeded generator; the last kept token if rounding leaves none).
"""
from __future__ import annotations

import torch


def sample(logits: torch.Tensor, sampling: torch.Tensor) -> torch.Tensor:
    """The next token id, int64[1], from ``logits`` (float, [V]) and ``sampling``
    (float32[4]: temperature, top_k, top_p, draw); see the module docstring."""
    logits = logits.float().reshape(-1)
    temperature, top_k, top_p, draw = (sampling[i] for i in range(4))
    greedy = torch.argmax(logits, dim=0, keepdim=True)
    safe_t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    probs = torch.softmax(logits / safe_t, dim=0)
    sorted_p, order = torch.sort(probs, descending=True)
    rank = torch.arange(logits.shape[0], dtype=torch.float32)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, float(logits.shape[0])))
    in_k = rank < k
    kept = torch.where(in_k, sorted_p, torch.zeros_like(sorted_p))
    mass = torch.cumsum(kept, dim=0) / kept.sum()
    before = mass - kept / kept.sum()
    keep = in_k & ((before < top_p) | (rank == 0))  # the most likely always stays
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    cdf = torch.cumsum(kept, dim=0) / kept.sum()
    # Counted in float32 (exact below 2**24 tokens): a Vulkan sum has no bool/int64.
    last = keep.to(torch.float32).sum() - 1
    count = ((cdf <= draw) & keep).to(torch.float32).sum()
    index = torch.minimum(count, last).to(torch.int64).reshape(1)
    token = torch.gather(order, 0, index)
    return torch.where(temperature > 0, token, greedy)
