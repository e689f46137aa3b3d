"""Torch-side definitions of ET-VK's custom ops, so that graphs can hold them.

``et_vk.conv_with_clamp.default`` is ExecuTorch's fused convolution + clamp: the
``aten.convolution`` arguments followed by ``output_min`` and ``output_max`` (either
may be None). A lowering pass that fuses conv + relu/hardtanh/clamp creates it; the
CPU kernel here (convolution, then clamp) is what eager execution and the CPU glue
run, and the fake kernel gives export its output shape. The Vulkan implementation is
registered in ``vkdelegate.ops.families.convolution``.

``et_vk.sdpa.default`` is ExecuTorch's fused attention (backends/vulkan/
custom_ops_lib.py, ExecuTorch 1.4 and 1.5): q [B, H, L, E], k and v [B, H, S, *], an
optional additive mask and scale; its reference below is ExecuTorch's (matmul, scale,
add, softmax, matmul: a fully masked row is NaN). The Vulkan implementation is in
``vkdelegate.ops.families.sdpa``.

Importing this module defines the ops once per process (``ensure_defined`` is
idempotent, so an ExecuTorch install that already defines them is left alone).
"""
from __future__ import annotations

import torch

CONV_WITH_CLAMP_SCHEMA = (
    "conv_with_clamp(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, "
    "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, "
    "SymInt groups, Scalar? output_min=None, Scalar? output_max=None) -> Tensor")

SDPA_SCHEMA = ("sdpa(Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None, "
               "float? scale=None) -> Tensor")

_lib = None


def _conv_with_clamp(x, weight, bias, stride, padding, dilation, transposed,
                     output_padding, groups, output_min=None, output_max=None):
    out = torch.ops.aten.convolution.default(x, weight, bias, stride, padding, dilation,
                                             transposed, output_padding, groups)
    return torch.clamp(out, output_min, output_max)


def _sdpa(q, k, v, attn_mask=None, scale=None):
    if scale is None:
        scale = 1.0 / (q.size(-1) ** 0.5)
    attn = torch.matmul(q, k.transpose(-2, -1)) * scale
    if attn_mask is not None:
        attn = attn + attn_mask
    return torch.matmul(torch.softmax(attn, dim=-1), v)


def ensure_defined() -> None:
    """Define ``torch.ops.et_vk.conv_with_clamp`` and ``torch.ops.et_vk.sdpa`` unless
    they exist already (each op separately)."""
    global _lib
    if _lib is not None:
        return
    missing = [(name, schema, fn) for name, schema, fn in (
        ("conv_with_clamp", CONV_WITH_CLAMP_SCHEMA, _conv_with_clamp),
        ("sdpa", SDPA_SCHEMA, _sdpa)) if not hasattr(torch.ops.et_vk, name)]
    if not missing:
        return
    _lib = torch.library.Library("et_vk", "FRAGMENT")
    for name, schema, fn in missing:
        _lib.define(schema)
        # CompositeExplicitAutograd serves CPU and Meta (fake tensors) alike: it only
        # calls ATen ops that have both.
        _lib.impl(name, fn, "CompositeExplicitAutograd")


ensure_defined()

# et_vk.rms_norm (the norm family's fused op) is declared in its own module.
from vkdelegate.backend import et_vk_rms_norm  # noqa: E402,F401
