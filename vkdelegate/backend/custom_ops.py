"""Custom (non-ATen) ops, each declared once: its name, torch schema, CPU kernel and
who may run it on the CPU.

Every other place reads this table: ``ensure_defined`` registers the torch library ops
(so that graphs, export and eager execution can hold them), ``allowed_ops.CUSTOM`` and
``allowed_ops.REFERENCE_ONLY`` are its names, ``glue_ops.resolve`` defines the op before
looking it up, the reference executor calls a delegate-only op's ``cpu`` kernel, and
lowering passes (``passes/fuse_conv_clamp``) take the op from here. The Vulkan kernel is
registered by its op family under the same name (``vkdelegate.ops.families``); adding a
custom op is one ``declare_custom_op`` call here plus that family.

Conventions: names are ``namespace.op.overload`` (as the registry and the VkGraph's
``OperatorCall`` spell them); schemas are torch.library schemas without the namespace
(ExecuTorch's Vulkan backend's, for ``et_vk``). This module imports torch only when an
op is defined or run, so that the torch-free CPU glue can read the names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from vkdelegate.errors import VkDelegateError


@dataclass(frozen=True)
class CustomOp:
    """One custom op.

    name: ``namespace.op.overload``. schema: torch.library schema (``op(Tensor x) ->
    Tensor``), or None for an op another library defines (ExecuTorch's
    ``dim_order_ops``), which torch then knows only where that library is installed.
    cpu: the CPU kernel (torch tensors in, torch tensor out), registered as
    CompositeExplicitAutograd, so it must only call ATen ops that have CPU and Meta
    kernels. glue: the CPU glue may call it (True) or only the reference executor may
    (False: a delegate-internal op such as a prepack). meta: a shape-only kernel for
    fake tensors (export), for an op whose CPU kernel reads tensor values (a sampler);
    with it, ``cpu`` is registered for CPU only and ``meta`` for Meta.
    """

    name: str
    schema: Optional[str]
    cpu: Optional[Callable]
    glue: bool = True
    meta: Optional[Callable] = None

    @property
    def namespace(self) -> str:
        return self.name.split(".")[0]

    @property
    def op(self) -> str:
        return self.name.split(".")[1]

    def overload(self):
        """The ``torch._ops.OpOverload`` (defining the op first)."""
        import torch

        ensure_defined()
        return getattr(getattr(getattr(torch.ops, self.namespace), self.op),
                       self.name.split(".")[2])


#: Every custom op by name, in declaration order.
CUSTOM_OPS: dict[str, CustomOp] = {}


def declare_custom_op(name: str, schema: Optional[str], cpu: Optional[Callable],
                      glue: bool = True, meta: Optional[Callable] = None) -> CustomOp:
    """Declare a custom op (see ``CustomOp``); VkDelegateError for a malformed name,
    a name declared twice or a schema whose op name differs from ``name``'s."""
    parts = name.split(".")
    if len(parts) != 3 or not all(p.isidentifier() for p in parts):
        raise VkDelegateError(f"custom op {name!r}: expected 'namespace.op.overload'")
    if name in CUSTOM_OPS:
        raise VkDelegateError(f"custom op {name!r} is declared twice")
    if schema is not None and schema.split("(")[0].split(".")[0] != parts[1]:
        raise VkDelegateError(f"custom op {name!r}: schema {schema[:40]!r}... names "
                              f"another op")
    CUSTOM_OPS[name] = op = CustomOp(name, schema, cpu, glue, meta)
    return op


def names(glue: bool) -> tuple:
    """Names of the custom ops the CPU glue may call (glue=True) or only the reference
    executor may (glue=False)."""
    return tuple(n for n, op in CUSTOM_OPS.items() if op.glue == glue)


_libraries: dict = {}  # namespace -> torch.library.Library we created


def ensure_defined() -> None:
    """Define each declared op with a schema in torch unless torch knows it already
    (an ExecuTorch install defines the ``et_vk`` ops itself); idempotent."""
    import torch

    for op in CUSTOM_OPS.values():
        if op.schema is None or hasattr(getattr(torch.ops, op.namespace), op.op):
            continue
        lib = _libraries.get(op.namespace)
        if lib is None:
            lib = _libraries[op.namespace] = torch.library.Library(op.namespace, "FRAGMENT")
        lib.define(op.schema)
        if op.meta is not None:
            lib.impl(op.op, op.cpu, "CPU")
            lib.impl(op.op, op.meta, "Meta")
        else:
            # CompositeExplicitAutograd serves CPU and Meta (fake tensors) alike.
            lib.impl(op.op, op.cpu, "CompositeExplicitAutograd")


# --- the declarations ------------------------------------------------------------

# The LLM ops (KV-cache writes, rotary embedding, the sampler) are declared in
# custom_ops_llm (it imports declare_custom_op from here, which is defined by now).
from vkdelegate.backend import custom_ops_llm  # noqa: E402,F401  (declares on import)


def _fused_elementwise(inputs, steps, scalars):
    """The chain's definition: each step's ATen op, in order, on the CPU (or on fake
    tensors at export)."""
    import torch

    from vkdelegate.kernels import elementwise_chain as chain

    values = chain.scalar_values(scalars)
    parsed = chain.parse(steps, len(inputs), len(values))
    chain.register_dtypes(parsed, [str(t.dtype).replace("torch.", "") for t in inputs])
    regs = list(inputs)
    for step in parsed:
        op = getattr(getattr(torch.ops.aten, step.op.split(".")[1]), step.op.split(".")[2])
        args = [regs[v] if k == "r" else (v if k == "str" else values[v])
                for k, v in step.args]
        if not isinstance(args[0], torch.Tensor):  # a scalar self: a 0-d tensor
            other = args[1]  # the tensor operand (parse: a step reads a register)
            args[0] = torch.tensor(args[0], dtype=other.dtype, device=other.device)
        if step.op == chain.CAST:
            regs.append(op(args[0], dtype=getattr(torch, args[1])))
        elif step.args[-1][0] == "str":
            regs.append(op(args[0], approximate=args[1]))
        elif step.op in ("aten.add.Tensor", "aten.sub.Tensor", "aten.add.Scalar",
                         "aten.sub.Scalar"):
            regs.append(op(args[0], args[1], alpha=args[2]))
        else:
            regs.append(op(*args))
    return regs[-1].contiguous()


#: A chain of float elementwise ops run as one dispatch (kernels/elementwise_chain.py
#: gives the step language; ``passes/fuse_elementwise`` writes it). The CPU kernel
#: runs each step's ATen op, so eager and the reference executor agree with the
#: unfused graph.
FUSED_ELEMENTWISE = declare_custom_op(
    "vkdelegate.fused_elementwise.default",
    "fused_elementwise(Tensor[] inputs, str steps, float[] scalars) -> Tensor",
    _fused_elementwise)


