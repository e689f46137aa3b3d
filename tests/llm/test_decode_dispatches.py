"""A tiny HF Llama decode step lowered by vkdelegate.llm.lower: the position, rotary
and cache-write dispatches that passes/cse, fuse_rotary's pairing and
pair_cache_updates (which also takes the rotary into the cache write) remove are
gone, in float16 the casts around SiLU are inside fused chains, the rotary cos/sin
are a row of a table computed at lowering (passes/rotary_tables), the decode loop's
record is in the sampler's dispatch (vkdelegate.sample_record), the SwiGLU chain is in
the merged gate/up linear's epilogue (passes/fuse_linear_swiglu: one dispatch per layer
fewer), the RMS norms are folded into the linear after them (passes/fuse_rms_norm_linear,
and fuse_linear_swiglu for the post-attention norm: no norm dispatch on GPUs, where the
GEMV path takes them), and the greedy tokens are still HF's; the same SwiGLU and RMS
norm fusions in an int4 / int8 weight-only model's products (vkdelegate.rms_norm_*_q4gsw
/ rms_norm_weight_int8pack_mm*: no norm dispatch where the vectorized GEMV runs), and
each layer's input norm, merged q/k/v linear, rotary embedding and K/V cache writes are
one node (passes/fuse_linear_rotary_cache: vkdelegate.rms_norm_linear_rotary_cache,
one dispatch on the GEMV path: one per layer fewer than rms_norm_linear then
rotary_index_put_pair, the same bits; in the int4 / int8 model
vkdelegate.rms_norm_linear_q4gsw_rotary_cache / rms_norm_weight_int8pack_mm_rotary_cache,
one dispatch on the vectorized GEMV)."""
import pytest
import torch

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import (VOCAB, hf_greedy, make_model, norm_linear_dispatches,
                              quantized_norm_dispatches, quantized_rotary_cache_dispatches,
                              rotary_cache_dispatches)
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate.llm import generate, lower


RMS_NORM_LINEAR = "vkdelegate.rms_norm_linear.default"
LINEAR_SWIGLU = "vkdelegate.rms_norm_linear_swiglu.default"
ROTARY_CACHE = "vkdelegate.rms_norm_linear_rotary_cache.default"


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
    # The input norm, the merged q/k/v linear, the rotary embedding of q and k and the
    # K/V cache writes are one node per layer (the rotated keys go straight into the
    # cache): one dispatch on the GEMV path (GPUs), else the norm's, the product's and
    # one for the rotary and the writes.
    assert ops.count(ROTARY_CACHE) == layers * rotary_cache_dispatches(), ops
    assert not {"vkdelegate.rotary_half.default", "vkdelegate.rotary_half_pair.default",
                "vkdelegate.index_put_pair.default",
                "vkdelegate.rotary_index_put_pair.default"} & set(ops), ops
    # No cache write of its own, and the decode loop's record (loop.token, loop.pos,
    # loop.history[pos + 1]; decoder.DecodeLoopState.sample) is in the sampler's
    # dispatch (vkdelegate.sample_record): no index_put, add or sub left.
    assert "aten.index_put.default" not in ops, ops
    assert ops.count("vkdelegate.sample_record.default") == 1, ops
    assert "vkdelegate.sample.default" not in ops, ops
    assert ops[-1] == "vkdelegate.sample_record.default", ops
    # The cache positions of a one-token step are start_pos itself: no per-layer
    # arange/add/select; and no attention mask: each layer's vkdelegate.sdpa_at reads
    # start_pos on the device (decoder.uses_position_attention), so the mask prelude
    # (arange 0..max_seq_len-1, le, expand) is gone.
    assert ops.count("aten.arange.start_step") + ops.count("aten.arange.default") == 0, ops
    assert ops.count("vkdelegate.sdpa_at.default") == layers, ops
    assert not {"aten.scaled_dot_product_attention.default", "aten.le.Tensor",
                "aten.expand.default"} & set(ops), ops
    # The residual adds are in o_proj's and down_proj's epilogues (linear_add).
    assert not {"aten.add.Tensor", "aten.sub.Tensor"} & set(ops), ops
    assert ops.count("vkdelegate.linear_add.default") == 2 * layers, ops
    # Every RMS norm is folded into the linear after it: the input norm of each layer
    # (with the rotary and the cache writes, above) and the final one
    # (vkdelegate.rms_norm_linear), the post-attention norm with the merged gate/up
    # linear and its SwiGLU chain (vkdelegate.rms_norm_linear_swiglu): one dispatch
    # each on the GEMV path (GPUs), else the norm's dispatch, then the product.
    assert "aten.linear.default" not in ops, ops
    assert ops.count(RMS_NORM_LINEAR) == norm_linear_dispatches(), ops
    assert ops.count(LINEAR_SWIGLU) == layers * norm_linear_dispatches(), ops
    assert ops.count("et_vk.rms_norm.default") == 0, ops
    assert "vkdelegate.fused_elementwise.default" not in ops, ops
    # The rotary cos/sin are one row of a table computed at lowering, read at start_pos
    # (passes/rotary_tables): no cast, product, cat, cos or sin per step.
    assert ops.count("aten.index.Tensor") == 1, ops
    assert not {"aten.cos.default", "aten.sin.default", "aten._to_copy.default",
                "aten.mul.Tensor", "aten.cat.default"} & set(ops), ops
    # decode_next (the loop generate runs) dispatches exactly what decode does: its
    # draw, draws[loop.pos], is read by the sampler (no slice, index_select or cat).
    assert _decode_next_ops(program) == ops
    # The same program still generates HF's tokens after the profiled step.
    program.reset_state()
    assert generate(program, prompt, 12) == expected


