"""Tests that need torch 2.13's export (the pinned version): the GPU machine's torch
2.11 export guards on data-dependent positions (``cache[:, :, p:p + T] = k`` with
``p = pos.item()``: ``Eq(u1, 2)``) and refuses dynamic ranges its own guards narrow
(``min(d*s, n*d*s) == d*s``, from an expand + reshape of a dynamic length, e.g.
transformers' ``repeat_kv`` of keys as long as the input when a model runs without a
static cache). tests/llm does not need it: ``vkdelegate.llm`` hands the model a static
cache (under ``past_key_values=`` before transformers 5.24), so its keys have a static
length and its positions are tensors, and it exports on torch 2.11 + transformers 5.17."""
from __future__ import annotations

import pytest
import torch

TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

#: Skips a test whose export needs torch >= 2.13, naming the installed version.
needs_torch_213 = pytest.mark.skipif(
    TORCH < (2, 13), reason=f"torch {torch.__version__}'s export cannot export this "
                            f"graph (needs torch 2.13, the pinned version)")
