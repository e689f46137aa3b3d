"""``vkdelegate.llm.Session``: each turn prefills only what follows the longest prefix
of the conversation the KV cache already holds, and gives the tokens of a fresh
``generate`` on the whole conversation (HF greedy on it, and sampled: the same
draws); a conversation that differs from the cache rewinds; a refused turn leaves the
session able to go on."""
import pytest
import torch

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import VOCAB, hf_greedy
from vkdelegate import VkDelegateError
from vkdelegate.llm import Session, generate


def _ids(seed: int, n: int) -> list:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("kind", ["llama", "mistral"])  # Mistral: a sliding window of 16
@pytest.mark.parametrize("chunk", [1, 8], ids=["per_token", "device_loop"])
def test_turns_reuse_the_cache_and_match_hf(lowered, kind, chunk):
    model, program = lowered(kind)
    session = Session(program)
    turn1 = _ids(1, 9)
    timings = {}
    out1 = session.generate(turn1, 10, decode_chunk=chunk, timings=timings)
    assert out1 == hf_greedy(model, turn1, 10)
    assert session.reused == 0 and timings["prompt_tokens"] == 9
    assert session.cached == turn1 + out1[:-1]
    conversation = turn1 + out1 + _ids(2, 7)
    out2 = session.generate(conversation, 12, decode_chunk=chunk, timings=timings)
    assert out2 == hf_greedy(model, conversation, 12)
    # Everything but the 7 new ids and the last reply token was in the cache.
    assert session.reused == 9 + 9 and timings["prompt_tokens"] == 8
    # A third turn past Mistral's window of 16 (and the same conversation again:
    # only its last id is prefilled again).
    conversation += out2 + _ids(3, 5)
    out3 = session.generate(conversation, 8, decode_chunk=chunk)
    assert out3 == hf_greedy(model, conversation, 8)
    assert session.generate(conversation, 8, decode_chunk=chunk) == out3
    assert session.reused == len(conversation) - 1


def test_other_callers_of_the_program_between_turns_are_noticed(lowered):
    """A plain generate, a second session, a method call or reset_state between two
    turns overwrites the cache behind the session's back: the next turn prefills its
    whole conversation (reused 0) and still gives HF's tokens."""
    model, program = lowered("llama")
    session, other = Session(program), Session(program)
    conversation = _ids(20, 9)
    for intruder in (lambda: generate(program, _ids(21, 10), 4),
                     lambda: other.generate(_ids(22, 6), 3),
                     lambda: program.reset_state(),
                     None):
        out = session.generate(conversation, 5)
        assert out == hf_greedy(model, conversation, 5)
        conversation = conversation + out + _ids(len(conversation), 3)
        if intruder is not None:
            intruder()
            got = session.generate(conversation, 5)
            assert session.reused == 0
        else:  # nobody else ran: the prefix is reused
            got = session.generate(conversation, 5)
            assert session.reused > 0
        assert got == hf_greedy(model, conversation, 5)
        conversation = conversation + got + _ids(len(conversation) + 1, 2)
        session.reset()


def test_a_changed_conversation_rewinds(lowered):
    model, program = lowered("llama")
    session = Session(program)
    first = _ids(4, 20)
    out = session.generate(first, 6)
    edited = first[:11] + [(first[11] + 1) % VOCAB] + first[12:] + out
    got = session.generate(edited, 10)
    assert session.reused == 11
    assert got == hf_greedy(model, edited, 10)
    # Shorter than the cache: its prefix is reused, the rest overwritten unseen.
    short = edited[:5]
    assert session.generate(short, 6) == hf_greedy(model, short, 6)
    assert session.reused == 4


def test_sampled_turns_equal_generate_from_an_empty_cache(lowered):
    _, program = lowered("qwen2")
    session = Session(program)
    turn1 = _ids(5, 6)
    kw = dict(temperature=0.9, top_k=20, top_p=0.9, seed=3)
    out1 = session.generate(turn1, 8, **kw)
    conversation = turn1 + out1 + _ids(6, 4)
    out2 = session.generate(conversation, 8, **kw)
    program.reset_state()
    assert generate(program, conversation, 8, **kw) == out2


def test_errors(lowered):
    _, program = lowered("llama")
    session = Session(program)
    out = session.generate(_ids(7, 5), 4)
    too_long = _ids(7, 5) + out + [1] * MAX_SEQ_LEN
    with pytest.raises(VkDelegateError, match="do not fit the KV cache"):
        session.generate(too_long, 4)
    with pytest.raises(VkDelegateError, match="max_new_tokens >= 1"):
        session.generate([1, 2], 0)
    with pytest.raises(VkDelegateError, match="at least one token id"):
        session.generate([], 3)
    with pytest.raises(VkDelegateError, match="takes no image"):
        session.generate([1, 2], 3, image=(None, None))
    # A refused turn keeps the session: the next one still reuses the cache.
    conversation = _ids(7, 5) + out + [3, 4]
    got = session.generate(conversation, 5)
    assert session.reused == 5 + len(out) - 1
    program.reset_state()
    assert got == generate(program, conversation, 5)
    session.reset()
    assert session.cached == [] and session.reused == 0
