"""Bad input to the LLM methods and to ``generate`` gets a VkDelegateError naming the
method, the argument, the value and the valid range, before anything runs
(``vkdelegate.backend.llm_checks``), never a silent wrong token: a negative start_pos
used to wrap to the cache's last slot and return token 0. The edges of the valid
ranges still give the tokens of HF eager."""
import dataclasses
import math

import pytest
import torch

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import VOCAB, hf_greedy
from vkdelegate.errors import VkDelegateError
from vkdelegate.llm import generate

GREEDY = torch.tensor([0.0, 0.0, 1.0, 0.0])
S = MAX_SEQ_LEN


def _prompt(n, seed=5):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _raises(match):
    return pytest.raises(VkDelegateError, match=match)


@pytest.mark.parametrize("pos", [-1, -S, S, S + 100])
def test_decode_start_pos_out_of_range(lowered, pos):
    _, program = lowered("llama")
    before = program.state_dict()
    with _raises(rf"^decode: start_pos {pos} out of range 0\.\.{S - 1} for max_seq_len {S}$"):
        program.decode(torch.tensor([[3]]), torch.tensor([pos]), GREEDY)
    after = program.state_dict()  # refused before anything ran
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("pos,count", [(-1, 4), (S - 3, 4), (S, 1), (1, S)])
def test_prefill_start_pos_and_length_out_of_range(lowered, pos, count):
    _, program = lowered("llama")
    embeds = program.embed_text(torch.tensor([_prompt(count)]))
    if count == 1:
        match = rf"^prefill: start_pos {pos} out of range 0\.\.{S - 1} for max_seq_len {S}$"
    else:
        match = (rf"^prefill: start_pos {pos} with T = {count} tokens \(inputs_embeds dim "
                 rf"1\) writes cache positions {pos}\.\.{pos + count - 1}, outside "
                 rf"0\.\.{S - 1} for max_seq_len {S}: start_pos must be in "
                 rf"0\.\.{S - count} for T = {count}$")
    with _raises(match):
        program.prefill(embeds, torch.tensor([pos]), GREEDY)


@pytest.mark.parametrize("method", ["decode", "embed_text"])
@pytest.mark.parametrize("token,what", [(VOCAB, f">= vocab size {VOCAB}"),
                                        (300, f">= vocab size {VOCAB}"),
                                        (-1, "is negative")])
def test_token_ids_outside_the_vocabulary(lowered, method, token, what):
    _, program = lowered("llama")
    if method == "decode":
        call, where = (lambda: program.decode(torch.tensor([[token]]), torch.tensor([2]),
                                              GREEDY)), "0, 0"
    else:
        call, where = (lambda: program.embed_text(torch.tensor([[1, 2, token]]))), "0, 2"
    with _raises(rf"^{method}: token id {token} at tokens\[{where}\] {what} \(ids are "
                 rf"0\.\.{VOCAB - 1}\)$"):
        call()


@pytest.mark.parametrize("index,value", [(0, math.nan), (1, math.inf), (2, -math.inf),
                                         (3, math.nan)])
def test_sampling_not_finite(lowered, index, value):
    _, program = lowered("llama")
    sampling = GREEDY.clone()
    sampling[index] = value
    name = ("temperature", "top_k", "top_p", "draw")[index]
    with _raises(rf"^decode: sampling\[{index}\] \({name}\) is {value}; sampling must be "
                 r"float32\[4\]"):
        program.decode(torch.tensor([[3]]), torch.tensor([0]), sampling)
    with _raises(r"input 'sampling' has dtype float64"):  # the dtype check before it
        program.decode(torch.tensor([[3]]), torch.tensor([0]), sampling.double())


def test_sampling_values_sample_reference_defines_are_accepted(lowered):
    """temperature <= 0 is greedy, top_k < 0 keeps all, top_p > 1 keeps all, the draw
    is clamped (custom_ops_llm.sample_reference): no error, and greedy's token."""
    _, program = lowered("llama")
    greedy = program.decode(torch.tensor([[3]]), torch.tensor([0]), GREEDY)
    odd = torch.tensor([-1.0, -5.0, 1.5, 2.0])
    assert torch.equal(program.decode(torch.tensor([[3]]), torch.tensor([0]), odd), greedy)
    sampled = torch.tensor([0.7, -3.0, 7.0, -0.5])  # draw clamped to 0: the top token
    assert torch.equal(program.decode(torch.tensor([[3]]), torch.tensor([0]), sampled),
                       greedy)