def _decode_next_ops(program) -> list:
    program.set_profiling(True)
    try:
        program.run("decode_next", torch.tensor([0.0, 0.0, 1.0, 0.0]),
                    torch.full((MAX_SEQ_LEN + 1,), 0.5))
    finally:
        program.set_profiling(False)
    return [d.op for _, prof in program.last_profiles("decode_next")
            for d in prof.dispatches]


def test_fp16_decode_fuses_casts_swiglu_and_rotary_prelude():
    """A float16 tiny HF Llama: ATen's decompositions compute SiLU and the rotary
    cos/sin in float32 between casts. With the casts joining fused chains
    (passes/fuse_elementwise), each layer's MLP runs merged gate/up linear -> one
    chain (cast, SiLU, cast, * up) -> down linear, and the prelude's cos and sin each
    one chain with their cast to float16: 43 dispatches per decode step before (per
    layer _to_copy, SiLU, _to_copy, mul; cos, sin and two casts), 35 after. The MLP's
    chain then goes into the merged linear's epilogue (passes/fuse_linear_swiglu:
    vkdelegate.linear_swiglu, one dispatch fewer per layer), and the rotary prelude
    (cast, product with inv_freq, cat, the cos and sin chains: 6 dispatches) is one row
    of a table of eager's cos/sin computed at lowering (passes/rotary_tables). The
    greedy tokens are still HF eager's float16 ones."""
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("transformers")
    model = make_model("llama").half()
    program = lower(model, MAX_SEQ_LEN)
    layers = model.config.num_hidden_layers
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(5)).tolist()
    expected = hf_greedy(model, prompt, 12)
    assert generate(program, prompt, 12) == expected
    ops = _decode_ops(program, expected[-1], len(prompt) + 12)
    # The post-attention RMS norm, the merged gate/up linear and its SwiGLU chain are
    # one node; no chain is left: the rotary prelude's cos and sin are a table row (one
    # aten.index.Tensor at start_pos, the first dispatch after the embedding).
    fused, norm = "vkdelegate.fused_elementwise.default", "et_vk.rms_norm.default"
    per = norm_linear_dispatches()  # dispatches per fused norm + linear
    assert fused not in ops, ops
    assert ops.count(LINEAR_SWIGLU) == layers * per, ops
    assert not {"aten.cos.default", "aten.sin.default", "aten._to_copy.default",
                "aten.mul.Tensor", "aten.cat.default"} & set(ops), ops
    assert ops.count("aten.index.Tensor") == 1, ops
    down = (RMS_NORM_LINEAR, "vkdelegate.linear_add.default")  # down_proj with the residual add
    mlp = [i for i, op in enumerate(ops)
           if op == LINEAR_SWIGLU and ops[i - 1] != LINEAR_SWIGLU and ops[i + per] in down]
    assert len(mlp) == layers, ops
    # Also 2 residual adds per layer in linear_add; the decode loop's state record is
    # in the sampler's dispatch (vkdelegate.sample_record: the 7 small dispatches of
    # token + (new - token), pos + 1, pos + (new - pos) and loop.history's index_put
    # are gone; decoder.DecodeLoopState.sample); the attention mask's
    # le (the one dispatch of its prelude under transformers 5.24 + torch 2.13; more
    # under 5.17) is gone with the mask; the rotary prelude's 6 dispatches (8 under
    # transformers 5.17 + torch 2.11: a cast and an unsqueeze more) are one table row;
    # the rotary embedding is in the cache write (one dispatch fewer per layer).
    # The 2 * layers + 1 RMS norms are in their linears' GEMVs where the GEMV path
    # runs (norm_linear_dispatches); the SwiGLU chains are in the gate/up GEMVs'
    # epilogues.
    norms = (2 * layers + 1) * (2 - per)
    assert "aten.le.Tensor" not in ops, ops
    assert len(ops) <= 43 - 3 * layers - 2 - 2 * layers - 1 - 5 - layers - norms \
        - layers, ops
    assert ops.count(norm) == 0, ops
    assert _decode_next_ops(program) == ops
    # Against the same model lowered without the SwiGLU fusion: one dispatch fewer
    # per layer, the same tokens, and the same KV caches bit for bit (layer 1's keys
    # and values are computed from layer 0's MLP output).
    unfused = lower(model, MAX_SEQ_LEN, options={"fuse_linear_swiglu": False})
    assert generate(unfused, prompt, 12) == expected
    before = _decode_ops(unfused, expected[-1], len(prompt) + 12)
    assert len(before) - len(ops) == layers, (before, ops)
    for p in (program, unfused):
        p.reset_state()
        assert generate(p, prompt, 12) == expected
    got, want = program.state_dict(), unfused.state_dict()
    caches = [name for name in want if "cache" in name or "key" in name or "value" in name]
    assert caches and set(got) == set(want), sorted(want)
    for name in caches:
        assert torch.equal(got[name], want[name]), name


