"""The KV cache is program state shared by prefill and decode (one value per FQN,
``decoder.kv_cache.k_<i>``/``v_<i>``): decode continues prefill's cache, reset_state
empties it, a saved program continues where it stopped, and a decode step does not
move the cache between host and device."""
import numpy as np
import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy
from vkdelegate import load
from vkdelegate.llm import generate

GREEDY = torch.tensor([0.0, 0.0, 1.0, 0.5])


def _prompt():
    return torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(21)).tolist()


def test_decode_continues_prefills_cache(lowered):
    model, program = lowered("llama")
    prompt = _prompt()
    expected = hf_greedy(model, prompt, 3)
    keys = [k for k in program.store.names if k.startswith("decoder.kv_cache.")]
    assert len(keys) == 4  # k and v of 2 layers, one value each for all methods
    embeds = program.embed_text(torch.tensor([prompt]))
    first = program.prefill(embeds, torch.tensor([0]), GREEDY)
    assert first.dtype == torch.int64 and first.tolist() == expected[:1]
    state = program.state_dict()
    for key in keys:
        value = state[key].numpy()
        assert value.shape == (1, 2, 80, 16)
        assert np.abs(value[:, :, :8]).min(axis=-1).max() > 0  # prefill wrote 0..7
        assert not value[:, :, 8:].any()                      # and nothing else
    # decode's view of the same buffers (by its own placeholder names) is that value
    by_placeholder = {k: v for k, v in program.state_dict("decode").items()
                      if "kv_cache" in k}
    assert len(by_placeholder) == 4
    for value in by_placeholder.values():
        assert any(torch.equal(value, state[k]) for k in keys)
    second = program.decode(first.view(1, 1), torch.tensor([8]), GREEDY)
    assert second.tolist() == expected[1:2]
    third = program.decode(second.view(1, 1), torch.tensor([9]), GREEDY)
    assert third.tolist() == expected[2:3]


def test_reset_state_empties_the_cache(lowered):
    _, program = lowered("llama")
    generate(program, _prompt(), 4)
    assert any(v.any() for v in program.state_dict().values())
    program.reset_state()
    assert not any(v.any() for v in program.state_dict().values())


def test_save_load_then_continue(lowered, tmp_path):
    model, program = lowered("qwen2")
    prompt = _prompt()
    expected = hf_greedy(model, prompt, 16)
    assert generate(program, prompt, 8) == expected[:8]
    program.save(tmp_path / "qwen2.vkp")  # the current cache goes with it
    loaded = load(tmp_path / "qwen2.vkp")
    token, position, got = expected[7], len(prompt) + 7, []
    for _ in range(8):
        token = int(loaded.decode(torch.tensor([[token]]), torch.tensor([position]),
                                  GREEDY)[0])
        got.append(token)
        position += 1
    assert got == expected[8:]
    loaded.reset_state()  # the initial state was stored too: an empty cache
    assert not any(v.any() for v in loaded.state_dict().values())
    assert generate(loaded, prompt, 8) == expected[:8]
    loaded.close()


def test_no_cache_bytes_per_decode_step(lowered):
    _, program = lowered("llama")
    generate(program, _prompt(), 6)  # decode_next, 5 steps in one submit
    looped = program.last_transfer("decode_next")
    assert looped["state_upload_bytes"] == looped["state_download_bytes"] == 0, looped
    # Up: the sampling vector and the draws table (float32[81]), once per chunk of
    # steps; down: the last id.
    assert looped["upload_bytes"] <= 16 + 4 * 81 and looped["download_bytes"] <= 8, looped
    assert not program.methods["decode_next"].report.cpu_nodes
    generate(program, _prompt(), 6, decode_chunk=1)  # one decode call per token
    moved = program.last_transfer("decode")
    cache_bytes = sum(v.numel() * v.element_size() for v in program.store.initial.values())
    assert moved["state_upload_bytes"] == moved["state_download_bytes"] == 0
    # Every node of decode on Vulkan (cache updates and the sampler included), the cache
    # kept on the device.
    assert not program.methods["decode"].report.cpu_nodes, program.methods["decode"].report
    assert program.runner("decode").states_on_device
    # Up: the token (int64[1, 1]), the position (int64[1]), the sampling vector
    # (float32[4]); down: the next id. Nothing cache- or logits-sized.
    assert moved["upload_bytes"] <= 8 + 8 + 16 and moved["download_bytes"] <= 8, moved
    assert moved["upload_bytes"] + moved["download_bytes"] < cache_bytes / 100, moved


def test_cache_is_updated_in_place(lowered):
    # Each layer's cache update writes its new rows straight into the program's state
    # buffer: no copy of the whole cache into the op's output, none back at the end.
    _, program = lowered("llama")
    prompt = _prompt()
    generate(program, prompt, 3)
    generate(program, prompt, 3, decode_chunk=1)
    for method in ("prefill", "decode", "decode_next"):
        graphs = [d.loaded for d in program.runner(method).delegates]
        pairs = [(g, i, j) for g in graphs for i, j in g.state_bindings.items()
                 if g.inputs[i].ndim == 4]  # the cache (the loop state is 1-D and 2-D)
        assert len(pairs) == 4, method
        for g, i, j in pairs:
            shared = g.shared_states[i].buffer
            assert g.inputs[i].buffer is shared and g.outputs[j].buffer is shared, method
            assert not any(d.whole_copy and d.whole_copy[0] is g.inputs[i]
                           for d in g.dispatches), method
    model, _ = lowered("llama")
    program.reset_state()
    assert generate(program, prompt, 6) == hf_greedy(model, prompt, 6)
