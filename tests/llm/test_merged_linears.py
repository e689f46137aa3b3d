"""passes/merge_linears in a lowered tiny HF decoder: the decode step runs q/k/v as
one linear and gate/up as one (7 -> 4 linear dispatches per layer, two of them the
fused residual adds of o and down, one gate/up with its SwiGLU chain), their parts
with no dispatch; prefill merges them too (3 GEMMs per layer instead of 7, its q/k/v
parts copied), so both read the same merged constants. Greedy tokens against HF are
tests/llm/test_hf_greedy.py's; the file size tests/llm/test_program_size.py's."""
import pytest
import torch

from tests.llm.models import make_model, norm_linear_dispatches, rotary_cache_dispatches

pytest.importorskip("transformers")

LAYERS = 2  # tests/llm/models.py
RMS_NORM_LINEAR = "vkdelegate.rms_norm_linear.default"


def _dispatch_ops(program, method):
    return [d.op for _, prof in program.last_profiles(method) for d in prof.dispatches]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decode_runs_four_linears_per_layer(lowered, kind):
    from vkdelegate.llm import generate

    _, program = lowered(kind)
    prompt = list(range(1, 9))
    program.set_profiling(True)
    try:
        generate(program, prompt, 2)
        prefill = _dispatch_ops(program, "prefill")
        program.decode(torch.tensor([[1]]), torch.tensor([len(prompt) + 1]),
                       torch.tensor([0.0, 0.0, 1.0, 0.5]))
        decode = _dispatch_ops(program, "decode")
    finally:
        program.set_profiling(False)
        program.reset_state()
    # Per layer q/k/v, o, gate/up, down; plus the LM head. o and down carry their
    # residual add (passes/fuse_linear_add: vkdelegate.linear_add, one dispatch in
    # decode; in prefill one, or on GPUs two: the GEMM core, then the add).
    # q/k/v and the LM head read an RMS norm, folded into each
    # (passes/fuse_rms_norm_linear: vkdelegate.rms_norm_linear), q/k/v with the rotary
    # embedding and the K/V cache writes (passes/fuse_linear_rotary_cache:
    # vkdelegate.rms_norm_linear_rotary_cache); gate/up carries the
    # SwiGLU chain in its epilogue and its norm too (passes/fuse_linear_swiglu:
    # vkdelegate.rms_norm_linear_swiglu; one dispatch on the GEMV path, else the
    # norm's, then the product).
    assert "aten.linear.default" not in decode
    assert decode.count(RMS_NORM_LINEAR) == norm_linear_dispatches()
    assert decode.count("vkdelegate.rms_norm_linear_rotary_cache.default") \
        == LAYERS * rotary_cache_dispatches()
    assert decode.count("vkdelegate.rms_norm_linear_swiglu.default") \
        == LAYERS * norm_linear_dispatches()
    assert decode.count("et_vk.rms_norm.default") == 0
    assert "vkdelegate.fused_elementwise.default" not in decode
    assert decode.count("vkdelegate.linear_add.default") == 2 * LAYERS
    assert "vkdelegate.narrow_last.default" not in decode
    # Prefill merges the same way (the same merged constants as decode's, so the
    # program stores each weight once): its q/k/v parts of several rows are one
    # strided copy each, gate/up carries its SwiGLU chain; only the LM head (which
    # reads the last row's norm) stays a plain linear.
    assert prefill.count("aten.linear.default") == 1
    assert prefill.count("vkdelegate.linear_add.default") in (2 * LAYERS, 4 * LAYERS)
    assert prefill.count("vkdelegate.narrow_last.default") == 3 * LAYERS
    assert "vkdelegate.rms_norm_linear_swiglu.default" in prefill
