"""Tiny HF causal LMs (seeded random weights) and a tiny vision tower for tests/llm.

Every model has 2 layers, hidden size 64 and a vocabulary of 256, so that a 64-token
generation runs in seconds on lavapipe. No weights are downloaded: the configs are
the real HF architectures with random weights.
"""
import torch
from torch import nn

VOCAB = 256


def _common(**extra):
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, eos_token_id=None, bos_token_id=None,
                pad_token_id=None, **extra)


def make_model(kind: str, seed: int = 0):
    """A HF *ForCausalLM of ``kind`` (llama, qwen2, qwen3, mistral, gemma, gemma2,
    gemma3, opt, gpt2, falcon, or one of ``MORE_KINDS``), eval."""
    import transformers as tf

    torch.manual_seed(seed)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**_common()))
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**_common()))
    elif kind == "mistral":  # a window smaller than prompt + new tokens
        model = tf.MistralForCausalLM(tf.MistralConfig(**_common(sliding_window=16)))
    elif kind == "gemma":
        model = tf.GemmaForCausalLM(tf.GemmaConfig(**_common(head_dim=16)))
    elif kind == "gemma2":
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**_common(
            head_dim=16, sliding_window=16, final_logit_softcapping=30.0,
            attn_logit_softcapping=50.0, query_pre_attn_scalar=16)))
    elif kind == "qwen3":  # per-head RMS norms of q and k
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**_common(head_dim=16)))
    elif kind == "gemma3":  # local (sliding 8) and global layers, q/k norms
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**_common(
            head_dim=16, sliding_window=8, query_pre_attn_scalar=16)))
    elif kind == "opt":  # learned positions from .item() of the cache length (CPU glue)
        model = tf.OPTForCausalLM(tf.OPTConfig(
            vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=64,
            bos_token_id=None, eos_token_id=None, pad_token_id=1))
    elif kind == "gpt2":  # transformers' Conv1D layers, learned positions
        model = tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512,
            bos_token_id=None, eos_token_id=None))
    elif kind == "falcon":  # FalconLinear: an nn.Linear subclass computing x @ W.T
        model = tf.FalconForCausalLM(tf.FalconConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            bos_token_id=None, eos_token_id=None))
    elif kind in _MORE:
        model = _MORE[kind](tf)
    else:
        raise ValueError(kind)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def _wide(**extra):
    """_common with weights drawn wide enough (std 0.25) that greedy tokens vary."""
    return _common(initializer_range=0.25, **extra)


def _gpt(**extra):
    return dict(vocab_size=VOCAB, bos_token_id=None, eos_token_id=None,
                initializer_range=0.25, **extra)


#: More families (tests/llm/test_hf_greedy.py), each with what sets it apart.
_MORE = {
    # GPT-Neo: local layers (window 16) masked by the key length (decoder's override)
    "gpt_neo": lambda tf: tf.GPTNeoForCausalLM(tf.GPTNeoConfig(**_gpt(
        hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
        window_size=16, max_position_embeddings=512))),
    # BioGPT: OPT's learned positions (the dead .item() of the cache length)
    "biogpt": lambda tf: tf.BioGptForCausalLM(tf.BioGptConfig(**_gpt(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=512, pad_token_id=1))),
    # Phi: partial rotary (half of each head), parallel attention and MLP
    "phi": lambda tf: tf.PhiForCausalLM(tf.PhiConfig(**_wide(partial_rotary_factor=0.5))),
    "phi3": lambda tf: tf.Phi3ForCausalLM(tf.Phi3Config(**_wide())),  # fused qkv, gate_up
    # Phi-3 with LongRoPE (Phi-3-mini-128k, Phi-3.5): short / long rotary factors switched
    # past original_max_position_embeddings 16, where HF generate recomputes the cache
    "phi3_longrope": lambda tf: tf.Phi3ForCausalLM(tf.Phi3Config(**_wide(
        original_max_position_embeddings=16, rope_scaling={
            "type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}))),
    "gpt_neox": lambda tf: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**{  # rotary_pct 0.25
        k: v for k, v in _wide(rotary_pct=0.25).items() if k != "num_key_value_heads"})),
    "gptj": lambda tf: tf.GPTJForCausalLM(tf.GPTJConfig(**_gpt(  # interleaved rotary
        n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=512))),
    "bloom": lambda tf: tf.BloomForCausalLM(tf.BloomConfig(**_gpt(  # ALiBi, no positions
        hidden_size=64, n_layer=2, n_head=4))),
    "olmo2": lambda tf: tf.Olmo2ForCausalLM(tf.Olmo2Config(**_wide())),  # q/k norms, post-norms
    "cohere": lambda tf: tf.CohereForCausalLM(tf.CohereConfig(**_wide())),  # LayerNorm, parallel
    "starcoder2": lambda tf: tf.Starcoder2ForCausalLM(tf.Starcoder2Config(**_wide())),
    "granite": lambda tf: tf.GraniteForCausalLM(tf.GraniteConfig(**_wide(  # multipliers
        embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0,
        attention_multiplier=0.2))),
    "stablelm": lambda tf: tf.StableLmForCausalLM(tf.StableLmConfig(**_wide(
        partial_rotary_factor=0.25))),
    # MoE: 4 experts, 2 per token (decoder's dense experts; the router's topk on Vulkan)
    "mixtral": lambda tf: tf.MixtralForCausalLM(tf.MixtralConfig(**_wide(
        num_local_experts=4, num_experts_per_tok=2))),
    "qwen2_moe": lambda tf: tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(**_wide(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64))),
    "qwen3_moe": lambda tf: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**_wide(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64))),
}
MORE_KINDS = tuple(_MORE)