def _conv_with_clamp(x, weight, bias, stride, padding, dilation, transposed,
                     output_padding, groups, output_min=None, output_max=None):
    import torch

    out = torch.ops.aten.convolution.default(x, weight, bias, stride, padding, dilation,
                                             transposed, output_padding, groups)
    return torch.clamp(out, output_min, output_max)


#: ExecuTorch's fused convolution + clamp: ``aten.convolution``'s arguments, then
#: ``output_min`` and ``output_max`` (either may be None). ``passes/fuse_conv_clamp``
#: creates it from conv + relu/hardtanh/clamp.
CONV_WITH_CLAMP = declare_custom_op(
    "et_vk.conv_with_clamp.default",
    "conv_with_clamp(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, "
    "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, "
    "SymInt groups, Scalar? output_min=None, Scalar? output_max=None) -> Tensor",
    _conv_with_clamp)


def _padded_conv_with_clamp(x, weight, bias, stride, padding, dilation, transposed,
                            output_padding, groups, output_min, output_max, padding_end):
    import torch

    if transposed or x.dim() != 4:
        raise VkDelegateError("padded_conv_with_clamp: 2-D, non-transposed convolutions "
                              f"only (input of rank {x.dim()}, transposed={transposed})")
    top, left = padding
    bottom, right = padding_end
    x = torch.nn.functional.pad(x, (left, right, top, bottom))
    out = torch.ops.aten.convolution.default(x, weight, bias, stride, [0, 0], dilation,
                                             False, [0, 0], groups)
    if output_min is None and output_max is None:
        return out
    return torch.clamp(out, output_min, output_max)


#: A 2-D convolution of a zero-padded input with separate begin and end padding (the
#: asymmetric "SAME" padding of TensorFlow-style models, whose ``constant_pad_nd``
#: aten.convolution cannot express), and conv_with_clamp's optional clamp. Arguments:
#: conv_with_clamp's (``padding`` = [top, left], the padding before each spatial dim),
#: then ``padding_end`` = [bottom, right]. ``passes/fold_conv_padding`` creates it from
#: constant_pad_nd(value 0) -> convolution; our own op (ExecuTorch has none), only in
#: our lowering's blobs.
PADDED_CONV_WITH_CLAMP = declare_custom_op(
    "vkdelegate.padded_conv_with_clamp.default",
    "padded_conv_with_clamp(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, "
    "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, "
    "SymInt groups, Scalar? output_min, Scalar? output_max, SymInt[] padding_end) "
    "-> Tensor",
    _padded_conv_with_clamp)


def _conv_add(x, weight, bias, stride, padding, dilation, transposed, output_padding,
              groups, output_min, output_max, other):
    import torch

    out = torch.ops.aten.convolution.default(x, weight, bias, stride, padding, dilation,
                                             transposed, output_padding, groups)
    if output_min is not None or output_max is not None:
        out = torch.clamp(out, output_min, output_max)
    return out + other


#: A convolution (conv_with_clamp's arguments, clamp optional) whose result is added to
#: ``other``, a tensor of the output's shape and dtype: clamp(conv(x)) + other, the
#: residual connection of inverted-bottleneck blocks written in the convolution's
#: epilogue. ``passes/fuse_conv_add`` creates it from convolution -> aten.add.Tensor;
#: our own op (ExecuTorch has none), only in our lowering's blobs.
CONV_ADD = declare_custom_op(
    "vkdelegate.conv_add.default",
    "conv_add(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, "
    "SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, "
    "SymInt groups, Scalar? output_min, Scalar? output_max, Tensor other) -> Tensor",
    _conv_add)


def _rms_norm(x, weight, eps):
    import torch

    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps) * weight.float()).to(x.dtype)


#: ExecuTorch 1.5.1's fused RMS norm (backends/vulkan/custom_ops_lib.py): normalizes the
#: last dim, ``x.float() * rsqrt(mean(x.float() ** 2, -1, keepdim) + eps) *
#: weight.float()`` converted back to x's dtype. ``passes/fuse_rms_norm`` creates it
#: from HF Llama's decomposed RMSNorm; Vulkan: ``ops/families/norm.py``.
RMS_NORM = declare_custom_op(
    "et_vk.rms_norm.default", "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    _rms_norm)


def _rms_norm_linear(x, norm_weight, eps, weight, bias=None):
    import torch

    return torch.ops.aten.linear.default(RMS_NORM.overload()(x, norm_weight, eps), weight,
                                         bias)


#: A linear of an RMS-normalized input: ``aten.linear(et_vk.rms_norm(x, norm_weight,
#: eps), weight, bias)``, x [..., K] (fp32 or fp16), norm_weight [K], weight [N, K],
#: bias [N]?, all of x's dtype -> [..., N]. The CPU kernel is exactly those two ops (the
#: normalized row rounded to x's dtype, then the linear), so eager, the CPU glue and
#: the reference executor agree with the unfused pair. ``passes/fuse_rms_norm_linear``
#: creates it from et_vk.rms_norm -> aten.linear (an LLM layer's input norm and its
#: merged q/k/v or gate/up linear, the final norm and lm_head); our own op, only in our
#: lowering's blobs. Vulkan: ``ops/families/norm.py`` (the norm in the GEMV's
#: prologue, kernels/gemm.py's ``RmsPrologue``).
RMS_NORM_LINEAR = declare_custom_op(
    "vkdelegate.rms_norm_linear.default",
    "rms_norm_linear(Tensor x, Tensor norm_weight, float eps, Tensor weight, "
    "Tensor? bias=None) -> Tensor", _rms_norm_linear)


def _sdpa(q, k, v, attn_mask=None, scale=None):
    import torch

    if scale is None:
        scale = 1.0 / (q.size(-1) ** 0.5)
    attn = torch.matmul(q, k.transpose(-2, -1)) * scale
    if attn_mask is not None:
        attn = attn + attn_mask
    return torch.matmul(torch.softmax(attn, dim=-1), v)


#: ExecuTorch's fused attention (backends/vulkan/custom_ops_lib.py, 1.4 and 1.5):
#: q [B, H, L, E], k and v [B, H, S, *], an optional additive mask and scale; the CPU
#: kernel is ExecuTorch's reference (matmul, scale, add, softmax, matmul: a fully
#: masked row is NaN). Vulkan: ``ops/families/sdpa.py``.
SDPA = declare_custom_op(
    "et_vk.sdpa.default",
    "sdpa(Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None, float? scale=None) "
    "-> Tensor", _sdpa)


def _attention_reference(q, k, v, start_pos, attn_mask, is_causal, scale, window,
                         keys):
    """Attention of q [B, Hq, L, E] over k, v [B, Hk, S, *] in fp32 (softmax of all
    -inf: NaN), q's row i at absolute position start_pos + i; only keys j < ``keys``
    exist; is_causal: j <= start_pos + i; window > 0: j > start_pos + i - window;
    attn_mask: bool (True = attend) or additive, broadcasting to [L, S] (or more)."""
    import torch

    rep = q.size(-3) // k.size(-3)
    kf = k.float().repeat_interleave(rep, dim=-3)
    vf = v.float().repeat_interleave(rep, dim=-3)
    if scale is None:
        scale = 1.0 / (q.size(-1) ** 0.5)
    scores = torch.matmul(q.float(), kf.transpose(-2, -1)) * scale
    i = torch.arange(q.size(-2), device=q.device).unsqueeze(-1) + start_pos
    j = torch.arange(k.size(-2), device=q.device).unsqueeze(0)
    allowed = j < keys
    if is_causal:
        allowed = allowed & (j <= i)
    if window:
        allowed = allowed & (j > i - window)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            scores = scores + attn_mask.float()
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), vf).to(q.dtype)


