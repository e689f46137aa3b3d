"""A tiny HF Llama decode step lowered by vkdelegate.llm.lower: the position, rotary
and cache-write dispatches that passes/cse, fuse_rotary's pairing and
pair_cache_updates remove are gone, and the greedy tokens are still HF's."""
import torch

from tests.llm.models import VOCAB, hf_greedy
from vkdelegate.llm import generate


def _decode_ops(program, token: int, pos: int) -> list:
    program.set_profiling(True)
    try:
        program.decode(torch.tensor([[token]]), torch.tensor([pos]),
                       torch.tensor([0.0, 0.0, 1.0, 0.5]))
    finally:
        program.set_profiling(False)
    return [d.op for _, prof in program.last_profiles("decode") for d in prof.dispatches]


def test_decode_step_dispatches_and_greedy_tokens(lowered):
    model, program = lowered("llama")
    layers = model.config.num_hidden_layers
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(5)).tolist()
    expected = hf_greedy(model, prompt, 12)
    assert generate(program, prompt, 12) == expected
    ops = _decode_ops(program, expected[-1], len(prompt) + 12)
    # One paired rotary (q and k) and one paired K/V cache write per layer.
    assert ops.count("vkdelegate.rotary_half_pair.default") == layers, ops
    assert ops.count("vkdelegate.index_put_pair.default") == layers, ops
    assert "vkdelegate.rotary_half.default" not in ops
    assert "aten.index_put.default" not in ops
    # The cache positions of a one-token step are start_pos itself: no per-layer
    # arange/add/select; one arange is left (the mask's 0..max_seq_len-1).
    assert ops.count("aten.arange.start_step") + ops.count("aten.arange.default") <= 1, ops
    # The residual adds are in o_proj's and down_proj's epilogues (linear_add).
    assert ops.count("aten.add.Tensor") == 0, ops
    assert ops.count("vkdelegate.linear_add.default") == 2 * layers, ops
    # The same program still generates HF's tokens after the profiled step.
    program.reset_state()
    assert generate(program, prompt, 12) == expected
