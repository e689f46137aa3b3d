"""Greedy tokens of a lowered program equal HF ``generate`` (eager, same model, same
prompt) for 64 new tokens, on tiny Llama, Qwen2, Qwen3 (q/k norms), Mistral (sliding
window 16, shorter than the 72-token sequence), Gemma (sqrt(hidden) embedding scale),
Gemma2 (sliding window, soft-capping), Gemma3 (local and global layers) and OPT
configs with seeded random weights, on Vulkan, every node of every method on Vulkan;
and for 24 tokens on GPT-Neo, BioGPT, Phi, Phi-3, GPT-NeoX, GPT-J, BLOOM, OLMo 2,
Cohere, StarCoder2, Granite, StableLM, Mixtral, Qwen2-MoE and Qwen3-MoE (all on
Vulkan); Phi-3 with LongRoPE for 40 tokens across its short / long switch."""
import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy
from tests.torch_version import TORCH
from vkdelegate.llm import generate


def _prompt(seed: int, n: int = 8) -> list:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _assert_all_on_vulkan(program):
    for method in ("embed_text", "prefill", "decode", "decode_next"):
        report = program.methods[method].report
        assert not report.cpu_nodes, f"{method}: {report}"
    assert program.runner("decode_next").repeat_blocker() is None


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2",
                                  "gemma3", "opt"])
def test_greedy_matches_hf_generate(lowered, kind):
    model, program = lowered(kind)
    _assert_all_on_vulkan(program)  # OPT: its dead .item() of the cache length is gone
    prompt = _prompt(1)
    expected = hf_greedy(model, prompt, 64)
    assert generate(program, prompt, 64) == expected
    # Again on the same program: the cache of the first run is overwritten, not
    # read (start_pos 0, causal mask), so the tokens do not change.
    assert generate(program, torch.tensor(prompt), 64) == expected


#: BLOOM on the GPU machine (torch 2.11, transformers 5.17): export stops at
#: GuardOnDataDependentSymNode ``80 - u0 > 0`` in masking_utils.prepare_padding_mask
#: (BLOOM builds its padding mask from the cache length); torch 2.13 exports it.
_BLOOM = pytest.param("bloom", marks=pytest.mark.skipif(
    TORCH < (2, 13), reason=f"torch {torch.__version__}'s export guards on BLOOM's "
                            f"data-dependent padding-mask length (needs torch 2.13)"))


@pytest.mark.parametrize("kind", ["gpt_neo", "biogpt", "phi", "phi3", "gpt_neox", "gptj",
                                  _BLOOM, "olmo2", "cohere", "starcoder2", "granite",
                                  "stablelm"])
def test_more_families_match_hf_fully_delegated(lowered, kind):
    """tests/llm/models.py's other families: every node on Vulkan, 24 greedy tokens
    (32 positions: past GPT-Neo's local window of 16) equal to HF generate. GPT-Neo's
    local layers masked by the key length, wrong on the static cache (tokens differed
    from the first; decoder._attention_overrides); BioGPT's learned positions kept
    OPT's CPU .item() (lower.drop_dead_length_reads)."""
    model, program = lowered(kind)
    _assert_all_on_vulkan(program)
    prompt = _prompt(1)
    assert generate(program, prompt, 24) == hf_greedy(model, prompt, 24)


def _transformers_version() -> tuple:
    import transformers

    return tuple(int(p) for p in transformers.__version__.split(".")[:2])


#: The GPU machine's transformers 5.17 (with torch 2.11): its LongRoPE frequency update
#: branches on a data-dependent value, and export stops there (GuardOnDataDependentSymNode
#: Eq(u0, 1) in longrope_frequency_update; an H100 lease, 2026-12-06). transformers 5.25
#: exports it.
_LONGROPE = pytest.mark.skipif(
    _transformers_version() < (5, 25),
    reason="this transformers' LongRoPE update does not export (needs transformers 5.25)")