QUANTIZED_NORMED = {"int4": "vkdelegate.rms_norm_linear_q4gsw.default",
                    "int8": "vkdelegate.rms_norm_weight_int8pack_mm.default"}
QUANTIZED_SWIGLU = {"int4": "vkdelegate.rms_norm_linear_q4gsw_swiglu.default",
                    "int8": "vkdelegate.rms_norm_weight_int8pack_mm_swiglu.default"}
QUANTIZED_ROTARY = {"int4": "vkdelegate.rms_norm_linear_q4gsw_rotary_cache.default",
                    "int8": "vkdelegate.rms_norm_weight_int8pack_mm_rotary_cache.default"}
ROTARY_PAIR = "vkdelegate.rotary_index_put_pair.default"


def _quantized_pair(scheme: str, options: dict):
    """A tiny HF Llama quantized with torchao (``scheme``, group size 32) lowered twice
    (lower quantizes in place: one equally seeded model per program), with the default
    options and with ``options``: (model, program, other, layers, prompt, HF's 12
    greedy tokens of the quantized model, each program's decode step ops), after
    asserting that both generate those tokens."""
    pytest.importorskip("transformers")
    pytest.importorskip("torchao")
    model, other = make_model("llama"), make_model("llama")
    group = None if scheme == "int8" else 32  # int8: per output channel
    program = lower(model, MAX_SEQ_LEN, quantization=scheme, group_size=group)
    other = lower(other, MAX_SEQ_LEN, quantization=scheme, group_size=group, options=options)
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(5)).tolist()
    expected = hf_greedy(model, prompt, 12)
    assert generate(program, prompt, 12) == expected
    assert generate(other, prompt, 12) == expected
    ops = _decode_ops(program, expected[-1], len(prompt) + 12)
    before = _decode_ops(other, expected[-1], len(prompt) + 12)
    return (model, program, other, model.config.num_hidden_layers, prompt, expected, ops,
            before)


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_decode_fuses_swiglu(scheme):
    """A tiny HF Llama with torchao's int4 (group size 32) / int8 weight-only linears
    (vkdelegate.llm.lower(..., quantization=scheme)): each layer's merged gate/up
    product (with the post-attention norm folded in) runs the SwiGLU chain in its
    epilogue (vkdelegate.rms_norm_linear_q4gsw_swiglu /
    rms_norm_weight_int8pack_mm_swiglu; int8's output view back to [1, 1, F] aliases
    it): one dispatch per layer fewer than with fuse_linear_swiglu off, HF's greedy
    tokens of the same quantized model, and the same KV caches bit for bit."""
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    fused_op, plain = QUANTIZED_SWIGLU[scheme], QUANTIZED_NORMED[scheme]
    per = quantized_norm_dispatches()  # dispatches per op with a norm folded in
    _, program, unfused, layers, prompt, expected, ops, before = _quantized_pair(
        scheme, {"fuse_linear_swiglu": False})
    chain = "vkdelegate.fused_elementwise.default"
    assert ops.count(fused_op) == layers * per and fused_op not in before, (ops, before)
    # The lm_head keeps its norm only (the merged q/k/v products are in
    # QUANTIZED_ROTARY's ops, with the rotary and the cache writes).
    assert ops.count(plain) == per, ops
    assert before.count(plain) == (layers + 1) * per, before
    assert ops.count(chain) == before.count(chain) - layers, (ops, before)
    copies = before.count("vkdelegate.narrow_last.default") \
        - ops.count("vkdelegate.narrow_last.default")
    assert len(before) - len(ops) == layers + copies, (before, ops)
    for p in (program, unfused):
        p.reset_state()
        assert generate(p, prompt, 12) == expected
    got, want = program.state_dict(), unfused.state_dict()
    caches = [name for name in want if "cache" in name or "key" in name or "value" in name]
    assert caches and set(got) == set(want), sorted(want)
    for name in caches:
        assert torch.equal(got[name], want[name]), name
    program.close()
    unfused.close()


