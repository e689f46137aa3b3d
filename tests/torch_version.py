"""Tests that need torch 2.13's export (the pinned version): the GPU machine's torch
2.11 export guards on data-dependent positions (``Eq(u1, 2)``), refuses dynamic ranges
its own guards narrow (``min(s, 2*s) == s``) and lacks transformers 5.24's helpers."""
from __future__ import annotations

import pytest
import torch

TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

#: Skips a test whose export needs torch >= 2.13, naming the installed version.
needs_torch_213 = pytest.mark.skipif(
    TORCH < (2, 13), reason=f"torch {torch.__version__}'s export cannot export this "
                            f"graph (needs torch 2.13, the pinned version)")