def _custom_sdpa(query, key, value, start_pos, attn_mask=None, drpout_p=0.0,
                 is_causal=False, scale=None):
    s = key.size(1)
    keys = s if attn_mask is not None else start_pos + query.size(1)
    out = _attention_reference(query.transpose(1, 2), key.transpose(1, 2),
                               value.transpose(1, 2), start_pos, attn_mask, is_causal,
                               scale, 0, keys)
    return out.transpose(1, 2).contiguous()


#: ExecuTorch's LLM attention over a KV cache (extension/llm/custom_ops/op_sdpa_aot.cpp
#: and op_sdpa.cpp): query [B, L, Hq, E], key/value (the caches) [B, S, Hk, E], all
#: [batch, seq, heads, dim]; query row i is at position start_pos + i; without a mask
#: only the keys 0..start_pos+L-1 take part (``num_keys_for_causal_attention``), with
#: one (2-D [L, S], additive, as ET requires float) all S; is_causal masks keys past
#: start_pos + i; Hq a multiple of Hk (grouped-query). A fully masked row is NaN (a
#: plain softmax). Vulkan: ``ops/families/sdpa_kv.py``.
CUSTOM_SDPA = declare_custom_op(
    "llama.custom_sdpa.default",
    "custom_sdpa(Tensor query, Tensor key, Tensor value, SymInt start_pos, "
    "Tensor? attn_mask=None, float drpout_p=0.0, bool is_causal=False, "
    "float? scale=None) -> Tensor", _custom_sdpa)


def _sdpa_with_kv_cache(query, key, value, key_cache, value_cache, start_pos, seq_len,
                        attn_mask=None, drpout_p=0.0, is_causal=False, scale=None):
    key_cache[:, start_pos:start_pos + key.size(1)] = key
    value_cache[:, start_pos:start_pos + value.size(1)] = value
    s = key_cache.size(1)
    keys = s if attn_mask is not None else start_pos + seq_len
    out = _attention_reference(query.transpose(1, 2), key_cache.transpose(1, 2),
                               value_cache.transpose(1, 2), start_pos, attn_mask,
                               is_causal, scale, 0, keys)
    return out.transpose(1, 2).contiguous()


#: ExecuTorch's ``llama::sdpa_with_kv_cache``: writes key and value ([B, L, Hk, E]) into
#: key_cache and value_cache ([B, S, Hk, E], in place) at rows start_pos.., then
#: ``custom_sdpa(query, key_cache, value_cache, start_pos, ...)`` with seq_len queries
#: (ET-VK fuses custom_sdpa and two update_cache into it; it appears in ET-VK blobs).
#: It writes its arguments, so the CPU glue may not call it (glue=False: a node torch
#: exports holds it only functionalized); the reference executor runs it. Vulkan:
#: ``ops/families/sdpa_kv.py``.
SDPA_WITH_KV_CACHE = declare_custom_op(
    "llama.sdpa_with_kv_cache.default",
    "sdpa_with_kv_cache(Tensor query, Tensor key, Tensor value, Tensor(a!) key_cache, "
    "Tensor(b!) value_cache, SymInt start_pos, SymInt seq_len, Tensor? attn_mask=None, "
    "float drpout_p=0.0, bool is_causal=False, float? scale=None) -> Tensor",
    _sdpa_with_kv_cache, glue=False)


def _sliding_window_sdpa(query, key, value, window, start_pos=0, attn_mask=None,
                         scale=None):
    keys = key.size(-2)
    return _attention_reference(query, key, value, start_pos, attn_mask, True, scale,
                                window, keys)


#: Causal attention with a sliding window (Mistral, Gemma 2/3 local layers): query
#: [B, Hq, L, E] (ATen's layout), key/value [B, Hk, S, *], Hq a multiple of Hk; query row
#: i at position start_pos + i sees keys j with start_pos + i - window < j <= start_pos
#: + i; attn_mask (bool, True = attend, or additive) further restricts. A fully masked
#: row is NaN. vkdelegate's own op (``vkdelegate.sliding_window_sdpa``), for models that
#: state the window instead of building its mask. Vulkan: ``ops/families/sdpa_kv.py``.
SLIDING_WINDOW_SDPA = declare_custom_op(
    "vkdelegate.sliding_window_sdpa.default",
    "sliding_window_sdpa(Tensor query, Tensor key, Tensor value, int window, "
    "SymInt start_pos=0, Tensor? attn_mask=None, float? scale=None) -> Tensor",
    _sliding_window_sdpa)


def _sdpa_seq_first(query, key, value, attn_mask=None, is_causal=False, scale=None,
                    enable_gqa=False):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask,
        0.0, is_causal, scale=scale, enable_gqa=enable_gqa).transpose(1, 2).contiguous()


#: ATen's scaled_dot_product_attention (dropout 0) on the [B, L, H, E] layout: query
#: [B, L, Hq, E], key/value [B, S, Hk, E|Ev], out [B, L, Hq, Ev]; attn_mask, is_causal,
#: scale and enable_gqa as ATen's (the mask broadcasts to [B, Hq, L, S], ATen's own
#: layout). Made by ``passes/sdpa_seq_first`` from an ATen SDPA whose query, key and
#: value are transposes of [B, L, H, E] tensors and whose output is only transposed back
#: (HF encoders' heads), so that none of the four transposes is copied. Vulkan:
#: ``ops/families/sdpa.py`` (the attention kernels' SEQ_FIRST forms).
SDPA_SEQ_FIRST = declare_custom_op(
    "vkdelegate.sdpa_seq_first.default",
    "sdpa_seq_first(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
    "bool is_causal=False, float? scale=None, bool enable_gqa=False) -> Tensor",
    _sdpa_seq_first)


def _prepack(x):
    return x.clone()


