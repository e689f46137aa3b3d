"""Seeded random tensors of every dtype the movement op tests use."""
from __future__ import annotations

import torch

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16,
                "float64": torch.float64, "int32": torch.int32, "int64": torch.int64,
                "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def rand(*shape, dtype: str = "float32", seed: int = 0) -> torch.Tensor:
    """Random values of ``dtype`` (a numpy-style name): normal floats, integers over
    their range (capped at +-1000 so int32/int64 stay exact everywhere), random bools.
    Different ``seed`` values give different tensors for the same shape."""
    gen = torch.Generator().manual_seed(seed * 7919 + sum(shape) + len(shape))
    dt = TORCH_DTYPES[dtype]
    if dt.is_floating_point:
        return torch.randn(shape, generator=gen).to(dt)
    if dt == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    info = torch.iinfo(dt)
    return torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, shape,
                         generator=gen, dtype=torch.int64).to(dt)
