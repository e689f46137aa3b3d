"""A tiny seeded HF Llama decoder quantized with torchao (each scheme), every linear
fused and on Vulkan: logits against eager execution of the same quantized model, and
32 greedy tokens equal to eager's (the whole sequence re-run each step through a
program exported with a dynamic sequence length: no KV cache needed).

Tolerance: dequantized weights are exact (the lowering checks them bit for bit), so
fp32 logits differ by summation order only: 1e-5 on logits of magnitude ~0.5. 8da4w
also rounds activations on the GPU, with test_quantized_linear's margin of one
activation moved to its neighbouring int8 quantum (~1e-3 of an output at most here):
2e-3.
"""
import collections

import pytest
import torch

from tests.ops.harness import delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.quantize import quantize_for_vulkan
from tests.torch_version import needs_torch_213

pytest.importorskip("torchao")
transformers = pytest.importorskip("transformers")
pytestmark = [needs_torch_213,  # a dynamic seq: torch 2.11 refuses its own guard
              pytest.mark.skipif(vulkan_unavailable() is not None,
                                 reason=vulkan_unavailable() or "")]

FUSED = {"int8": "aten._weight_int8pack_mm.default", "int4": "et_vk.linear_q4gsw.default",
         "8da4w": "et_vk.linear_dq8ca_q4gsw.default"}
# The final norm, read by lm_head alone, folded into it (passes/fuse_rms_norm_linear).
NORMED = {"int8": "vkdelegate.rms_norm_weight_int8pack_mm.default",
          "int4": "vkdelegate.rms_norm_linear_q4gsw.default"}


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _decoder(scheme, embeddings=False):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    return _Logits(quantize_for_vulkan(model, scheme,
                                       group_size=None if scheme == "int8" else 32,
                                       embeddings=embeddings)).eval()


@pytest.mark.parametrize("scheme,embeddings", [("int8", False), ("int4", True),
                                               ("8da4w", False)])
def test_quantized_decoder_greedy(scheme, embeddings):
    # int4 also quantizes the token embedding table (et_vk.embedding_q4gsw).
    module = _decoder(scheme, embeddings)
    torch.manual_seed(1)
    prompt = torch.randint(0, 96, (1, 8))
    seq = torch.export.Dim("seq", min=2, max=48)
    program = to_backend(torch.export.export(module, (prompt,), dynamic_shapes=({1: seq},)),
                         VulkanPartitioner())
    assert not program.report.cpu_nodes, str(program.report)
    ops = [name for name, _ in delegated_nodes(program)]
    # Every linear fused, on Vulkan. int4 / int8: each layer's q/k/v and gate/up merged
    # (passes/merge_linears; several rows: a narrow_last per part, none for a gate/up
    # that takes its SwiGLU chain), every RMS norm folded into the one product that
    # reads it (the merged q/k/v, the merged gate/up, lm_head: fuse_rms_norm_linear),
    # int4's gate/up with its SwiGLU chain and its o_proj / down_proj with their
    # residual add (fuse_linear_swiglu, fuse_linear_add). 8da4w: the merges (2 x qkv +
    # lm_head; a narrow_last per q/k/v part: 3 a layer), gate_up with its SwiGLU chain,
    # o_proj / down_proj with their residual add, and one per-token qparams node per
    # activation the products read (fuse_choose_qparams), the norms' with the norm
    # (rms_norm_choose_qparams).
    counts = collections.Counter(ops)
    expected = {
        "int8": {NORMED["int8"]: 5, FUSED["int8"]: 4, "vkdelegate.narrow_last.default": 10,
                 "et_vk.rms_norm.default": 0},
        "int4": {NORMED["int4"]: 3, "vkdelegate.rms_norm_linear_q4gsw_swiglu.default": 2,
                 "vkdelegate.linear_q4gsw_add.default": 4, FUSED["int4"]: 0,
                 "vkdelegate.narrow_last.default": 6, "et_vk.rms_norm.default": 0},
        "8da4w": {FUSED["8da4w"]: 3, "vkdelegate.linear_dq8ca_q4gsw_add.default": 4,
                  "vkdelegate.linear_dq8ca_q4gsw_swiglu.default": 2,
                  "et_vk.rms_norm.default": 0,
                  "vkdelegate.rms_norm_choose_qparams.default": 2 * 2 + 1,
                  "vkdelegate.narrow_last.default": 6,
                  "vkdelegate.choose_qparams_per_token.default": 4, "aten.amin.default": 0},
    }[scheme]
    assert {k: counts[k] for k in expected} == expected, ops
    assert ops.count("et_vk.embedding_q4gsw.default") == int(embeddings)
    with torch.no_grad():
        tol = 2e-3 if scheme == "8da4w" else 1e-5
        torch.testing.assert_close(program(prompt), module(prompt), rtol=tol, atol=tol)
        ours = theirs = prompt
        for _ in range(32):
            ours = torch.cat([ours, program(ours)[:, -1].argmax(-1, keepdim=True)], 1)
            theirs = torch.cat([theirs, module(theirs)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(ours, theirs), (ours[0, 8:].tolist(), theirs[0, 8:].tolist())