@_LONGROPE
@pytest.mark.parametrize("chunk", [16, 1])
@pytest.mark.parametrize("prompt_len", [8, 20])
def test_phi3_longrope_matches_hf_across_the_switch(lowered, prompt_len, chunk):
    """Phi-3 with LongRoPE (original_max_position_embeddings 16, a freshly built
    model): lowers (its rotary module assigns ``long_inv_freq`` on the first forward,
    which export turned into a fake tensor that decode's export refused:
    decoder.init_lazy_rotary_state), every node on Vulkan (``torch.max(position_ids)
    + 1``: the int64 max on the device), and its greedy tokens equal HF generate for
    40 tokens past position 16: a prompt of 8 crosses it while decoding, where HF's
    Phi-3 recomputes the cache with the long factors and so does generate (a prefill
    of the whole sequence, ``recompute_cache_at``), on the device loop and the
    per-token one; a prompt of 20 is past it from the prefill."""
    model, program = lowered("phi3_longrope")
    _assert_all_on_vulkan(program)
    assert program.methods["prefill"].plan["llm"]["recompute_cache_at"] == 16
    prompt = _prompt(3, prompt_len)
    assert generate(program, prompt, 40, decode_chunk=chunk) == hf_greedy(model, prompt, 40)


@_LONGROPE
def test_phi3_longrope_session_turns_match_hf(lowered):
    """A Session on Phi-3 LongRoPE: each turn's tokens are HF generate's on the whole
    conversation. A turn that crosses position 16 while decoding recomputes with the
    earlier turns' ids; a conversation past 16 after a cache of at most 16 positions
    (short factors) is prefilled whole, one within the same side reuses the cache."""
    from vkdelegate.llm.session import Session

    model, program = lowered("phi3_longrope")
    session = Session(program)
    conv = _prompt(4, 6)
    out = session.generate(conv, 5)  # cache: 10 positions, short factors
    assert out == hf_greedy(model, conv, 5)
    conv2 = conv + out + [3, 4]  # 13 ids: reuses 10, crosses 16 while decoding
    out2 = session.generate(conv2, 12)
    assert (out2, session.reused) == (hf_greedy(model, conv2, 12), 10)
    conv3 = conv2 + out2 + [5]  # 26 ids after 24 cached (long): reused
    out3 = session.generate(conv3, 4)
    assert (out3, session.reused) == (hf_greedy(model, conv3, 4), 24)
    session.reset()
    out = session.generate(conv, 3)  # cache: 8 positions, short factors
    conv4 = conv + out + list(range(10, 20))  # 19 ids: past 16, prefilled whole
    out4 = session.generate(conv4, 4)
    assert (out4, session.reused) == (hf_greedy(model, conv4, 4), 0)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_matches_hf_with_dense_experts(lowered, kind):
    """MoE layers (4 experts, 2 per token; Qwen2-MoE's shared expert too) export with
    every expert on every token (decoder._dense_experts): transformers' default
    experts ("grouped_mm") call torch.histc, which lower refused. The router's topk
    runs on Vulkan (ops/families/topk.py; it and its getitems were the CPU nodes), so
    every node is on Vulkan and decode_next loops on the device."""
    model, program = lowered(kind)
    _assert_all_on_vulkan(program)
    prompt = _prompt(1)
    assert generate(program, prompt, 24) == hf_greedy(model, prompt, 24)