@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("form", ["vector", "own"])
def test_quantized_decode_folds_the_norms(monkeypatch, form, scheme):
    """The int4 / int8 decode step on the GPUs' vectorized GEMV (linear_qw_gemv.glsl,
    forced on any device as tests/ops/test_quantized_rms_norm.py forces it; "vector")
    and on the device's own form ("own": the same on GPUs, linear_qw_texel.glsl's
    RMS_NORM on CPU drivers): every RMS
    norm is folded into the product after it (each layer's input norm into the merged
    q/k/v product, the post-attention norm into the gate/up product with its SwiGLU
    chain, the final norm into lm_head), one dispatch each and no et_vk.rms_norm
    dispatch left (the q/k/v product with the rotary and the cache writes:
    QUANTIZED_ROTARY): 2 * layers + 1 dispatches fewer than with compile option
    rms_norm_prologue off (the norms' own dispatches), HF's greedy tokens of the same
    quantized model both ways, KV caches equal up to fp32 rounding (the folded GEMV
    scales each sum by 1 / rms instead of normalizing the row first)."""
    from vkdelegate.ops.families import quantized_linear as family

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    if form == "vector":
        monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    _, program, off, layers, prompt, expected, ops, before = _quantized_pair(
        scheme, {"rms_norm_prologue": False})
    normed, swiglu = QUANTIZED_NORMED[scheme], QUANTIZED_SWIGLU[scheme]
    rotary = QUANTIZED_ROTARY[scheme]
    vector = True if form == "vector" else None
    assert ops.count(normed) == 1 and ops.count(swiglu) == layers, ops
    assert ops.count(rotary) == layers * quantized_rotary_cache_dispatches(True, vector), ops
    assert before.count(normed) == 2 and before.count(swiglu) == 2 * layers, before
    assert before.count(rotary) == layers * quantized_rotary_cache_dispatches(False, vector)
    assert "et_vk.rms_norm.default" not in ops + before, ops
    assert len(before) - len(ops) == 2 * layers + 1, (before, ops)
    got, want = program.state_dict(), off.state_dict()
    caches = [name for name in want if "cache" in name or "key" in name or "value" in name]
    assert caches and set(got) == set(want), sorted(want)
    for name in caches:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5)
    program.close()
    off.close()


def _force_gpu_forms(monkeypatch) -> None:
    """The GPUs' product forms (the GEMV path, kernels/gemm_tiles.DEFAULT without
    cooperative matrices) on any device; skips without Vulkan or transformers."""
    import dataclasses

    from vkdelegate.kernels import gemm, gemm_tiles

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("transformers")
    portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
    monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)


def test_gemv_prologue_norms_keep_hf_greedy_tokens(monkeypatch):
    """The GPU forms forced on any device (as tests/ops/test_rms_norm_linear.py does)
    and compile option rms_norm_prologue on: a float16 tiny HF Llama's decode step
    folds each RMS norm into the GEMV after it, one dispatch per rms_norm_linear and
    rms_norm_linear_swiglu, and still generates HF eager's float16 greedy tokens."""
    _force_gpu_forms(monkeypatch)
    model = make_model("llama").half()
    program = lower(model, MAX_SEQ_LEN, options={"rms_norm_prologue": True})
    layers = model.config.num_hidden_layers
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(5)).tolist()
    expected = hf_greedy(model, prompt, 12)
    assert generate(program, prompt, 12) == expected
    ops = _decode_ops(program, expected[-1], len(prompt) + 12)
    assert ops.count(RMS_NORM_LINEAR) == 1 and ops.count(ROTARY_CACHE) == layers, ops
    assert ops.count(LINEAR_SWIGLU) == layers, ops
    assert "et_vk.rms_norm.default" not in ops, ops


