"""Quantize a model with torchao the way the Vulkan lowering fuses it.

``quantize_for_vulkan(model, "int4")`` applies torchao 0.18's ``quantize_`` to the
model's ``nn.Linear`` layers; after ``torch.export``, ``to_backend`` turns each
quantized linear into one fused op (backend/passes/quantized_linear.py):

==========  ===============================================================  ==============================
scheme      torchao config                                                   fused op
==========  ===============================================================  ==============================
"int8"      ``Int8WeightOnlyConfig()`` (int8 per-channel weights)              ``aten._weight_int8pack_mm``
"int4"      ``IntxWeightOnlyConfig(torch.int4, PerGroup(group_size))``         ``et_vk.linear_q4gsw``
"8da4w"     ``Int8DynamicActivationIntxWeightConfig(torch.int4,                ``et_vk.linear_dq8ca_q4gsw``
            PerGroup(group_size))`` (per-token int8 activations)
==========  ===============================================================  ==============================

Symmetric weights throughout (torchao's default for these configs; zero points 0).
Needs torchao (``pip install 'vkdelegate[quant]'``).
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError

SCHEMES = ("int8", "int4", "8da4w")
GROUP_SIZES = (32, 64, 128, 256)


def _refuse_quantized(model) -> None:
    """A model whose linear weights torchao already replaced (a second
    ``quantize_for_vulkan``, or ``llm.lower(quantization=...)`` twice: both work in
    place) is refused by name; torchao itself fails deep in its dispatch."""
    import torch

    for fqn, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and isinstance(weight, torch.Tensor) and \
                type(weight.data) is not torch.Tensor:
            raise VkDelegateError(
                f"{fqn or 'the model'} is quantized already ({type(weight.data).__name__} "
                f"weight): quantization works in place, so use this model as it is (with "
                f"llm.lower: without quantization=), or quantize a fresh copy")


def quantize_for_vulkan(model, scheme: str, group_size: "int | None" = None,
                        filter_fn=None, embeddings: bool = False):
    """Quantize ``model``'s ``nn.Linear`` layers in place with torchao and return it.

    scheme: "int8", "int4" or "8da4w" (see the module docstring). group_size: input
    features per scale for int4 / 8da4w (32, 64, 128 or 256; None: 32); int8 is per
    output channel and takes none.
    Layers whose in_features is not a multiple of the group size stay in floating
    point, said with a warning that names them (a smaller group size quantizes
    them), as do those ``filter_fn(module, fqn)`` rejects (silently: the caller's
    choice).
    embeddings: also quantize fp32 ``nn.Embedding`` tables int4 group-wise
    (``IntxWeightOnlyConfig(torch.int4, PerGroup(group_size))``, fused into
    ``et_vk.embedding_q4gsw``; schemes "int4" and "8da4w" only).
    Layers that compute a linear map under another class are made ``nn.Linear``
    first (``plain_linears``: transformers' ``Conv1D`` of GPT-2, ``nn.Linear``
    subclasses with their own forward such as Falcon's), so they are quantized too.
    Raises VkDelegateError for an unknown scheme or group size, a group size given
    with "int8", a model quantized already, no linear layer the group size divides
    (every candidate would stay in floating point), or when torchao is not installed.
    """
    if scheme not in SCHEMES:
        raise VkDelegateError(f"quantization scheme {scheme!r}: expected one of "
                              f"{', '.join(SCHEMES)}")
    if scheme == "int8" and group_size is not None:
        raise VkDelegateError(f"group size {group_size}: int8 weights are quantized per "
                              f"output channel; group sizes apply to 'int4' and '8da4w'")
    if scheme != "int8":
        group_size = 32 if group_size is None else group_size
        if group_size not in GROUP_SIZES:
            raise VkDelegateError(f"group size {group_size!r}: expected one of the "
                                  f"ints {GROUP_SIZES}")
    try:
        import torch
        from torchao.quantization import (Int8DynamicActivationIntxWeightConfig,
                                          Int8WeightOnlyConfig, IntxWeightOnlyConfig,
                                          quantize_)
        from torchao.quantization.granularity import PerGroup
    except ImportError as exc:
        raise VkDelegateError(f"quantize_for_vulkan needs torchao "
                              f"(pip install 'vkdelegate[quant]'): {exc}") from exc
    if scheme == "int8":
        config = Int8WeightOnlyConfig()
    elif scheme == "int4":
        config = IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                      granularity=PerGroup(group_size))
    else:
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(group_size))
    _refuse_quantized(model)
    plain_linears(model)
    step = 1 if scheme == "int8" else group_size

    candidates = [(fqn, module) for fqn, module in model.named_modules()
                  if isinstance(module, torch.nn.Linear)
                  and (filter_fn is None or filter_fn(module, fqn))]
    _check_group_divides(candidates, step, scheme)
    chosen = {id(module) for _, module in candidates if module.in_features % step == 0}
    quantize_(model, config, filter_fn=lambda module, fqn: id(module) in chosen)
    if embeddings and scheme != "int8":
        table = IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                     granularity=PerGroup(group_size))
        quantize_(model, table, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Embedding)
                  and m.weight.dtype == torch.float32 and m.embedding_dim % group_size == 0
                  and (filter_fn is None or filter_fn(m, fqn)))
    _warn_unquantized_experts(model)
    return model


def _check_group_divides(candidates, step: int, scheme: str) -> None:
    """The linears (fqn, module) of ``candidates`` whose in_features ``step`` (the
    group size) does not divide stay in floating point: a warning names them, and
    when that is every candidate, VkDelegateError (the model would be lowered as
    quantized with nothing quantized)."""
    import warnings

    left = [(fqn, m.in_features) for fqn, m in candidates if m.in_features % step]
    if not left:
        return
    names = ", ".join(f"{fqn or 'the model'} (in_features {k})" for fqn, k in left[:3])
    more = f" and {len(left) - 3} more" if len(left) > 3 else ""
    if len(left) == len(candidates):
        fits = [g for g in GROUP_SIZES if any(m.in_features % g == 0 for _, m in candidates)]
        hint = (f"a group size of {' or '.join(map(str, fits))} quantizes some of them"
                if fits else f"none of the group sizes {GROUP_SIZES} divides them (int8, "
                             f"per channel, takes any size)")
        raise VkDelegateError(
            f"{scheme} with group size {step}: no linear layer's in_features is a "
            f"multiple of it ({names}{more}), so none would be quantized; {hint}")
    warnings.warn(f"{scheme} with group size {step}: {len(left)} of {len(candidates)} "
                  f"linear layers stay in floating point, their in_features not a "
                  f"multiple of it: {names}{more}; a smaller group size quantizes them",
                  stacklevel=_caller_level())


def _warn_unquantized_experts(model) -> None:
    """Weights of 3 or more dims outside convolutions (a mixture of experts' stacked
    expert matrices: transformers' Mixtral, Qwen-MoE, OLMoE keep each layer's experts
    as one [E, F, D] parameter) are not ``nn.Linear`` layers, so they stay in floating
    point, and in a real MoE model they are most of the weights: said with a warning,
    not silently."""
    import warnings

    import torch

    left = [(f"{mod_fqn}.{name}" if mod_fqn else name, p)
            for mod_fqn, module in model.named_modules()
            if not isinstance(module, torch.nn.modules.conv._ConvNd)  # convolutions: as
            for name, p in module.named_parameters(recurse=False)  # documented
            if p.dim() >= 3 and type(p.data) is torch.Tensor and p.is_floating_point()]
    if left:
        size = sum(p.numel() * p.element_size() for _, p in left)
        warnings.warn(f"quantize_for_vulkan quantizes nn.Linear layers only: {len(left)} "
                      f"weight(s) of 3 or more dims ({size / 2**20:.1f} MiB, e.g. "
                      f"{left[0][0]} {list(left[0][1].shape)}: stacked MoE experts) stay "
                      f"in {left[0][1].dtype}", stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside vkdelegate
    (the user's ``quantize_for_vulkan`` or ``vkdelegate.llm.lower`` call)."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
            package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def plain_linears(model) -> int:
    """Replace, in place, each layer of ``model`` that computes ``x @ W.T + b`` under a
    class other than ``nn.Linear`` by an ``nn.Linear`` (the same weight and bias
    Parameters where the layout allows, so tied weights stay tied); returns how many.

    Two kinds, each checked on a probe input before it is replaced (a layer whose
    output differs is left alone): an ``nn.Linear`` subclass with its own forward
    (transformers' ``FalconLinear`` computes ``x @ weight.T`` itself, which torchao's
    quantized weight does not support), and transformers' ``Conv1D`` (GPT-2, weight
    [in, out]: the nn.Linear gets its transpose, a new Parameter). torchao's
    ``quantize_`` quantizes ``nn.Linear`` layers only.
    """
    import torch
    from torch import nn

    replaced = 0
    for name, module in list(model.named_modules()):
        if not name:
            continue
        linear = _as_linear(module, torch, nn)
        if linear is None:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, linear)
        replaced += 1
    return replaced


def _as_linear(module, torch, nn):
    """The nn.Linear equal to ``module`` (see ``plain_linears``), or None."""
    kind = type(module)
    if kind is nn.Linear:
        return None
    if isinstance(module, nn.Linear):
        weight, bias, transpose = module.weight, module.bias, False
    elif kind.__name__ == "Conv1D" and kind.__module__.startswith("transformers") \
            and isinstance(getattr(module, "weight", None), torch.Tensor) \
            and module.weight.dim() == 2:
        weight, bias, transpose = module.weight, getattr(module, "bias", None), True
    else:
        return None
    if not weight.dtype.is_floating_point or weight.is_meta:
        return None
    out_features, in_features = weight.shape[::-1] if transpose else weight.shape
    linear = nn.Linear(in_features, out_features, bias=bias is not None,
                       device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach().t().contiguous(),
                                 requires_grad=weight.requires_grad) if transpose else weight
    if bias is not None:
        linear.bias = bias
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(3, in_features, generator=generator).to(weight.device, weight.dtype)
    with torch.no_grad():
        try:
            want = module(probe)
        except Exception:  # a layer that needs more than one tensor: not a linear
            return None
        got = linear(probe)
    tol = 1e-2 if weight.dtype in (torch.float16, torch.bfloat16) else 1e-5
    if not isinstance(want, torch.Tensor) or want.shape != got.shape \
            or not torch.allclose(want, got, rtol=tol, atol=tol):
        return None
    return linear.train(module.training)
