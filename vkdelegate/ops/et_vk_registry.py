"""What of ExecuTorch 1.5.1's Vulkan op registry vkdelegate does not run yet, and why.

ExecuTorch's VulkanPartitioner delegates the ops registered in
``executorch/backends/vulkan/op_registry.py`` (``vulkan_supported_ops``). ``NOT_RUN``
lists, by the name ET-VK's blobs give them (``OperatorCall.name``), every one of them
that has no OpSpec in our registry, with the reason; docs/OPS.md renders it (coverage.py)
and keeps only the ones still missing from the registry, so an op stops being listed
once a family registers it. Python-level ephemeral ops of that registry (getitem,
operator.add/sub/mul/floordiv and comparisons on SymInts, ``_assert_scalar``,
``sym_constrain_range_for_size``) never reach a blob's op chain and are left out.
tests/serialization/test_et_compat.py checks in ExecuTorch's environment that this
table plus our registry cover ET's registry. Torch-free.
"""
from __future__ import annotations

_Q = ("int8-activation (q8ta) kernel: only weight-only int8/int4 and 8da4w linears "
      "and the int4 embedding run (ops/families/quantized_linear.py)")
_QDQ = ("quantize/dequantize op in a blob: not registered (our lowering decomposes "
        "these to ATen elementwise ops, which run)")
_ROPE = ("rotary variant not registered (et_vk.apply_rotary_emb and the fused HF "
         "rotate_half form run)")

#: ET-VK op name -> why vkdelegate does not run it (yet).
NOT_RUN = {
    "aten.grid_sampler_2d.default": "no grid-sample kernel yet",
    "aten.max_pool2d.default": "torch.export gives max_pool2d_with_indices, which runs "
                               "(ET's fused form without indices is not registered)",
    "aten.pixel_shuffle.default": "no pixel-shuffle kernel yet",
    "aten.unfold_copy.default": "no unfold kernel yet",
    "et_vk.apply_rotary_emb_hf.default": _ROPE,
    "et_vk.apply_rotary_emb_interleaved.default": _ROPE,
    "et_vk.fused_ce.default": "training op (fused cross-entropy): out of scope",
    "et_vk.grid_priors.default": "detection-model custom op: no kernel yet",
    "et_vk.linear_dW.default": "training op (weight gradient): out of scope",
    "et_vk.linear_q4gsw_backward.default": "training op: out of scope",
    "et_vk.linear_q8ta_q8csw.default": _Q,
    "et_vk.linear_qcs4w.default": ("int4 per-channel linear: torchao makes no pattern for "
                                   "it; not registered"),
    "et_vk.q4gsw_requant.default": "int4 requantization: not registered",
    "et_vk.q8ta_add.default": _Q,
    "et_vk.q8ta_conv2d.default": _Q,
    "et_vk.q8ta_conv2d_dw.default": _Q,
    "et_vk.q8ta_conv2d_pw.default": _Q,
    "et_vk.q8ta_conv2d_transposed.default": _Q,
    "et_vk.q8ta_linear.default": _Q,
    "et_vk.q8ta_linear_gemv.default": _Q,
    "et_vk.q8ta_pixel_shuffle.default": _Q,
    "et_vk.q8ta_relu.default": _Q,
    "et_vk.adamw_step.default": "training op (optimizer step): out of scope",
    "llama.update_cache.default": ("writes its cache argument in place: our lowering "
                                   "runs it rewritten as a functional update; an ET blob "
                                   "holding it does not load yet"),
    "quantized_decomposed.choose_qparams.tensor": _QDQ,
    "quantized_decomposed.choose_qparams_per_token_asymmetric.default": _QDQ,
    "quantized_decomposed.dequantize_per_channel.default": _QDQ,
    "quantized_decomposed.dequantize_per_tensor.default": _QDQ,
    "quantized_decomposed.dequantize_per_tensor.tensor": _QDQ,
    "quantized_decomposed.dequantize_per_token.default": _QDQ,
    "quantized_decomposed.embedding_4bit.dtype": _QDQ,
    "quantized_decomposed.quantize_per_channel.default": _QDQ,
    "quantized_decomposed.quantize_per_tensor.default": _QDQ,
    "quantized_decomposed.quantize_per_tensor.tensor": _QDQ,
    "quantized_decomposed.quantize_per_token.default": _QDQ,
    "torchao.choose_qparams_affine.default": _QDQ,
    "torchao.dequantize_affine.default": _QDQ,
    "torchao.quantize_affine.default": _QDQ,
}


#: ET registry name -> the name ET-VK's blobs (and our registry) give the op, where
#: they differ: ET-VK registers its SymInt ops by bare name
#: (``VK_REGISTER_OP(sym_size.int, ...)``).
BLOB_NAMES = {"aten.sym_size.int": "sym_size.int"}


def blob_name(et_op: str) -> str:
    """The blob (and registry) name of the ET registry op ``et_op``."""
    return BLOB_NAMES.get(et_op, et_op)


def not_run(registered) -> list[tuple[str, str]]:
    """(op, reason) of ``NOT_RUN`` minus the ops in ``registered`` (op names), sorted."""
    return sorted((op, why) for op, why in NOT_RUN.items() if blob_name(op) not in registered)
