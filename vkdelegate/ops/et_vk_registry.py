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

_Q = "quantized (int8/int4) kernels: no quantized op family yet"
_LLM = "LLM custom op: the fused SDPA / KV-cache work has not landed"

#: ET-VK op name -> why vkdelegate does not run it (yet).
NOT_RUN = {
    "aten._weight_int8pack_mm.default": _Q,
    "aten.copy.default": "ET delegates only the no-op copy (same dtype and shape); "
                         "not registered yet",
    "aten.grid_sampler_2d.default": "no grid-sample kernel yet",
    "aten.max_pool2d.default": "torch.export gives max_pool2d_with_indices, which runs "
                               "(ET's fused form without indices is not registered)",
    "aten.pixel_shuffle.default": "no pixel-shuffle kernel yet",
    "aten.unfold_copy.default": "no unfold kernel yet",
    "et_vk.apply_rotary_emb.default": _LLM,
    "et_vk.apply_rotary_emb_hf.default": _LLM,
    "et_vk.apply_rotary_emb_interleaved.default": _LLM,
    "et_vk.embedding_q4gsw.default": _Q,
    "et_vk.fused_ce.default": "training op (fused cross-entropy): out of scope",
    "et_vk.grid_priors.default": "detection-model custom op: no kernel yet",
    "et_vk.linear_dW.default": "training op (weight gradient): out of scope",
    "et_vk.linear_dq8ca_q4gsw.default": _Q,
    "et_vk.linear_q4gsw.default": _Q,
    "et_vk.linear_q4gsw_backward.default": "training op: out of scope",
    "et_vk.linear_q8ta_q8csw.default": _Q,
    "et_vk.linear_qcs4w.default": _Q,
    "et_vk.q4gsw_requant.default": _Q,
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
    "llama.custom_sdpa.default": _LLM,
    "llama.sdpa_with_kv_cache.default": _LLM,
    "llama.update_cache.default": _LLM,
    "quantized_decomposed.choose_qparams.tensor": _Q,
    "quantized_decomposed.choose_qparams_per_token_asymmetric.default": _Q,
    "quantized_decomposed.dequantize_per_channel.default": _Q,
    "quantized_decomposed.dequantize_per_tensor.default": _Q,
    "quantized_decomposed.dequantize_per_tensor.tensor": _Q,
    "quantized_decomposed.dequantize_per_token.default": _Q,
    "quantized_decomposed.embedding_4bit.dtype": _Q,
    "quantized_decomposed.quantize_per_channel.default": _Q,
    "quantized_decomposed.quantize_per_tensor.default": _Q,
    "quantized_decomposed.quantize_per_tensor.tensor": _Q,
    "quantized_decomposed.quantize_per_token.default": _Q,
    "torchao.choose_qparams_affine.default": _Q,
    "torchao.dequantize_affine.default": _Q,
    "torchao.quantize_affine.default": _Q,
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