#: ET-VK copies a constant into the GPU layout its consumer reads; on the CPU a copy.
#: Delegate-internal: only blobs hold it, so only the reference executor runs it.
PREPACK = declare_custom_op("et_vk.prepack.default", None, _prepack, glue=False)

#: ExecuTorch's dim-order copy, which ExecuTorch programs' CPU parts hold (torch knows
#: it only where executorch is installed; ``pte_kernels`` maps it for the .pte reader).
DIM_ORDER_COPY = declare_custom_op("dim_order_ops._to_dim_order_copy.default", None, None)
CLONE_DIM_ORDER = declare_custom_op("dim_order_ops._clone_dim_order.default", None, None)


# --- quantized linear (ExecuTorch 1.5's backends/vulkan/custom_ops_lib.py schemas and
# packing, patterns/weight_packing_utils.py's pack_4bit_weight_tensor) ---------------


def unpack_4bit(weights, in_features: int):
    """ET-VK's packed int4 weight (uint8 [N, ceil(K/8)*4], ``byte = (odd + 8) << 4 |
    (even + 8)``) -> int8 [N, in_features] values in [-8, 7]."""
    import torch

    w = weights.to(torch.int16)
    unpacked = torch.stack([w & 0x0F, (w >> 4) & 0x0F], dim=-1).reshape(w.shape[0], -1)
    return (unpacked - 8).to(torch.int8)[:, :in_features]


def _dequantize_q4gsw(weights, weight_scales, group_size: int, in_features: int, dtype):
    import torch

    q = unpack_4bit(weights, in_features).to(dtype)
    # [N, K / group_size]; ExecuTorch's blobs may pad N past the weight's.
    scales = weight_scales[:, :q.shape[0]].transpose(0, 1).to(dtype)
    return (q.view(q.shape[0], -1, group_size) * scales.unsqueeze(-1)).view(q.shape)


def _linear_q4gsw(x, weights, weight_scales, group_size, bias=None):
    import torch

    w = _dequantize_q4gsw(weights, weight_scales, group_size, x.shape[-1], x.dtype)
    return torch.nn.functional.linear(x, w, None if bias is None else bias[:w.shape[0]])


#: ExecuTorch's int4 group-wise symmetric weight-only linear: x [..., K] (fp32/fp16),
#: weights uint8 [N, ceil(K/8)*4] (two int4 values per byte, k even in the low nibble,
#: stored + 8), weight_scales [K / group_size, N] (x's dtype; zero points are 0), bias
#: [N]? -> [..., N]: ``linear(x, (q * scale).to(x.dtype), bias)``. Scales and bias may
#: be longer than N (ExecuTorch's serialized graphs pad them to a multiple of 4).
#: ``passes/quantized_linear`` creates it from torchao's dequantize -> linear; Vulkan:
#: ``ops/families/quantized_linear.py``.
LINEAR_Q4GSW = declare_custom_op(
    "et_vk.linear_q4gsw.default",
    "linear_q4gsw(Tensor self, Tensor weights, Tensor weight_scales, int group_size, "
    "Tensor? bias=None) -> Tensor", _linear_q4gsw)


def _linear_add(x, weight, bias, residual):
    import torch

    return residual + torch.nn.functional.linear(x, weight, bias)


#: A linear whose result is added to ``residual``: residual + linear(input, weight,
#: bias), input [..., K], weight [N, K], bias [N]?, residual of the output's shape
#: [..., N] and dtype (no broadcasting): the residual connection after an LLM layer's
#: o_proj / down_proj written in the linear's epilogue. The CPU kernel is eager's two
#: ops (the linear rounded to the dtype, then the add). ``passes/fuse_linear_add``
#: creates it from aten.linear -> aten.add.Tensor; our own op (ExecuTorch has none),
#: only in our lowering's blobs. Vulkan: ``kernels/residual.py``.
LINEAR_ADD = declare_custom_op(
    "vkdelegate.linear_add.default",
    "linear_add(Tensor input, Tensor weight, Tensor? bias, Tensor residual) -> Tensor",
    _linear_add)


def _swiglu_chain(op: str, steps):
    """VkDelegateError unless ``steps`` is one of kernels/swiglu.py's CHAINS."""
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.kernels import swiglu

    if steps not in swiglu.CHAINS:
        raise VkDelegateError(f"{op}: {steps!r} is not a SwiGLU chain of "
                              f"kernels/swiglu.py")


def _swiglu_halves(y, steps):
    """The chain ``steps`` over the halves of the merged product y [..., 2F] (each
    as the linear's output rounded it): r0 = y[..., :F], r1 = y[..., F:]."""
    f = y.shape[-1] // 2
    return _fused_elementwise([y[..., :f].contiguous(), y[..., f:].contiguous()], steps,
                              [])


def _linear_swiglu(x, weight, bias, steps):
    import torch

    _swiglu_chain("linear_swiglu", steps)
    return _swiglu_halves(torch.nn.functional.linear(x, weight, bias), steps)


#: A merged gate/up linear and the SwiGLU chain over its halves: with y = linear(input,
#: weight, bias), input [..., K], weight [2F, K], bias [2F]?, the output [..., F] is
#: the fused elementwise chain ``steps`` over (y[..., :F], y[..., F:]) (r0 the gate,
#: r1 up; one of kernels/swiglu.py's CHAINS). The CPU kernel is those two ops (the
#: linear rounded to its dtype, then the chain's steps), so eager, the CPU glue and the
#: reference executor agree with the unfused pair. ``passes/fuse_linear_swiglu``
#: creates it from the merged linear (passes/merge_linears), its two narrow_last parts
#: and the fused_elementwise chain reading them; ours, only in our blobs. Vulkan:
#: ``ops/families/linear.py`` (the chain in the GEMV's or linear.glsl's epilogue; after
#: the GEMM core's product as its own dispatches for several rows on GPUs).
LINEAR_SWIGLU = declare_custom_op(
    "vkdelegate.linear_swiglu.default",
    "linear_swiglu(Tensor input, Tensor weight, Tensor? bias, str steps) -> Tensor",
    _linear_swiglu)


def _rms_norm_linear_swiglu(x, norm_weight, eps, weight, bias, steps):
    return _linear_swiglu(RMS_NORM.overload()(x, norm_weight, eps), weight, bias, steps)


