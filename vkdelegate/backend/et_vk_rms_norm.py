"""Torch-side definition of ET-VK's ``et_vk.rms_norm.default`` (the one place it is
declared: schema and CPU kernel), so that graphs can hold it.

Schema and semantics are ExecuTorch 1.5.1's (backends/vulkan/custom_ops_lib.py):
``rms_norm(Tensor x, Tensor weight, float eps) -> Tensor`` normalizes the last dim,
``(x.float() * rsqrt(mean(x.float() ** 2, -1, keepdim) + eps) * weight.float())``
converted back to x's dtype. The lowering pass ``passes/fuse_rms_norm`` creates it; the
CPU kernel here is what eager execution, the CPU glue and the reference executor run
(CompositeExplicitAutograd: also the fake kernel export needs). The Vulkan
implementation is in ``vkdelegate.ops.families.norm``. Importing the module defines
the op once per process; an ExecuTorch install that defined it first is left alone.
"""
from __future__ import annotations

import torch

NAME = "et_vk.rms_norm.default"
SCHEMA = "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"

_lib = None


def _rms_norm(x, weight, eps):
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps) * weight.float()).to(x.dtype)


def ensure_defined() -> None:
    """Define ``torch.ops.et_vk.rms_norm`` unless it exists already (idempotent)."""
    global _lib
    if _lib is not None or hasattr(torch.ops.et_vk, "rms_norm"):
        return
    _lib = torch.library.Library("et_vk", "FRAGMENT")
    _lib.define(SCHEMA)
    _lib.impl("rms_norm", _rms_norm, "CompositeExplicitAutograd")


ensure_defined()
