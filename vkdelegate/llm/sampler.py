"""The next-token sampler at the end of ``prefill`` and ``decode``.

``sample(logits, sampling)`` is the custom op ``vkdelegate.sample`` (its definition,
the issue-14 rule, is ``backend.custom_ops_llm.sample_reference``; its Vulkan kernel
``ops/families/sample.py``), so the logits never leave the device: only the chosen id,
int64[1], crosses to the host. ``sampling`` = (temperature, top_k, top_p, draw),
float32[4]: temperature <= 0 is greedy (``argmax``, the first maximum, as HF greedy
search); else softmax(logits / temperature), keep the top_k most likely (0: all), of
those the smallest prefix whose mass (relative to the top_k set, as HF applies top-p
after top-k) reaches top_p, renormalise, and take the first token, in descending
probability (ties: the lower id), whose cumulative probability exceeds the draw
(uniform in [0, 1), drawn by the host from a seeded generator).

``vkdelegate.llm.decoder`` calls ``sample_record``: the same pick, and the decode
loop's record of it, in one op (``vkdelegate.sample_record``, one dispatch).
"""
from __future__ import annotations

import torch

from vkdelegate.backend import custom_ops


def sample(logits: torch.Tensor, sampling: torch.Tensor) -> torch.Tensor:
    """The next token id, int64[1], from ``logits`` (float, V elements) and
    ``sampling`` (float32[4]: temperature, top_k, top_p, draw); see the module
    docstring."""
    custom_ops.ensure_defined()
    return torch.ops.vkdelegate.sample.default(logits.reshape(1, -1), sampling)


def sample_record(logits: torch.Tensor, sampling: torch.Tensor, draws, pos: torch.Tensor,
                  token: torch.Tensor, token_pos: torch.Tensor, history: torch.Tensor):
    """``(id, token', pos', history')``: ``id = sample(logits, sampling)`` (with the draw
    ``draws[pos[0]]`` when ``draws`` is given), and the decode loop's state recording
    it for position pos[0] + 1 (``custom_ops_llm.sample_record_reference``)."""
    custom_ops.ensure_defined()
    return torch.ops.vkdelegate.sample_record.default(
        logits.reshape(1, -1), sampling, draws, pos, token, token_pos, history)