#: ``linear_swiglu(et_vk.rms_norm(x, norm_weight, eps), weight, bias, steps)``: an LLM
#: layer's post-attention norm, its merged gate/up linear and the SwiGLU chain, x
#: [..., K], norm_weight [K], weight [2F, K], bias [2F]? -> [..., F]. The CPU kernel is
#: those ops (the normalized row rounded to x's dtype, the linear, the chain).
#: ``passes/fuse_linear_swiglu`` creates it where the merged linear is a
#: ``vkdelegate.rms_norm_linear``; ours, only in our blobs. Vulkan:
#: ``ops/families/norm.py`` (gemv.glsl's RMS_NORM and SWIGLU together).
RMS_NORM_LINEAR_SWIGLU = declare_custom_op(
    "vkdelegate.rms_norm_linear_swiglu.default",
    "rms_norm_linear_swiglu(Tensor x, Tensor norm_weight, float eps, Tensor weight, "
    "Tensor? bias, str steps) -> Tensor", _rms_norm_linear_swiglu)


def _rotary_cache_of(y, cos, sin, cache, cache2, indices, q_sizes, kv_sizes):
    """rotary_index_put_pair's outputs for the merged q/k/v product y [.., N] of one
    row: q its first prod(q_sizes) elements viewed to q_sizes, k the next
    prod(kv_sizes) and v the rest viewed to kv_sizes each (the rotary_cache ops' CPU
    kernels after their product)."""
    import math

    y = y.reshape(-1)
    nq, nk = math.prod(q_sizes), math.prod(kv_sizes)
    return custom_ops_llm.ROTARY_INDEX_PUT_PAIR.cpu(
        y[:nq].view(q_sizes), y[nq:nq + nk].view(kv_sizes), cos, sin, cache, cache2,
        indices, y[nq + nk:].view(kv_sizes))


def _rotary_cache_meta(x, *args):
    """The rotary_cache ops' meta kernel: their last seven arguments are cos, sin,
    cache, cache2, indices, q_sizes and kv_sizes."""
    import torch

    cache, cache2, q_sizes = args[-5], args[-4], args[-2]
    return x.new_empty(q_sizes), torch.empty_like(cache), torch.empty_like(cache2)


def _rms_norm_linear_rotary_cache(x, norm_weight, eps, weight, bias, cos, sin, cache,
                                  cache2, indices, q_sizes, kv_sizes):
    return _rotary_cache_of(_rms_norm_linear(x, norm_weight, eps, weight, bias), cos, sin,
                            cache, cache2, indices, q_sizes, kv_sizes)


#: A decoder layer's attention input in one op: with y = rms_norm_linear(x,
#: norm_weight, eps, weight, bias) of ONE row (x [1, .., 1, K], weight [Nq + 2 Nk, K], the
#: merged q/k/v linear), q = y[:Nq] viewed to ``q_sizes`` (Nq = prod(q_sizes)), k and v
#: the next Nk elements each viewed to ``kv_sizes``, the outputs are
#: ``rotary_index_put_pair(q, k, cos, sin, cache, cache2, indices, v)``'s: (q', the K
#: cache with k' written at ``indices``, the V cache with v written there). The CPU
#: kernel is exactly those ops. ``passes/fuse_linear_rotary_cache`` creates it from a
#: merged ``vkdelegate.rms_norm_linear`` whose three narrow_last parts (through their
#: views) only a rotary_index_put_pair reads (a decode step); ours, only in our blobs.
#: Vulkan: ``ops/families/cache_update.py`` (gemv.glsl's RMS_NORM and ROTARY together:
#: the rotary pairs and cache writes in the GEMV's epilogue).
RMS_NORM_LINEAR_ROTARY_CACHE = declare_custom_op(
    "vkdelegate.rms_norm_linear_rotary_cache.default",
    "rms_norm_linear_rotary_cache(Tensor x, Tensor norm_weight, float eps, Tensor weight, "
    "Tensor? bias, Tensor cos, Tensor sin, Tensor cache, Tensor cache2, Tensor?[] indices, "
    "int[] q_sizes, int[] kv_sizes) -> (Tensor, Tensor, Tensor)",
    _rms_norm_linear_rotary_cache, meta=_rotary_cache_meta)


def _linear_q4gsw_add(x, weights, weight_scales, group_size, bias, residual):
    return residual + _linear_q4gsw(x, weights, weight_scales, group_size, bias)


#: ``linear_q4gsw`` (its arguments, bias required in the schema but may be None) whose
#: result is added to ``residual`` (the output's shape and dtype): residual +
#: linear_q4gsw(...), the int4 form of ``linear_add``. ``passes/fuse_linear_add``
#: creates it from et_vk.linear_q4gsw -> aten.add.Tensor; ours, only in our blobs.
LINEAR_Q4GSW_ADD = declare_custom_op(
    "vkdelegate.linear_q4gsw_add.default",
    "linear_q4gsw_add(Tensor self, Tensor weights, Tensor weight_scales, int group_size, "
    "Tensor? bias, Tensor residual) -> Tensor", _linear_q4gsw_add)


def _weight_int8pack_mm_add(x, weight, scales, residual):
    import torch

    return residual + torch.ops.aten._weight_int8pack_mm.default(x, weight, scales)


#: ``residual + aten._weight_int8pack_mm(self, mat2, scales)`` (self [M, K], int8 mat2
#: [N, K], scales [N]; residual [M, N] of the output's dtype), the int8 weight-only form
#: of ``linear_add``. ``passes/fuse_linear_add`` creates it; ours, only in our blobs.
WEIGHT_INT8PACK_MM_ADD = declare_custom_op(
    "vkdelegate.weight_int8pack_mm_add.default",
    "weight_int8pack_mm_add(Tensor self, Tensor mat2, Tensor scales, Tensor residual) "
    "-> Tensor", _weight_int8pack_mm_add)


def _linear_q4gsw_swiglu(x, weights, weight_scales, group_size, bias, steps):
    _swiglu_chain("linear_q4gsw_swiglu", steps)
    return _swiglu_halves(_linear_q4gsw(x, weights, weight_scales, group_size, bias), steps)


#: ``linear_q4gsw`` of a merged gate/up weight (its arguments: weights uint8 [2F, K/2],
#: weight_scales [K / group_size, >= 2F], bias [2F]?) and the SwiGLU chain ``steps``
#: over the halves of its output: the int4 form of ``linear_swiglu`` (output [..., F];
#: steps one of kernels/swiglu.py's CHAINS). The CPU kernel is the two ops (the linear
#: rounded to its dtype, then the chain). ``passes/fuse_linear_swiglu`` creates it
#: from a merged et_vk.linear_q4gsw (passes/merge_linears), its two narrow_last parts
#: and the fused_elementwise chain reading them; ours, only in our blobs. Vulkan:
#: ``ops/families/quantized_linear.py`` (the chain in the kernels' epilogue).
LINEAR_Q4GSW_SWIGLU = declare_custom_op(
    "vkdelegate.linear_q4gsw_swiglu.default",
    "linear_q4gsw_swiglu(Tensor self, Tensor weights, Tensor weight_scales, "
    "int group_size, Tensor? bias, str steps) -> Tensor", _linear_q4gsw_swiglu)