def _same_tokens_and_caches(program, unfused, prompt, expected, layers) -> None:
    """Both programs, reset, generate ``expected`` (12 tokens after ``prompt``) and
    leave their 2 * ``layers`` KV caches bit for bit equal; then closes them."""
    for p in (program, unfused):
        p.reset_state()
        assert generate(p, prompt, 12) == expected
    got, want = program.state_dict(), unfused.state_dict()
    caches = [name for name in want if "kv_cache" in name]
    assert len(caches) == 2 * layers and set(got) == set(want), sorted(want)
    for name in caches:
        assert torch.equal(got[name], want[name]), name
    program.close()
    unfused.close()


@pytest.mark.parametrize("kind, dtype", [("llama", torch.float32), ("llama", torch.float16),
                                         ("qwen2", torch.float16)],
                         ids=["llama-fp32", "llama-fp16", "qwen2-fp16"])
def test_gemv_rotary_cache_epilogue(monkeypatch, kind, dtype):
    """The GPU forms forced on any device (as above): each layer's input norm, merged
    q/k/v GEMV, rotary embedding and K/V cache writes are ONE dispatch
    (vkdelegate.rms_norm_linear_rotary_cache, gemv.glsl's ROTARY epilogue): one per
    layer fewer than with compile option fuse_linear_rotary_cache off (rms_norm_linear,
    then rotary_index_put_pair), decode_next dispatching what decode does, HF eager's
    greedy tokens both ways (Qwen2: q/k/v biases), and the KV caches bit for bit the
    unfused program's."""
    _force_gpu_forms(monkeypatch)
    model = make_model(kind).to(dtype)
    layers = model.config.num_hidden_layers
    program = lower(model, MAX_SEQ_LEN)
    unfused = lower(model, MAX_SEQ_LEN, options={"fuse_linear_rotary_cache": False})
    prompt = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(5)).tolist()
    expected = hf_greedy(model, prompt, 12)
    for p in (program, unfused):
        assert generate(p, prompt, 12) == expected
    ops = _decode_ops(program, expected[-1], len(prompt) + 12)
    before = _decode_ops(unfused, expected[-1], len(prompt) + 12)
    assert ops.count(ROTARY_CACHE) == layers and ROTARY_CACHE not in before, ops
    assert "vkdelegate.rotary_index_put_pair.default" not in ops, ops
    assert before.count("vkdelegate.rotary_index_put_pair.default") == layers, before
    assert ops.count(RMS_NORM_LINEAR) == 1 and before.count(RMS_NORM_LINEAR) == layers + 1
    assert len(before) - len(ops) == layers, (before, ops)
    assert _decode_next_ops(program) == ops
    _same_tokens_and_caches(program, unfused, prompt, expected, layers)


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_gemv_rotary_cache_epilogue(monkeypatch, scheme):
    """A tiny HF Llama with torchao's int4 (group size 32) / int8 weight-only linears on
    the GPUs' vectorized GEMV (linear_qw_gemv.glsl forced on any device, as
    tests/ops/test_quantized_rms_norm.py forces it): each layer's input norm, merged
    q/k/v product, rotary embedding and K/V cache writes are ONE dispatch
    (vkdelegate.rms_norm_linear_q4gsw_rotary_cache / rms_norm_weight_int8pack_mm_
    rotary_cache, linear_qw_gemv.glsl's ROTARY epilogue): one per layer fewer than with
    compile option fuse_linear_rotary_cache off (the product with its norm, then
    rotary_index_put_pair), decode_next dispatching what decode does, HF's greedy
    tokens of the same quantized model both ways, and the KV caches bit for bit the
    unfused program's."""
    from vkdelegate.ops.families import quantized_linear as family

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(family, "texel_form", lambda *args: False)
    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    _, program, unfused, layers, prompt, expected, ops, before = _quantized_pair(
        scheme, {"fuse_linear_rotary_cache": False})
    fused_op, normed = QUANTIZED_ROTARY[scheme], QUANTIZED_NORMED[scheme]
    assert ops.count(fused_op) == layers and fused_op not in before, (ops, before)
    assert ROTARY_PAIR not in ops and before.count(ROTARY_PAIR) == layers, (ops, before)
    assert ops.count(normed) == 1 and before.count(normed) == layers + 1, (ops, before)
    # The parts' copies (narrow_last, int8's views) went with the product's row.
    copies = before.count("vkdelegate.narrow_last.default") \
        - ops.count("vkdelegate.narrow_last.default") \
        + before.count("aten.view.default") - ops.count("aten.view.default")
    assert len(before) - len(ops) == layers + copies, (before, ops)
    assert _decode_next_ops(program) == ops
    _same_tokens_and_caches(program, unfused, prompt, expected, layers)