def hf_greedy(model, prompt: list, n: int) -> list:
    """HF ``generate`` (eager, greedy) new tokens. The attention mask is given: without
    it generate masks every prompt token equal to the config's pad_token_id (0 here)
    as padding, which a program fed the same ids does not do."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


class TinyVision(nn.Module):
    """A vision tower with a pooler: patches (3 x 4 x 4 pixels) of a grid of up to
    4 x 4 patches are embedded, mixed by an MLP and averaged into 4 soft tokens, one
    per 2 x 2 block of patches; a block no patch fell into is padded (mask false).

    forward(pixel_values [1, P, 48], pixel_position_ids int64[1, P, 2] (row, col))
    -> (hidden [1, 4, 32], mask bool[1, 4]).
    """

    patch_dim = 48
    max_patches = 16
    slots = 4

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.embed = nn.Linear(self.patch_dim, hidden)
        self.row = nn.Embedding(4, hidden)
        self.col = nn.Embedding(4, hidden)
        self.mlp = nn.Linear(hidden, hidden)

    def forward(self, pixel_values, pixel_position_ids):
        rows, cols = pixel_position_ids[..., 0], pixel_position_ids[..., 1]
        h = self.embed(pixel_values) + self.row(rows) + self.col(cols)
        h = h + self.mlp(torch.nn.functional.gelu(h))
        slot = (rows // 2) * 2 + cols // 2
        onehot = (slot.unsqueeze(-1) == torch.arange(self.slots)).to(h.dtype)
        count = onehot.sum(1)
        pooled = onehot.transpose(1, 2) @ h / count.clamp(min=1.0).unsqueeze(-1)
        return pooled, count > 0


def norm_linear_dispatches(prologue: bool = True) -> int:
    """Dispatches of one one-row ``vkdelegate.rms_norm_linear`` or
    ``rms_norm_linear_swiglu`` (an RMS norm fused into the linear reading it) on the
    default Vulkan device: with compile option rms_norm_prologue (on by default) 1
    where the product takes the GEMV path, which folds the norm in (GPUs); else 2: the
    norm's dispatch, then the linear (also CPU drivers such as lavapipe: no GEMV
    path)."""
    from vkdelegate.kernels.gemm_tiles import tiles_for
    from vkdelegate.runtime import default_device

    tiles = tiles_for(default_device().info.type)
    return 1 if prologue and tiles is not None and tiles.gemv else 2


def rotary_cache_dispatches(prologue: bool = True) -> int:
    """Dispatches of one ``vkdelegate.rms_norm_linear_rotary_cache`` (a decode layer's
    input norm, merged q/k/v linear, rotary embedding and K/V cache writes) on the
    default Vulkan device: 1 where the product takes the GEMV path (GPUs: the rotary
    and the cache writes in its epilogue, the norm folded in), 2 there with compile
    option rms_norm_prologue off (the norm's dispatch first); else 3, the unfused
    pair's: the norm, the product (also CPU drivers such as lavapipe), then
    rotary_scatter_pair."""
    from vkdelegate.kernels.gemm_tiles import tiles_for
    from vkdelegate.runtime import default_device

    tiles = tiles_for(default_device().info.type)
    gemv = tiles is not None and tiles.gemv
    return norm_linear_dispatches(prologue) + (0 if gemv else 1)


def quantized_norm_dispatches(prologue: bool = True) -> int:
    """Dispatches of one one-row int4 / int8 product with an RMS norm fused into it
    (``vkdelegate.rms_norm_linear_q4gsw``, ``rms_norm_weight_int8pack_mm`` and their
    SwiGLU forms) on the default Vulkan device: with compile option rms_norm_prologue
    (on by default) 1 where the product's form folds the norm in (the vectorized
    GEMV's RMS_NORM on GPUs, linear_qw_texel.glsl's on CPU drivers such as lavapipe:
    quantized_linear.folds_rms_norm); else 2: the norm's dispatch, then the product."""
    from vkdelegate.ops.families.quantized_linear import folds_rms_norm
    from vkdelegate.runtime import default_device

    return 1 if prologue and folds_rms_norm(default_device(), 1) else 2


def quantized_rotary_cache_dispatches(prologue: bool = True, vector: "bool | None" = None) -> int:
    """Dispatches of one int4 / int8 ``*_rotary_cache`` op (a quantized decode layer's
    input norm, merged q/k/v product, rotary embedding and K/V cache writes:
    ``vkdelegate.rms_norm_linear_q4gsw_rotary_cache``,
    ``rms_norm_weight_int8pack_mm_rotary_cache``) on the default Vulkan device, or with
    the vectorized GEMV forced (``vector`` True): where the product takes
    linear_qw_gemv.glsl (GPUs: quantized_linear.vector_form) 1, the rotary and the cache
    writes in its epilogue (2 with compile option rms_norm_prologue off: the norm's
    dispatch first); elsewhere the product's dispatches (``quantized_norm_dispatches``)
    and rotary_scatter_pair's."""
    from vkdelegate.ops.families.quantized_linear import use_gemv
    from vkdelegate.runtime import default_device

    if vector is None:
        vector = use_gemv(default_device().info, 1)
    if vector:
        return 1 if prologue else 2
    return quantized_norm_dispatches(prologue) + 1