def test_decode_next_draws_and_sampling(lowered):
    _, program = lowered("llama")
    draws = torch.zeros(S + 1)
    draws[7] = math.nan
    with _raises(r"^decode_next: draws\[7\] is nan; the draws must be finite"):
        program.decode_next(GREEDY, draws)
    with _raises(r"^decode_next: sampling\[2\] \(top_p\) is inf;"):
        program.run_repeated("decode_next", 3, torch.tensor([0.0, 0.0, math.inf, 0.0]),
                             torch.zeros(S + 1))
    # sampling[3] is ignored by decode_next (its draw is draws[loop.pos]): not checked.
    program.decode_next(torch.tensor([0.0, 0.0, 1.0, math.nan]), torch.zeros(S + 1))


def test_valid_edges_equal_hf(lowered):
    """decode at start_pos = max_seq_len - 1, and a prefill whose last position is the
    cache's last (start_pos = max_seq_len - T), give HF eager's tokens."""
    model, program = lowered("llama")
    prompt = _prompt(S - 1, seed=8)
    expected = hf_greedy(model, prompt, 2)
    first = program.prefill(program.embed_text(torch.tensor([prompt])), torch.tensor([0]),
                            GREEDY)
    assert first.tolist() == expected[:1]
    assert program.decode(torch.tensor([expected[:1]]), torch.tensor([S - 1]),
                          GREEDY).tolist() == expected[1:]
    full = prompt + expected[:1]  # S tokens: two prefills, the second ending at S - 1
    program.reset_state()
    half = S // 2
    program.prefill(program.embed_text(torch.tensor([full[:half]])), torch.tensor([0]),
                    GREEDY)
    last = program.prefill(program.embed_text(torch.tensor([full[half:]])),
                           torch.tensor([S - (S - half)]), GREEDY)
    assert last.tolist() == expected[1:]


def test_generate_refuses_what_does_not_fit_and_fills_the_cache(lowered):
    model, program = lowered("llama")
    prompt = _prompt(S - 10, seed=3)
    with _raises(rf"^max_new_tokens 12 does not fit the KV cache: {S - 10} prompt tokens "
                 rf"\+ 12 new need {S + 1} cache positions \(the last new token is not "
                 rf"stored\); the program has {S} \(max_seq_len\), so at most 11 new "
                 rf"tokens fit this prompt$"):
        generate(program, prompt, 12)
    with _raises(rf"^the prompt's {S + 1} tokens do not fit the KV cache"):
        generate(program, _prompt(S + 1), 1)
    # 11 fit: the last decode step feeds position S - 1 (decode_next, one chunk).
    assert generate(program, prompt, 11) == hf_greedy(model, prompt, 11)


@pytest.mark.parametrize("token,what", [(300, f">= vocab size {VOCAB}"), (-5, "is negative")])
def test_generate_names_the_prompt_id(lowered, token, what):
    _, program = lowered("llama")
    with _raises(rf"^token id {token} at prompt_ids\[2\] {what} \(ids are "
                 rf"0\.\.{VOCAB - 1}\)$"):
        generate(program, [1, 2, token, 4], 3)


@pytest.mark.parametrize("prompt,match", [
    ([1, 2.5, 3], r"^prompt_ids\[1\] = 2\.5 is not an int token id$"),
    ([True, 2, 3], r"^prompt_ids\[0\] = True is not an int token id$"),
    ("12345", r"^prompt_ids must be a list of int token ids or a 1-D tensor, got str$"),
    (torch.tensor([1.0, 2.0]), r"^prompt_ids must be integer token ids, got a "
                               r"torch.float32 tensor$"),
    (torch.tensor([[1, 2], [3, 4]]), r"^prompt_ids must be one sequence .* got sizes "
                                     r"\[2, 2\]$"),
])
def test_generate_refuses_prompts_that_are_not_int_ids(lowered, prompt, match):
    """What int() would truncate (2.5), take for an id (True), split ("12345") or
    join (a batch of two rows) is refused, naming the element."""
    _, program = lowered("llama")
    with _raises(match):
        generate(program, prompt, 3)


