"""Decompositions of PyTorch's ``quantized_decomposed`` ops (what PT2E's
``convert_pt2e`` inserts: torch/ao/quantization/fx/_decomposed.py) into ATen.

``run_decompositions`` keeps these custom ops whole by default, and a program's CPU
part may not call them (they are not on the glue allow-list). Decomposed with their
own CompositeExplicitAutograd Python kernels, they become ATen arithmetic: the
activations' quantize/dequantize run on Vulkan as elementwise ops, and a
``dequantize_per_channel`` of a constant int8 weight feeding a linear is fused by
``passes/quantized_linear`` like torchao's dequantize chains.
"""
from __future__ import annotations

#: (op, overload) of quantized_decomposed decomposed here.
OPS = (("quantize_per_tensor", "default"), ("quantize_per_tensor", "tensor"),
       ("dequantize_per_tensor", "default"), ("dequantize_per_tensor", "tensor"),
       ("quantize_per_channel", "default"), ("dequantize_per_channel", "default"))


def table() -> dict:
    """OpOverload -> decomposition for each of OPS torch defines (importing the
    library that defines them); empty when it is unavailable."""
    import torch

    try:
        from torch.ao.quantization.fx import _decomposed
    except ImportError:  # pragma: no cover - torch without the quantization package
        return {}
    kernels = {("quantize_per_tensor", "default"): _decomposed.quantize_per_tensor,
               ("quantize_per_tensor", "tensor"): _decomposed.quantize_per_tensor_tensor,
               ("dequantize_per_tensor", "default"): _decomposed.dequantize_per_tensor,
               ("dequantize_per_tensor", "tensor"): _decomposed.dequantize_per_tensor_tensor,
               ("quantize_per_channel", "default"): _decomposed.quantize_per_channel,
               ("dequantize_per_channel", "default"): _decomposed.dequantize_per_channel}
    ns = torch.ops.quantized_decomposed
    return {getattr(getattr(ns, op), overload): kernels[(op, overload)]
            for op, overload in OPS}