def test_embed_text_is_what_the_decoder_consumes(lowered):
    """Gemma scales its embeddings by sqrt(hidden): embed_text includes it."""
    model, program = lowered("gemma")
    tokens = torch.tensor([_prompt(2)])
    got = program.embed_text(tokens)
    want = model.get_input_embeddings()(tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = torch.nn.functional.embedding(tokens, model.get_input_embeddings().weight)
    torch.testing.assert_close(want, plain * 64 ** 0.5, rtol=1e-5, atol=1e-5)


def test_eos_stops_and_is_returned(lowered):
    model, program = lowered("llama")
    prompt = _prompt(1)
    expected = hf_greedy(model, prompt, 12)
    eos = expected[5]
    first = expected.index(eos)
    assert generate(program, prompt, 12, eos_token_id=eos) == expected[:first + 1]


def test_from_pretrained_local_folder(tmp_path):
    """A checkpoint folder written by save_pretrained lowers and generates like HF."""
    from tests.llm.conftest import MAX_SEQ_LEN
    from tests.llm.models import make_model
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate import VkDelegateError
    from vkdelegate.llm import from_pretrained

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    model = make_model("qwen2", seed=9)
    model.save_pretrained(tmp_path / "ckpt")
    program = from_pretrained(str(tmp_path / "ckpt"), MAX_SEQ_LEN)
    prompt = _prompt(4)
    assert generate(program, prompt, 16) == hf_greedy(model, prompt, 16)
    with pytest.raises(VkDelegateError, match="no config.json"):
        from_pretrained(str(tmp_path), MAX_SEQ_LEN)


def test_generate_builds_before_its_clock_starts(lowered, monkeypatch):
    """timings measure the calls alone: generate builds every delegate first (the
    CLI's printed rates counted shader compilation as prefill: a new user's trial)."""
    _, program = lowered("llama")
    order = []
    build, embed = program.build, program.embed_text
    monkeypatch.setattr(program, "build", lambda *a, **k: order.append("build") or
                        build(*a, **k))
    monkeypatch.setattr(program, "embed_text", lambda *a, **k: order.append("embed") or
                        embed(*a, **k))
    timings = {}
    generate(program, _prompt(1), 4, timings=timings)
    assert order[:2] == ["build", "embed"] and timings["decode_tokens"] == 3


def test_bfloat16_checkpoint_keeps_its_cache_on_the_device():
    """A bf16 model (most checkpoints' dtype; from_pretrained loads it so): lowered as
    bf16 its KV cache was bf16 state cast to and from float32 by CPU glue around every
    call (8 CPU nodes in a 2-layer decode, the cache across the host each step, no
    decode loop on the device). lower converts it to float32 in place first."""
    from tests.llm.conftest import MAX_SEQ_LEN
    from tests.llm.models import make_model
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate.llm import lower

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    model = make_model("qwen2", seed=5).to(torch.bfloat16)
    bf16_weights = [p.detach().clone() for p in model.parameters()]
    program = lower(model, MAX_SEQ_LEN)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.equal(p.detach(), w.float())  # exact: bf16 values are fp32 values
               for p, w in zip(model.parameters(), bf16_weights))
    for method in ("prefill", "decode", "decode_next"):
        report = program.methods[method].report
        assert not report.cpu_nodes, str(report)
    assert program.runner("decode_next").repeat_blocker() is None
    assert all(v.dtype == torch.float32 for k, v in program.state_dict().items()
               if "kv_cache" in k)
    prompt = _prompt(6)
    assert generate(program, prompt, 24) == hf_greedy(model, prompt, 24)


@pytest.mark.parametrize("lanes", [False, True], ids=["workgroup", "lanes"])
@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_gpu_decode_attention_forms_match_hf(monkeypatch, kind, lanes):
    """The GPU's one-row decode attention (kernels/attention_decode.py: sdpa_decode.glsl,
    and with LANES_FORM sdpa_decode_lanes.glsl), forced on the CPU driver too: HF's
    greedy tokens through decode and the device loop (decode_next), Mistral's sliding
    window of 16 included."""
    from tests.llm.conftest import MAX_SEQ_LEN
    from tests.llm.models import make_model
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate.kernels import attention_decode as dec
    from vkdelegate.llm import lower

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    monkeypatch.setattr(dec, "use_decode", lambda info, l, hq, hk, d:
                        dec.pack(l, hq, hk, d) is not None)
    monkeypatch.setattr(dec, "LANES_FORM", lanes)
    taken = []
    lanes_for = dec.lanes_for
    monkeypatch.setattr(dec, "lanes_for", lambda *a: taken.append(lanes_for(*a)) or taken[-1])
    model = make_model(kind)
    program = lower(model, MAX_SEQ_LEN)
    prompt = _prompt(3)
    assert generate(program, prompt, 40) == hf_greedy(model, prompt, 40)
    assert taken and all((t is not None) == lanes for t in taken[-2:])


def test_force_fp16_keeps_the_sampler_inputs_float32():
    """force_fp16 (a compile option users pass through ``lower``): the sampler's
    ``sampling`` vector stays float32 (its kernel takes float32 only; the program used
    to fail at build), and the fp16 program's greedy tokens follow HF's float32 ones
    for the first tokens of this tiny model."""
    from tests.llm.models import make_model
    from vkdelegate.llm import lower

    model = make_model("llama")
    program = lower(model, max_seq_len=64, options={"force_fp16": True})
    notes = {d.name: " ".join(d.notes) for d in program.methods["decode"].report.decisions
             if d.notes}
    assert "takes argument 1 in float32 only" in notes["sample_record"]
    prompt = _prompt(3)
    assert generate(program, prompt, 8) == hf_greedy(model, prompt, 8)