def _weight_int8pack_mm_swiglu(x, weight, scales, steps):
    import torch

    _swiglu_chain("weight_int8pack_mm_swiglu", steps)
    return _swiglu_halves(torch.ops.aten._weight_int8pack_mm.default(x, weight, scales),
                          steps)


#: ``aten._weight_int8pack_mm(self [M, K], mat2 int8 [2F, K], scales [2F])`` of a
#: merged gate/up weight and the SwiGLU chain ``steps`` over the halves of its output
#: [M, 2F] -> [M, F]: the int8 weight-only form of ``linear_swiglu``, made by
#: ``passes/fuse_linear_swiglu`` as linear_q4gsw_swiglu is; ours, only in our blobs.
WEIGHT_INT8PACK_MM_SWIGLU = declare_custom_op(
    "vkdelegate.weight_int8pack_mm_swiglu.default",
    "weight_int8pack_mm_swiglu(Tensor self, Tensor mat2, Tensor scales, str steps) "
    "-> Tensor", _weight_int8pack_mm_swiglu)


def _rms_norm_linear_q4gsw(x, norm_weight, eps, weights, weight_scales, group_size,
                           bias=None):
    return _linear_q4gsw(RMS_NORM.overload()(x, norm_weight, eps), weights, weight_scales,
                         group_size, bias)


#: ``linear_q4gsw(et_vk.rms_norm(x, norm_weight, eps), weights, weight_scales,
#: group_size, bias)``: x [..., K], norm_weight [K] (x's dtype), the int4 linear's
#: arguments -> [..., N]. The CPU kernel is exactly those two ops (the normalized row
#: rounded to x's dtype, then the int4 linear). ``passes/fuse_rms_norm_linear``
#: creates it from et_vk.rms_norm -> et_vk.linear_q4gsw (an int4 decoder's input norm
#: and its merged q/k/v product, the final norm and lm_head); ours, only in our blobs.
#: Vulkan: ``ops/families/quantized_linear.py`` (linear_qw_gemv.glsl's RMS_NORM).
RMS_NORM_LINEAR_Q4GSW = declare_custom_op(
    "vkdelegate.rms_norm_linear_q4gsw.default",
    "rms_norm_linear_q4gsw(Tensor x, Tensor norm_weight, float eps, Tensor weights, "
    "Tensor weight_scales, int group_size, Tensor? bias=None) -> Tensor",
    _rms_norm_linear_q4gsw)


def _rms_norm_linear_q4gsw_swiglu(x, norm_weight, eps, weights, weight_scales, group_size,
                                  bias, steps):
    return _linear_q4gsw_swiglu(RMS_NORM.overload()(x, norm_weight, eps), weights,
                                weight_scales, group_size, bias, steps)


#: ``linear_q4gsw_swiglu(et_vk.rms_norm(x, norm_weight, eps), weights, weight_scales,
#: group_size, bias, steps)``: an int4 decoder's post-attention norm, its merged
#: gate/up product and the SwiGLU chain -> [..., F]. The CPU kernel is those ops.
#: ``passes/fuse_linear_swiglu`` creates it where the merged product is a
#: ``vkdelegate.rms_norm_linear_q4gsw``; ours, only in our blobs.
RMS_NORM_LINEAR_Q4GSW_SWIGLU = declare_custom_op(
    "vkdelegate.rms_norm_linear_q4gsw_swiglu.default",
    "rms_norm_linear_q4gsw_swiglu(Tensor x, Tensor norm_weight, float eps, "
    "Tensor weights, Tensor weight_scales, int group_size, Tensor? bias, str steps) "
    "-> Tensor", _rms_norm_linear_q4gsw_swiglu)


def _rms_norm_weight_int8pack_mm(x, norm_weight, eps, weight, scales):
    import torch

    return torch.ops.aten._weight_int8pack_mm.default(
        RMS_NORM.overload()(x, norm_weight, eps), weight, scales)


#: ``aten._weight_int8pack_mm(et_vk.rms_norm(x, norm_weight, eps), mat2, scales)``: x
#: [M, K], norm_weight [K] (x's dtype), int8 mat2 [N, K], scales [N] -> [M, N]. The
#: CPU kernel is exactly those two ops. ``passes/fuse_rms_norm_linear`` creates it
#: from et_vk.rms_norm -> (a view to [M, K], torchao's) -> _weight_int8pack_mm, the
#: view moved before the norm; ours, only in our blobs.
RMS_NORM_WEIGHT_INT8PACK_MM = declare_custom_op(
    "vkdelegate.rms_norm_weight_int8pack_mm.default",
    "rms_norm_weight_int8pack_mm(Tensor x, Tensor norm_weight, float eps, Tensor mat2, "
    "Tensor scales) -> Tensor", _rms_norm_weight_int8pack_mm)


def _rms_norm_weight_int8pack_mm_swiglu(x, norm_weight, eps, weight, scales, steps):
    return _weight_int8pack_mm_swiglu(RMS_NORM.overload()(x, norm_weight, eps), weight,
                                      scales, steps)


#: ``weight_int8pack_mm_swiglu(et_vk.rms_norm(x, norm_weight, eps), mat2, scales,
#: steps)``: the int8 form of ``rms_norm_linear_q4gsw_swiglu`` -> [M, F].
RMS_NORM_WEIGHT_INT8PACK_MM_SWIGLU = declare_custom_op(
    "vkdelegate.rms_norm_weight_int8pack_mm_swiglu.default",
    "rms_norm_weight_int8pack_mm_swiglu(Tensor x, Tensor norm_weight, float eps, "
    "Tensor mat2, Tensor scales, str steps) -> Tensor",
    _rms_norm_weight_int8pack_mm_swiglu)


def _rms_norm_linear_q4gsw_rotary_cache(x, norm_weight, eps, weights, weight_scales,
                                        group_size, bias, cos, sin, cache, cache2, indices,
                                        q_sizes, kv_sizes):
    return _rotary_cache_of(
        _rms_norm_linear_q4gsw(x, norm_weight, eps, weights, weight_scales, group_size,
                               bias), cos, sin, cache, cache2, indices, q_sizes, kv_sizes)


