"""``vkdelegate.llm.lower(..., quantization=...)``: torchao quantizes the decoder's
linears in place, every quantized linear is one fused ExecuTorch op on Vulkan (no
dequantize chain in the report), the KV cache and the sampler stay on the device, and
greedy tokens equal HF ``generate`` of the SAME quantized model for 32 steps (the
dequantized weights are exact, so only summation order differs from eager)."""
import pytest
import torch

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import VOCAB, hf_greedy, make_model
from tests.vulkan_skip import vulkan_unavailable

FUSED = {"int8": "aten._weight_int8pack_mm.default", "int4": "et_vk.linear_q4gsw.default",
         "8da4w": "et_vk.linear_dq8ca_q4gsw.default"}
Q4_ADD = "vkdelegate.linear_q4gsw_add.default"
DQ8CA_ADD = "vkdelegate.linear_dq8ca_q4gsw_add.default"
DQ8CA_SWIGLU = "vkdelegate.linear_dq8ca_q4gsw_swiglu.default"
NORM_QPARAMS = "vkdelegate.rms_norm_choose_qparams.default"
DQ8CA_ROTARY = "vkdelegate.linear_dq8ca_q4gsw_rotary_cache.default"
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
    program = lower(model, 48, quantization=scheme,
                    group_size=None if scheme == "int8" else 32)
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
    # (o, down) fused with their add; no norm or rotary node left. 8da4w: the lm_head,
    # 2 x merged qkv with their rotary and cache writes, 2 x gate_up with its SwiGLU
    # chain, 2 x (o, down) fused with their add, and one qparams node per activation
    # the products read
    # (passes/quantized_linear.fuse_choose_qparams): the layers' two norms and the
    # final one each with it (rms_norm_choose_qparams: 5), o's and down's inputs (4);
    # none of torchao's amin / amax chains, no norm left.
    if scheme in ADDS:
        assert ops.count(FUSED[scheme]) == 0, sorted(set(ops))
        assert ops.count(NORMED[scheme]) == 1, sorted(set(ops))
        assert ops.count(ROTARY[scheme]) == 2, sorted(set(ops))
        assert "vkdelegate.rotary_index_put_pair.default" not in ops, sorted(set(ops))
        assert ops.count(SWIGLU[scheme]) == 2, sorted(set(ops))
        assert ops.count(ADDS[scheme]) == 4, sorted(set(ops))
        assert "et_vk.rms_norm.default" not in ops, sorted(set(ops))
    else:
        assert ops.count(FUSED[scheme]) == 1, sorted(set(ops))
        assert ops.count(DQ8CA_ADD) == 4 and ops.count(DQ8CA_SWIGLU) == 2, sorted(set(ops))
        assert ops.count(DQ8CA_ROTARY) == 2, sorted(set(ops))
        assert "vkdelegate.rotary_index_put_pair.default" not in ops, sorted(set(ops))
        assert ops.count("vkdelegate.choose_qparams_per_token.default") == 4, \
            sorted(set(ops))
        assert ops.count(NORM_QPARAMS) == 5, sorted(set(ops))
        assert not {"aten.amin.default", "aten.amax.default",
                    "et_vk.rms_norm.default"} & set(ops), sorted(set(ops))
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


