"""Sampling: the exported sampler against host-side sampling with the same draws,
alone (eager, many logits and settings) and inside a lowered program on Vulkan."""
import numpy as np
import pytest
import torch

from tests.llm.host_sampling import host_sample
from tests.llm.models import VOCAB
from vkdelegate.llm import draws, generate, sample


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.8), (0.9, 40, 0.9),
    (1.0, 1, 1.0), (2.0, 0, 0.05), (1.0, 0, 0.0), (0.5, 300, 1.0)])
def test_sampler_matches_host_rule(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(11)
    rand = draws(5)
    for _ in range(40):
        logits = torch.randn(VOCAB, generator=gen) * 3.0
        draw = next(rand)
        sampling = torch.tensor([temperature, top_k, top_p, draw], dtype=torch.float32)
        got = sample(logits, sampling)
        assert got.dtype == torch.int64 and got.shape == (1,)
        assert int(got) == host_sample(logits.numpy(), temperature, top_k, top_p,
                                       float(sampling[3]))


def test_draws_are_seeded():
    a, b, c = draws(3), draws(3), draws(4)
    first = [next(a) for _ in range(5)]
    assert first == [next(b) for _ in range(5)]
    assert first != [next(c) for _ in range(5)]
    assert all(0.0 <= x < 1.0 for x in first)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_sampled_tokens_match_host_sampling(lowered, kind):
    """Each token: HF eager logits of the whole sequence so far, host_sample with the
    draw generate used; the program must pick the same token every step."""
    model, program = lowered(kind)
    prompt = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(7)).tolist()
    settings = dict(temperature=0.8, top_k=50, top_p=0.9)
    got = generate(program, prompt, 16, seed=123, **settings)
    rand = draws(123)
    seq, expected = list(prompt), []
    with torch.no_grad():
        for _ in range(16):
            logits = model(torch.tensor([seq])).logits[0, -1]
            draw = float(np.float32(next(rand)))  # what the program's float32 input holds
            token = host_sample(logits.numpy(), settings["temperature"], settings["top_k"],
                                settings["top_p"], draw)
            expected.append(token)
            seq.append(token)
    assert got == expected
    # Same seed, same tokens; another seed, another sequence.
    assert generate(program, prompt, 16, seed=123, **settings) == got
    assert generate(program, prompt, 16, seed=124, **settings) != got