def test_generate_accepts_int_sequences_and_one_row(lowered):
    import numpy as np

    model, program = lowered("llama")
    prompt = _prompt(6)
    want = hf_greedy(model, prompt, 4)
    for form in (tuple(prompt), torch.tensor(prompt), torch.tensor([prompt]),
                 [np.int64(t) for t in prompt]):
        program.reset_state()
        assert generate(program, form, 4) == want, type(form)
    assert generate(program, range(3, 9), 4) == hf_greedy(model, list(range(3, 9)), 4)


@pytest.mark.parametrize("kwargs,match", [
    ({"seed": "a"}, r"^seed must be an int, got 'a'$"),
    ({"seed": 1.5}, r"^seed must be an int, got 1\.5$"),
    ({"eos_token_id": "x"}, r"^eos_token_id must be a list of int token ids, got str$"),
    ({"eos_token_id": [3, None]}, r"^eos_token_id\[1\] = None is not an int token id$"),
])
def test_generate_refuses_a_seed_or_eos_that_is_not_an_int(lowered, kwargs, match):
    _, program = lowered("llama")
    with _raises(match):
        generate(program, [1, 2, 3], 3, **kwargs)


def test_decode_next_past_the_cache(lowered):
    """The decode loop keeps its position on the device: a step fed at max_seq_len or
    later is flagged there (the cache write's index check, which skips the write) and
    raised after the submit, saying so; the cache and loop.history keep what the
    steps inside the cache wrote."""
    _, program = lowered("llama")
    program.prefill(program.embed_text(torch.tensor([_prompt(S - 5)])), torch.tensor([0]),
                    GREEDY)
    program.run_repeated("decode_next", 5, GREEDY, torch.zeros(S + 1))  # to position S
    before = program.state_dict()
    assert before["loop.pos"].tolist() == [S]
    with _raises(rf"^decode_next: the decode loop ran past the KV cache \(max_seq_len "
                 rf"{S}\): a step was fed position {S} or later, and loop.pos is now "
                 rf"{S + 3}\..*\(The first of the device's errors it raised, .*: "
                 rf"node \d+"):
        program.run_repeated("decode_next", 3, GREEDY, torch.zeros(S + 1))
    after = program.state_dict()
    for fqn in before:
        if fqn.startswith("decoder.kv_cache.") or fqn == "loop.history":
            assert torch.equal(before[fqn], after[fqn]), fqn
    with _raises(r"^decode_next: the decode loop ran past the KV cache"):
        program.decode_next(GREEDY, torch.zeros(S + 1))
    # prefill (as generate does) starts over.
    assert len(generate(program, [1, 2, 3], 4)) == 4


def test_checks_travel_with_the_file(lowered, tmp_path):
    """A saved and loaded program keeps the checks (the vocabulary size is in the
    plans, plan["llm"]); a malformed record is refused when the program is made."""
    import vkdelegate
    from vkdelegate.backend.program import LoweredProgram

    _, program = lowered("llama")
    program.save(tmp_path / "llama.vkp")
    loaded = vkdelegate.load(tmp_path / "llama.vkp")
    with _raises(r"^decode: start_pos -1 out of range"):
        loaded.decode(torch.tensor([[3]]), torch.tensor([-1]), GREEDY)
    with _raises(rf"^embed_text: token id {VOCAB} at tokens\[0, 0\] >= vocab size"):
        loaded.embed_text(torch.tensor([[VOCAB]]))
    methods = {name: dataclasses.replace(m, plan=dict(m.plan, llm={"vocab_size": -1}))
               for name, m in program.methods.items()}
    with _raises(r"plan\.llm\.vocab_size must be an int >= 1, got -1"):
        LoweredProgram(methods)


def test_other_programs_have_no_guard():
    from vkdelegate import VulkanPartitioner, to_backend

    ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    assert program.runner("forward").guard is None