#: The int4 weight-only form of ``rms_norm_linear_rotary_cache``: y =
#: rms_norm_linear_q4gsw(x, norm_weight, eps, weights, weight_scales, group_size, bias)
#: of ONE row (weights uint8 [Nq + 2 Nk, K/2], the merged q/k/v product), then
#: rotary_index_put_pair of its q, k and v parts (q_sizes, kv_sizes) -> (q', cache',
#: cache2'). The CPU kernel is exactly those ops. ``passes/fuse_linear_rotary_cache``
#: creates it where the merged product is a ``vkdelegate.rms_norm_linear_q4gsw``; ours,
#: only in our blobs. Vulkan: ``ops/families/quantized_linear.py`` (linear_qw_gemv.glsl's
#: RMS_NORM and ROTARY together).
RMS_NORM_LINEAR_Q4GSW_ROTARY_CACHE = declare_custom_op(
    "vkdelegate.rms_norm_linear_q4gsw_rotary_cache.default",
    "rms_norm_linear_q4gsw_rotary_cache(Tensor x, Tensor norm_weight, float eps, "
    "Tensor weights, Tensor weight_scales, int group_size, Tensor? bias, Tensor cos, "
    "Tensor sin, Tensor cache, Tensor cache2, Tensor?[] indices, int[] q_sizes, "
    "int[] kv_sizes) -> (Tensor, Tensor, Tensor)",
    _rms_norm_linear_q4gsw_rotary_cache, meta=_rotary_cache_meta)


def _rms_norm_weight_int8pack_mm_rotary_cache(x, norm_weight, eps, weight, scales, cos,
                                              sin, cache, cache2, indices, q_sizes,
                                              kv_sizes):
    return _rotary_cache_of(
        _rms_norm_weight_int8pack_mm(x, norm_weight, eps, weight, scales), cos, sin, cache,
        cache2, indices, q_sizes, kv_sizes)


#: The int8 weight-only form of ``rms_norm_linear_rotary_cache``: y =
#: rms_norm_weight_int8pack_mm(x [1, K], norm_weight, eps, mat2 int8 [Nq + 2 Nk, K],
#: scales), then rotary_index_put_pair of its q, k and v parts -> (q', cache', cache2').
#: The CPU kernel is exactly those ops; made by ``passes/fuse_linear_rotary_cache`` as
#: the int4 form is; ours, only in our blobs.
RMS_NORM_WEIGHT_INT8PACK_MM_ROTARY_CACHE = declare_custom_op(
    "vkdelegate.rms_norm_weight_int8pack_mm_rotary_cache.default",
    "rms_norm_weight_int8pack_mm_rotary_cache(Tensor x, Tensor norm_weight, float eps, "
    "Tensor mat2, Tensor scales, Tensor cos, Tensor sin, Tensor cache, Tensor cache2, "
    "Tensor?[] indices, int[] q_sizes, int[] kv_sizes) -> (Tensor, Tensor, Tensor)",
    _rms_norm_weight_int8pack_mm_rotary_cache, meta=_rotary_cache_meta)


def _linear_dq8ca_q4gsw(x, input_scales, input_zp, weights, weight_sums, weight_scales,
                        group_size, bias=None):
    import torch

    # The activation's per-row int8 quantization, as torchao's decomposed
    # quantize_affine + dequantize_affine computes it (round half to even).
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    s = input_scales.reshape(-1, 1).to(x.dtype)
    zp = input_zp.reshape(-1, 1).to(x.dtype)
    xq = torch.clamp(torch.round(x2 * (torch.reciprocal(s) * 1.0)) + zp, -128, 127)
    xdq = ((xq - zp) * s).reshape(shape)
    return _linear_q4gsw(xdq, weights, weight_scales, group_size, bias)


#: ExecuTorch's dynamic int8 activation x int4 group-wise weight linear (torchao's
#: 8da4w): x [..., K] fp32 or fp16, input_scales [M] of x's dtype and input_zp [M]
#: int8 (per row of x, from the graph's choose_qparams; x quantized in its dtype as
#: torchao's fp16 chain rounds it), weights / weight_scales / group_size / bias as
#: linear_q4gsw, weight_sums int32 [K / group_size, ceil(N/8)*8] (per group sums of the
#: int4 values, for the zero-point correction of integer dot products). The CPU kernel
#: quantizes x as torchao does (ExecuTorch's own reference skips that step).
LINEAR_DQ8CA_Q4GSW = declare_custom_op(
    "et_vk.linear_dq8ca_q4gsw.default",
    "linear_dq8ca_q4gsw(Tensor input, Tensor input_scales, Tensor input_zp, "
    "Tensor weights, Tensor weight_sums, Tensor weight_scales, int group_size, "
    "Tensor? bias=None) -> Tensor", _linear_dq8ca_q4gsw)


#: The arguments of the fused 8da4w ops' schemas up to the bias (linear_dq8ca_q4gsw's).
_DQ8CA_ARGS = ("Tensor input, Tensor input_scales, Tensor input_zp, Tensor weights, "
               "Tensor weight_sums, Tensor weight_scales, int group_size, Tensor? bias")


def _linear_dq8ca_q4gsw_add(x, input_scales, input_zp, weights, weight_sums, weight_scales,
                            group_size, bias, residual):
    return residual + _linear_dq8ca_q4gsw(x, input_scales, input_zp, weights, weight_sums,
                                          weight_scales, group_size, bias)


#: ``linear_dq8ca_q4gsw`` (its arguments, bias required in the schema but may be None)
#: whose result is added to ``residual`` (the output's shape and dtype): the 8da4w
#: form of ``linear_q4gsw_add``, made by ``passes/fuse_linear_add`` from
#: et_vk.linear_dq8ca_q4gsw -> aten.add.Tensor; ours, only in our blobs.
LINEAR_DQ8CA_Q4GSW_ADD = declare_custom_op(
    "vkdelegate.linear_dq8ca_q4gsw_add.default",
    f"linear_dq8ca_q4gsw_add({_DQ8CA_ARGS}, Tensor residual) -> Tensor",
    _linear_dq8ca_q4gsw_add)


def _linear_dq8ca_q4gsw_swiglu(x, input_scales, input_zp, weights, weight_sums,
                               weight_scales, group_size, bias, steps):
    _swiglu_chain("linear_dq8ca_q4gsw_swiglu", steps)
    return _swiglu_halves(_linear_dq8ca_q4gsw(x, input_scales, input_zp, weights,
                                              weight_sums, weight_scales, group_size,
                                              bias), steps)


#: ``linear_dq8ca_q4gsw`` of a merged gate/up weight (its arguments: weights uint8
#: [2F, K/2], weight_sums and weight_scales of >= 2F columns, bias [2F]?) and the
#: SwiGLU chain ``steps`` over the halves of its output: the 8da4w form of
#: ``linear_q4gsw_swiglu`` (output [..., F]). The CPU kernel is the two ops (the
#: product rounded to its dtype, then the chain). ``passes/fuse_linear_swiglu`` creates
#: it from a merged et_vk.linear_dq8ca_q4gsw; ours, only in our blobs.
LINEAR_DQ8CA_Q4GSW_SWIGLU = declare_custom_op(
    "vkdelegate.linear_dq8ca_q4gsw_swiglu.default",
    f"linear_dq8ca_q4gsw_swiglu({_DQ8CA_ARGS}, str steps) -> Tensor",
    _linear_dq8ca_q4gsw_swiglu)


