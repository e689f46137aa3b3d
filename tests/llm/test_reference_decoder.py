"""The project's own ReferenceDecoder (no transformers) through lower + generate:
greedy tokens equal its cache-free eager forward, step by step, on Vulkan."""
import pytest
import torch

from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VkDelegateError
from vkdelegate.llm import ReferenceDecoder, generate, lower


def _eager_greedy(model, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(prompt):]


def test_reference_decoder_greedy_matches_eager():
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(3)
    model = ReferenceDecoder(max_seq_len=48).eval()
    prompt = torch.randint(0, 256, (6,), generator=torch.Generator().manual_seed(8)).tolist()
    program = lower(model, 48)
    assert sorted(program.method_names) == ["decode", "decode_next", "embed_text",
                                            "prefill"]
    assert generate(program, prompt, 24) == _eager_greedy(model, prompt, 24)


def test_cache_size_must_match():
    with pytest.raises(VkDelegateError, match="48 positions, not max_seq_len 64"):
        lower(ReferenceDecoder(max_seq_len=48), 64)
    with pytest.raises(VkDelegateError, match="takes a transformers"):
        lower(torch.nn.Linear(2, 2), 64)
