"""``vkdelegate.llm.lower(..., quantization=...)``: torchao quantizes the decoder's
linears in place, every quantized linear is one fused ExecuTorch op on Vulkan (no
dequantize chain in the report), the KV cache and the sampler stay on the device, and
greedy tokens equal HF ``generate`` of the SAME quantized model for 32 steps (the
dequantized weights are exact, so only summation order differs from eager)."""
import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy, make_model
from tests.vulkan_skip import vulkan_unavailable

FUSED = {"int8": "aten._weight_int8pack_mm.default", "int4": "et_vk.linear_q4gsw.default",
         "8da4w": "et_vk.linear_dq8ca_q4gsw.default"}
Q4_ADD = "vkdelegate.linear_q4gsw_add.default"
ADDS = {"int8": "vkdelegate.weight_int8pack_mm_add.default", "int4": Q4_ADD}
SWIGLU = {"int8": "vkdelegate.rms_norm_weight_int8pack_mm_swiglu.default",
          "int4": "vkdelegate.rms_norm_linear_q4gsw_swiglu.default"}
NORMED = {"int8": "vkdelegate.rms_norm_weight_int8pack_mm.default",
          "int4": "vkdelegate.rms_norm_linear_q4gsw.default"}
ROTARY = {"int8": "vkdelegate.rms_norm_weight_int8pack_mm_rotary_cache.default",
          "int4": "vkdelegate.rms_norm_linear_q4gsw_rotary_cache.default"}


@pytest.mark.parametrize("scheme", ["int8", "int4", "8da4w"])
def test_quantized_llama_greedy_matches_eager(scheme):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("torchao")
    from vkdelegate.llm import generate, lower

    model = make_model("llama")
    program = lower(model, 48, quantization=scheme, group_size=32)
    decode = program.methods["decode"].report
    assert not decode.cpu_nodes, str(decode)
    ops = [d.op for d in decode.decisions]
    # 2 layers x (q, k, v, o, gate, up, down) + the lm_head; int4 and int8 decode
    # merge q/k/v and gate/up (passes/merge_linears), fold the RMS norm before each
    # merged product and lm_head into it (passes/fuse_rms_norm_linear), their merged
    # gate/up runs the SwiGLU chain in its epilogue (passes/fuse_linear_swiglu) and
    # their o and down take the residual add (passes/fuse_linear_add), and each merged
    # q/k/v product takes the rotary embedding and the K/V cache writes
    # (passes/fuse_linear_rotary_cache): 2 x qkv with their norm, rotary and cache
    # writes, the lm_head with its norm, 2 x gate_up with its norm and SwiGLU, and 2 x
    # (o, down) fused with their add; no norm or rotary node left. 8da4w: none of these.
    if scheme in ADDS:
        assert ops.count(FUSED[scheme]) == 0, sorted(set(ops))
        assert ops.count(NORMED[scheme]) == 1, sorted(set(ops))
        assert ops.count(ROTARY[scheme]) == 2, sorted(set(ops))
        assert "vkdelegate.rotary_index_put_pair.default" not in ops, sorted(set(ops))
        assert ops.count(SWIGLU[scheme]) == 2, sorted(set(ops))
        assert ops.count(ADDS[scheme]) == 4, sorted(set(ops))
        assert "et_vk.rms_norm.default" not in ops, sorted(set(ops))
    else:
        assert ops.count(FUSED[scheme]) == 15, sorted(set(ops))
    if scheme == "int4":
        prefill = [d.op for d in program.methods["prefill"].report.decisions]
        # Prefill merges q/k/v and gate/up too (the same merged constants as decode's,
        # stored once): per layer the merged q/k/v with its norm, gate/up with its norm
        # and SwiGLU, o and down with their adds; the lm_head alone.
        assert prefill.count(FUSED[scheme]) == 1 and prefill.count(Q4_ADD) == 4
        assert prefill.count(NORMED[scheme]) == 2 and prefill.count(SWIGLU[scheme]) == 2
    assert "aten.mm.default" not in ops and "aten.linear.default" not in ops
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(3)).tolist()
    assert generate(program, prompt, 32) == hf_greedy(model, prompt, 32)
    program.close()


def test_unknown_scheme_is_a_clear_error():
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.llm import lower

    pytest.importorskip("transformers")
    with pytest.raises(VkDelegateError, match="quantization scheme 'int3'"):
        lower(make_model("llama"), 16, quantization="int3")


@pytest.mark.parametrize("kind", ["gpt2", "falcon"])
def test_linear_layers_of_other_classes_are_quantized(kind):
    """GPT-2's transformers Conv1D and Falcon's FalconLinear compute linear maps under
    other classes: torchao's quantize_ skipped the first (GPT-2 stayed fp32 but for
    its lm_head) and failed on the second (its permute of the quantized weight).
    quantize_for_vulkan makes them nn.Linear first; every decode linear is then a
    fused int4 op and greedy tokens equal HF's on the same quantized model."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("torchao")
    from vkdelegate.llm import generate, lower

    model = make_model(kind)
    program = lower(model, 48, quantization="int4", group_size=32)
    decode = program.methods["decode"].report
    assert not decode.cpu_nodes, str(decode)
    ops = [d.op for d in decode.decisions]
    assert not [op for op in ops if op in ("aten.mm.default", "aten.addmm.default",
                                           "aten.linear.default", "aten.matmul.default")]
    # Falcon: q/k/v and the MLP input read the same norm: merged (merge_linears).
    assert sum("q4gsw" in op for op in ops) >= 2 * 3 + 1, sorted(set(ops))
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(3)).tolist()
    assert generate(program, prompt, 32) == hf_greedy(model, prompt, 32)
    program.close()


def test_plain_linears_replaces_only_equal_layers():
    tf = pytest.importorskip("transformers")
    from torch import nn

    from vkdelegate.backend.quantize import plain_linears

    class Doubled(nn.Linear):  # not a linear map of its weight: left alone
        def forward(self, x):
            return 2 * super().forward(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1d = tf.pytorch_utils.Conv1D(6, 4)   # weight [4, 6]
            self.doubled = Doubled(6, 6)
            self.plain = nn.Linear(6, 4)

        def forward(self, x):
            return self.plain(self.doubled(self.conv1d(x)))

    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 4)
    want = block(x)
    plain = block.plain
    assert plain_linears(block) == 1
    assert type(block.conv1d) is nn.Linear and block.conv1d.weight.shape == (6, 4)
    assert type(block.doubled) is Doubled and block.plain is plain
    torch.testing.assert_close(block(x), want)