def _linear_dq8ca_q4gsw_rotary_cache(x, input_scales, input_zp, weights, weight_sums,
                                     weight_scales, group_size, bias, cos, sin, cache,
                                     cache2, indices, q_sizes, kv_sizes):
    return _rotary_cache_of(
        _linear_dq8ca_q4gsw(x, input_scales, input_zp, weights, weight_sums, weight_scales,
                            group_size, bias), cos, sin, cache, cache2, indices, q_sizes,
        kv_sizes)


#: The 8da4w form of ``rms_norm_linear_q4gsw_rotary_cache`` (without the norm, which
#: 8da4w's activation quantization reads): y = linear_dq8ca_q4gsw(...) of ONE row
#: (weights uint8 [Nq + 2 Nk, K/2], the merged q/k/v product), then
#: rotary_index_put_pair of its q, k and v parts (q_sizes, kv_sizes) -> (q', cache',
#: cache2'). The CPU kernel is exactly those ops. ``passes/fuse_linear_rotary_cache``
#: creates it; ours, only in our blobs. Vulkan: ``ops/families/quantized_linear.py``
#: (linear_qw_gemv.glsl's ROTARY epilogue).
LINEAR_DQ8CA_Q4GSW_ROTARY_CACHE = declare_custom_op(
    "vkdelegate.linear_dq8ca_q4gsw_rotary_cache.default",
    f"linear_dq8ca_q4gsw_rotary_cache({_DQ8CA_ARGS}, Tensor cos, Tensor sin, "
    "Tensor cache, Tensor cache2, Tensor?[] indices, int[] q_sizes, int[] kv_sizes) -> "
    "(Tensor, Tensor, Tensor)",
    _linear_dq8ca_q4gsw_rotary_cache, meta=_rotary_cache_meta)


#: torchao's eps for a per-token activation scale, the smallest a scale may be: the
#: activation dtype's least normal number (torch.finfo(dtype).tiny; FLT_MIN for fp32).
QPARAMS_EPS = {"float32": 1.1754943508222875e-38, "float16": 6.103515625e-05}


def _choose_qparams_per_token(x):
    """torchao 0.18's per-token asymmetric int8 qparams of an fp32 or fp16 x (8da4w's
    activation, choose_qparams_affine as it decomposes), op for op in x's dtype."""
    import torch

    eps = QPARAMS_EPS[str(x.dtype).removeprefix("torch.")]
    lo, hi = torch.amin(x, [-1]), torch.amax(x, [-1])
    lo = torch.minimum(lo, torch.full_like(lo, 0))
    hi = torch.maximum(hi, torch.full_like(hi, 0))
    scale = torch.clamp((hi - lo) / 255.0, eps)
    zp = torch.clamp(-128 - torch.round(lo / scale), -128, 127).to(torch.int8)
    return scale, zp


def _choose_qparams_meta(x):
    """Shapes only (fake tensors with symbolic sizes, which full_like refuses)."""
    import torch

    return x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1], dtype=torch.int8)


#: The per-token (row) asymmetric int8 quantization parameters of 8da4w's activation:
#: x [..., K] fp32 or fp16 (K >= 1) -> (scale [...] of x's dtype, zero point int8
#: [...]), bit for bit the nodes torchao's ``choose_qparams_affine``
#: (MappingType.ASYMMETRIC, int8, per token, eps QPARAMS_EPS[x's dtype]) decomposes
#: into, each rounded to x's dtype as eager rounds it: min(amin, 0), max(amax, 0),
#: their difference / 255 clamped to eps, -128 - round(min / scale) clamped to
#: [-128, 127].
#: ``passes/quantized_linear.fuse_choose_qparams`` creates it from those nodes (about
#: eight dispatches a row of x before, one after); Vulkan:
#: ``ops/families/choose_qparams.py``.
CHOOSE_QPARAMS_PER_TOKEN = declare_custom_op(
    "vkdelegate.choose_qparams_per_token.default",
    "choose_qparams_per_token(Tensor x) -> (Tensor, Tensor)", _choose_qparams_per_token,
    meta=_choose_qparams_meta)


def _rms_norm_choose_qparams(x, weight, eps):
    y = _rms_norm(x, weight, eps)
    return (y,) + _choose_qparams_per_token(y)


def _rms_norm_choose_qparams_meta(x, weight, eps):
    return (x.new_empty(x.shape),) + _choose_qparams_meta(x)


#: An RMS norm and the per-token int8 qparams of its output: (y, scale, zp) with y =
#: et_vk.rms_norm(x, weight, eps) (x [..., K] fp32 or fp16, weight [K] of x's dtype)
#: and (scale, zp) = choose_qparams_per_token(y), the qparams of y as stored. The CPU
#: kernel is exactly those two ops. ``passes/quantized_linear.fuse_choose_qparams``
#: creates it where an 8da4w product's activation is a norm that only 8da4w products
#: read (a Llama layer's two norms and the final one): one dispatch instead of two.
#: Vulkan: ``ops/families/choose_qparams.py``; ours, only in our blobs.
RMS_NORM_CHOOSE_QPARAMS = declare_custom_op(
    "vkdelegate.rms_norm_choose_qparams.default",
    "rms_norm_choose_qparams(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)",
    _rms_norm_choose_qparams, meta=_rms_norm_choose_qparams_meta)


def _embedding_q4gsw(weight, weight_scales, group_size, indices, is_linear_weight=False):
    import torch

    w = weight.to(torch.int16)
    high, low = ((w >> 4) & 0x0F) - 8, (w & 0x0F) - 8
    pair = [low, high] if is_linear_weight else [high, low]
    q = torch.stack(pair, dim=-1).reshape(weight.shape[0], -1)
    groups = weight_scales.shape[1]
    table = (q.reshape(weight.shape[0], groups, group_size).float()
             * weight_scales.float().unsqueeze(-1)).reshape(weight.shape[0], -1)
    return torch.nn.functional.embedding(indices, table)


#: ExecuTorch's int4 group-wise embedding: weight uint8 [V, D/2] (two int4 per byte,
#: + 8; k even in the HIGH nibble, or in the low one as linear_q4gsw packs it with
#: is_linear_weight), weight_scales [V, D / group_size], indices (int) -> fp32
#: [*indices.shape, D] (ExecuTorch computes the table in float whatever the scales'
#: dtype). ``passes/quantized_embedding`` creates it from torchao's dequantize ->
#: embedding; Vulkan: ``ops/families/quantized_embedding.py``.
EMBEDDING_Q4GSW = declare_custom_op(
    "et_vk.embedding_q4gsw.default",
    "embedding_q4gsw(Tensor weight, Tensor weight_scales, int group_size, Tensor indices, "
    "bool is_linear_weight=False) -> Tensor", _embedding_q4gsw)
