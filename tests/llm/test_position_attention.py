"""HFDecoder's mask-free attention (decoder.uses_position_attention: the model runs with
"vkdelegate_sdpa", each layer's attention vkdelegate.sdpa_at at start_pos): which models
use it, that the model's own attention implementation is restored, that the exported
decode has no mask and one sdpa_at per layer, and on the CPU (the op's reference) that
prefill and decode logits equal HF eager's full forward, for sliding windows shorter
than the sequence: Mistral (config.sliding_window), Qwen2 with sliding layers and
Gemma 3 text (layer_types). Runs without Vulkan."""
import pytest
import torch

from tests.llm.models import VOCAB, _common, make_model
from vkdelegate.llm import decoder as dec

tf = pytest.importorskip("transformers")


def _windowed(kind: str):
    torch.manual_seed(0)
    if kind == "qwen2_sliding":  # layer 0 full, layer 1 sliding (max_window_layers 1)
        config = tf.Qwen2Config(**_common(use_sliding_window=True, sliding_window=5,
                                          max_window_layers=1))
        return tf.Qwen2ForCausalLM(config).eval()
    if kind == "gemma3_text":
        config = tf.Gemma3TextConfig(**_common(head_dim=16, sliding_window=5,
                                               query_pre_attn_scalar=16,
                                               layer_types=["sliding_attention",
                                                            "full_attention"]))
        return tf.Gemma3ForCausalLM(config).eval()
    return make_model(kind)


@pytest.mark.parametrize("kind,used", [("llama", True), ("qwen2", True), ("mistral", True),
                                       ("gemma", True), ("gemma2", False),
                                       ("qwen2_sliding", True), ("gemma3_text", True)])
def test_which_models_use_it(kind, used):
    model = _windowed(kind)
    assert dec.uses_position_attention(model) is used
    model.train()
    assert not dec.uses_position_attention(model)


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2_sliding", "gemma3_text",
                                  "gemma2"])
def test_logits_equal_hf_eager(kind):
    model = _windowed(kind)
    model.config._attn_implementation = "eager"
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    d = dec.HFDecoder(model, 32)
    before = model.config._attn_implementation
    with torch.no_grad():
        got = d.logits(d.embed(tokens[:, :9]), torch.tensor([0]))  # prefill 0..8
        steps = [d.logits(d.embed(tokens[:, t:t + 1]), torch.tensor([t]))
                 for t in range(9, 12)]  # decode 9, 10, 11: past the window of 5
        want = model(tokens).logits[0]
    assert model.config._attn_implementation == before
    torch.testing.assert_close(got, want[8], rtol=1e-4, atol=1e-4)
    for t, step in zip(range(9, 12), steps):
        torch.testing.assert_close(step, want[t], rtol=1e-4, atol=1e-4)


def test_decode_export_has_no_mask():
    from vkdelegate.llm.lower import export_methods

    model = make_model("llama")
    programs = export_methods(model, 32)
    ops = [str(n.target) for n in programs["decode_next"].graph.nodes
           if n.op == "call_function"]
    assert sum("vkdelegate.sdpa_at" in op for op in ops) == model.config.num_hidden_layers
    assert not [op for op in ops if "scaled_dot_product" in op or "aten.le" in op], ops
    assert model.config._attn_implementation == "sdpa"


def test_attention_outside_the_decoder_is_refused():
    from vkdelegate.errors import VkDelegateError

    q = torch.zeros(1, 2, 1, 8)
    with pytest.raises(VkDelegateError, match="only inside HFDecoder.logits"):
        dec._attention(torch.nn.Module(), q, q, q, None)


def test_model_not_dispatching_attention_keeps_its_own():
    """A model whose attention modules choose their own eager / sdpa code instead of
    looking it up in ALL_ATTENTION_FUNCTIONS (Falcon before transformers' refactor)
    would run its eager path without a mask under ATTENTION: it keeps its own."""
    pytest.importorskip("transformers")
    import torch

    from vkdelegate.llm.decoder import uses_position_attention

    model = make_model("llama")
    assert uses_position_attention(model)
    attention = type(model.model.layers[0].self_attn)

    class OwnAttention(attention):
        def forward(self, *args, **kwargs):  # no ALL_ATTENTION_FUNCTIONS lookup
            return torch.nn.Module.__call__(self, *args, **kwargs)

    for layer in model.model.layers:
        layer.self_attn.__class__ = OwnAttention
    assert not uses_position_attention(model)
