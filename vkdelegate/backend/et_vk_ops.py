"""Torch-side definitions of ET-VK's custom ops, so that graphs can hold them.

``et_vk.conv_with_clamp.default`` is ExecuTorch's fused convolution + clamp: the
``aten.convolution`` arguments followed by ``output_min`` and ``output_max`` (either
may be None). A lowering pass that fuses conv + relu/hardtanh/clamp creates it; the
CPU kernel here (convolution, then clamp) is what eager execution and the CPU glue
run, and the fake kernel gives export its output shape. The Vulkan implementation is
registered in ``vkdelegate.ops.families.convolution``.

Importing this module defines the ops once per process (``ensure_defined`` is
idempotent, so an ExecuTorch install that already defines them is left alone).
"""
from __future__ import annotations

import torch

CONV_WITH_CLAMP_SCHEMA = (
    "conv_with_clamp(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, "
    "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, "
    "SymInt groups, Scalar? output_min=None, Scalar? output_max=None) -> Tensor")

_lib = None


def _conv_with_clamp(x, weight, bias, stride, padding, dilation, transposed,
                     output_padding, groups, output_min=None, output_max=None):
    out = torch.ops.aten.convolution.default(x, weight, bias, stride, padding, dilation,
                                             transposed, output_padding, groups)
    return torch.clamp(out, output_min, output_max)


def ensure_defined() -> None:
    """Define ``torch.ops.et_vk.conv_with_clamp`` unless it exists already."""
    global _lib
    if _lib is not None or hasattr(torch.ops.et_vk, "conv_with_clamp"):
        return
    _lib = torch.library.Library("et_vk", "FRAGMENT")
    _lib.define(CONV_WITH_CLAMP_SCHEMA)
    # CompositeExplicitAutograd serves CPU and Meta (fake tensors) alike: it only
    # calls ATen ops that have both.
    _lib.impl("conv_with_clamp", _conv_with_clamp, "CompositeExplicitAutograd")


ensure_defined()

# et_vk.rms_norm (the norm family's fused op) is declared in its own module.
from vkdelegate.backend import et_vk_rms_norm  # noqa: E402,F401
