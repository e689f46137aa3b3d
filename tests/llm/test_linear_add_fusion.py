"""passes/fuse_linear_add in a lowered tiny HF Llama: each layer's residual adds after
o_proj and down_proj are gone, fused into ``vkdelegate.linear_add`` (one dispatch per
add less in a decode step), in decode and prefill alike, and the greedy tokens still
equal HF ``generate``'s (eager); the int4 model's into ``vkdelegate.linear_q4gsw_add``
is tests/llm/test_quantized_lower.py's."""
import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy
from vkdelegate.llm import generate
from vkdelegate.serialization.blob import read_blob

pytest.importorskip("transformers")

LINEAR_ADD = "vkdelegate.linear_add.default"
LINEARS = ("aten.linear.default", "et_vk.linear_q4gsw.default")


def _adds_after_a_linear(program, method: str) -> list:
    """The aten.add.Tensor nodes of ``method``'s delegates that read a linear's output."""
    found = []
    for delegate in program.methods[method].delegates:
        graph = read_blob(delegate.blob).graph
        made_by = {call.args[-1]: call.name for call in graph.chain}
        found += [call for call in graph.chain if call.name == "aten.add.Tensor"
                  and any(made_by.get(a) in LINEARS for a in call.args[:2])]
    return found


def _chain_ops(program, method: str) -> list:
    return [call.name for delegate in program.methods[method].delegates
            for call in read_blob(delegate.blob).graph.chain]


def test_residual_adds_fuse_and_tokens_match_hf(lowered):
    model, program = lowered("llama")
    layers = model.config.num_hidden_layers
    for method in ("decode", "prefill"):
        assert not _adds_after_a_linear(program, method), method
        # Per layer o_proj + h and down_proj + h.
        assert _chain_ops(program, method).count(LINEAR_ADD) == 2 * layers, method
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(7)).tolist()
    expected = hf_greedy(model, prompt, 16)
    assert generate(program, prompt, 16) == expected
    program.set_profiling(True)
    try:
        program.decode(torch.tensor([[expected[-1]]]), torch.tensor([len(prompt) + 16]),
                       torch.tensor([0.0, 0.0, 1.0, 0.5]))
    finally:
        program.set_profiling(False)
        program.reset_state()
    ops = [d.op for _, prof in program.last_profiles("decode") for d in prof.dispatches]
    # One row: the GEMV path (GPUs) or linear.glsl (CPU drivers) adds in its epilogue,
    # one dispatch per fused add; no separate residual add is left (nor the decode
    # loop's int64 adds: its record is in vkdelegate.sample_record).
    assert ops.count(LINEAR_ADD) == 2 * layers, ops
    assert "aten.add.Tensor" not in ops, ops