def test_8da4w_float16_llama_greedy_matches_eager():
    """An fp16 decoder (what GPUs run): torchao's 8da4w activation chain is then fp16
    nodes, which lowered to the fused ops as the fp32 chain does (it stayed decomposed
    before: ~10 dispatches a linear), its int8 values eager's (the qparams and the
    quantization of x rounded to fp16 as eager rounds them); greedy tokens equal HF
    eager's fp16 ones for 32 steps."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("torchao")
    from vkdelegate.llm import generate, lower

    model = make_model("llama").half()
    program = lower(model, 48, quantization="8da4w", group_size=32)
    ops = [d.op for d in program.methods["decode"].report.decisions]
    assert ops.count(FUSED["8da4w"]) == 1 and ops.count(DQ8CA_ADD) == 4, sorted(set(ops))
    assert ops.count(DQ8CA_ROTARY) == 2, sorted(set(ops))
    assert ops.count(DQ8CA_SWIGLU) == 2, sorted(set(ops))
    assert ops.count("vkdelegate.choose_qparams_per_token.default") == 4, sorted(set(ops))
    assert ops.count(NORM_QPARAMS) == 5, sorted(set(ops))
    assert not {"aten.amin.default", "aten.amax.default", "aten.round.default",
                "et_vk.linear_q4gsw.default"} & set(ops), sorted(set(ops))
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(3)).tolist()
    assert generate(program, prompt, 32) == hf_greedy(model, prompt, 32)
    program.close()


def test_8da4w_under_the_reference_executor():
    """The reference executor (the lowered graph's ops as torch CPU kernels) runs every
    fused 8da4w op (the SwiGLU form's chain string was refused by its allow-list: a
    new user's trial) and gives HF's greedy tokens."""
    pytest.importorskip("torchao")
    from vkdelegate.llm import generate, lower

    model = make_model("llama")
    program = lower(model, 32, quantization="8da4w", group_size=32,
                    options={"executor": "reference"})
    try:
        ops = {d.op for d in program.methods["decode"].report.decisions}
        assert {DQ8CA_SWIGLU, DQ8CA_ADD, DQ8CA_ROTARY, NORM_QPARAMS} <= ops, sorted(ops)
        prompt = [3, 1, 4, 1, 5, 9]
        assert generate(program, prompt, 8) == hf_greedy(model, prompt, 8)
    finally:
        program.close()


def test_unknown_scheme_is_a_clear_error():
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.llm import lower

    pytest.importorskip("transformers")
    with pytest.raises(VkDelegateError, match="quantization scheme 'int3'"):
        lower(make_model("llama"), 16, quantization="int3")


def test_argument_mistakes_are_refused_before_the_slow_steps():
    """A model quantized already (lower(quantization=) works in place: a second call
    failed deep in torchao), group_size without a quantization (was ignored), and an
    end-of-sequence id outside the vocabulary (was refused after the whole lowering,
    naming a plan field)."""
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.llm import lower

    pytest.importorskip("torchao")
    model = make_model("llama")
    with pytest.raises(VkDelegateError, match="group_size applies to quantization "
                                              "'int4' and '8da4w'; no quantization"):
        lower(model, 16, group_size=64)
    # int8 is per output channel: a group size was silently ignored.
    with pytest.raises(VkDelegateError, match="group_size applies to quantization "
                                              "'int4' and '8da4w'; int8 weights are "
                                              "quantized per output channel"):
        lower(model, 16, quantization="int8", group_size=32)
    # Hidden 64, FFN 128: at group size 256 no linear would be quantized (the program
    # was lowered in float, "int4" in name only).
    with pytest.raises(VkDelegateError, match=r"int4 with group size 256: no linear "
                                              r"layer's in_features is a multiple of it "
                                              r"\(model.layers.0.self_attn.q_proj "
                                              r"\(in_features 64\).* none would be "
                                              r"quantized"):
        lower(model, 16, quantization="int4", group_size=256)
    assert type(model.lm_head.weight.data) is torch.Tensor  # nothing was changed
    model.generation_config.eos_token_id = VOCAB + 5
    with pytest.raises(VkDelegateError, match=rf"end-of-sequence id {VOCAB + 5} .* outside "
                                              rf"its vocabulary of {VOCAB}: set "
                                              rf"model.generation_config.eos_token_id"):
        lower(model, 16)
    model.generation_config.eos_token_id = None
    lower(model, 16, quantization="int8").close()
    with pytest.raises(VkDelegateError, match=r"model.layers.0.self_attn.q_proj is "
                                              r"quantized already \(Int8Tensor weight\)"):
        lower(model, 16, quantization="int4")


def test_the_cli_spelling_none_is_no_quantization(lowered):
    """lower(quantization="none") is lower() (vkdelegate lower-llm's --quantization
    none; it was refused in Python)."""
    from vkdelegate.llm import generate, lower

    model, program = lowered("llama")
    prompt = [3, 1, 4, 1, 5]
    again = lower(model, MAX_SEQ_LEN, quantization="none")
    try:
        assert generate(again, prompt, 6) == generate(program, prompt, 6)
    finally:
        again.close()


def test_unquantized_moe_experts_are_named_in_a_warning():
    """Mixtral's experts are [E, F, D] parameters, not nn.Linear layers: torchao leaves
    them in float32, which quantize_for_vulkan now says (the file barely shrank)."""
    pytest.importorskip("torchao")
    import transformers

    from vkdelegate.backend.quantize import quantize_for_vulkan

    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
        num_experts_per_tok=2)).eval()
    with pytest.warns(UserWarning, match=r"quantizes nn.Linear layers only: 2 weight\(s\) "
                                         r"of 3 or more dims .* model.layers.0.mlp.experts"
                      ) as caught:
        quantize_for_vulkan(model, "int8")
    ours = [w for w in caught if "quantizes nn.Linear layers only" in str(w.message)]
    assert ours[0].filename == __file__  # the user's call, not vkdelegate's code
    assert type(model.lm_head.weight.data).__name__ == "Int8Tensor"  # linears are


def test_what_is_not_a_causal_lm_is_refused_by_name():
    import transformers

    from vkdelegate.errors import VkDelegateError
    from vkdelegate.llm import lower

    with pytest.raises(VkDelegateError, match=r"takes a transformers \*ForCausalLM or a "
                                              r"vkdelegate.llm ReferenceDecoder, got str "
                                              r"'llama'"):
        lower("llama", 32)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64)).eval()
    with pytest.raises(VkDelegateError, match=r"BertModel cannot generate .* lower an "
                                              r"encoder with to_backend"):
        lower(bert, 32)
    if hasattr(transformers, "DeepseekV3ForCausalLM"):  # failed deep in export
        deepseek = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16, moe_intermediate_size=32)).eval()
        with pytest.raises(VkDelegateError, match=r"DeepseekV3ForCausalLM uses multi-head "
                                                  r"latent attention \(config.kv_lora_rank "
                                                  r"16"):
            lower(deepseek, 32)


def test_a_cache_past_a_learned_position_table_is_refused():
    """GPT-2's wpe has n_positions rows: a longer cache lowered, then failed
    mid-generation with an index out of range."""
    import transformers

    from vkdelegate.errors import VkDelegateError
    from vkdelegate.llm import lower

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=24, bos_token_id=0,
        eos_token_id=0)).eval()
    with pytest.raises(VkDelegateError, match=r"max_seq_len 32 is past the model's learned "
                                              r"position table transformer.wpe of 24 "
                                              r"positions: .* max_seq_len <= 24"):
        lower(model, 32)


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
