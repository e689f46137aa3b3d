"""A lowered LLM's program file, and the device once it is built, hold each weight
once: prefill merges q/k/v and gate/up as decode does (passes/merge_linears), so both
methods read the same merged constants and the file's cross-method dedup (SHA-256 of
the bytes) keeps one copy; the methods' delegates take them from one constant pool
(runtime/constant_pool.py). Before, decode's merged weights were stored beside
prefill's separate ones (a 4-layer fp32 Llama: 15.5 MiB of parameters, a 25.1 MiB
file; a new-user trial's finding), and each method uploaded its own copy. fp32, int4
and int8 weight-only, with greedy tokens equal to HF generate of the same (quantized)
model."""
import json
import struct

import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy
from tests.vulkan_skip import vulkan_unavailable

GROUP = 32
#: Constants over the model's parameter bytes: the rest is decode's rotary table
#: (max_seq_len rows) and the norms' scalars.
RATIO = 1.05


def _model():
    """A Llama whose linears outweigh its embedding, head_dim 16 (a small rotary
    table), weights wide enough (std 0.25) that greedy tokens vary."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         initializer_range=0.25, max_position_embeddings=512,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = tf.LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def _gpu(program) -> bool:
    """Whether the program's delegates run on a GPU (not a CPU driver)."""
    from vkdelegate.runtime import default_device

    return default_device(program.options.device).info.type != "cpu"


def _parameter_bytes(model, scheme) -> int:
    """Bytes of the model's parameters as the program holds them: fp32, or each
    linear's weight quantized (int4: two weights a byte and an fp32 scale per group of
    32; int8: a byte a weight and an fp32 scale per row), the rest fp32."""
    linears = {id(m.weight): m.weight for m in model.modules()
               if isinstance(m, torch.nn.Linear)}
    total = 0
    for p in {id(p): p for p in model.parameters()}.values():
        if id(p) in linears and scheme == "int4":
            n, k = p.shape
            total += n * k // 2 + (k // GROUP) * n * 4
        elif id(p) in linears and scheme == "int8":
            n, k = p.shape
            total += n * k + n * 4
        else:
            total += p.numel() * p.element_size()
    return total


def _constant_bytes(path) -> int:
    """Bytes of the distinct segments a program file's methods read as constants
    (every delegate's named data and the CPU glue's constants; not the state, not
    the delegate blobs)."""
    raw = open(path, "rb").read()
    _, _, _, offset, size, _, _ = struct.unpack("<8sIIQQQQ16x", raw[:64])
    manifest = json.loads(raw[offset:offset + size])
    used = set()
    for method in manifest["methods"].values():
        used |= {ref["segment"] for ref in method["constants"].values()}
        for d in method["delegates"]:
            used |= set(d["named_data"].values())
    return sum(manifest["segments"][s]["size"] for s in used)


@pytest.mark.parametrize("scheme", [None, "int4", "int8"], ids=["fp32", "int4", "int8"])
def test_each_weight_stored_once(tmp_path, scheme):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("transformers")
    if scheme is not None:
        pytest.importorskip("torchao")
    from vkdelegate.llm import generate, lower

    model = _model()
    expected = _parameter_bytes(model, scheme)
    program = lower(model, 32, quantization=scheme,
                    group_size=None if scheme in (None, "int8") else GROUP)
    try:
        path = tmp_path / "llm.vkp"
        program.save(path)
        stored = _constant_bytes(path)
        assert expected <= stored <= RATIO * expected, (stored, expected)
        prompt = torch.randint(0, VOCAB, (8,),
                               generator=torch.Generator().manual_seed(5)).tolist()
        want = hf_greedy(model, prompt, 24)
        assert len(set(want)) > 1
        assert generate(program, prompt, 24) == want
        # On the device too, every method's weights once (runtime/constant_pool.py):
        # prefill, decode and decode_next share one buffer per weight and layout. The
        # int4 / int8 texel layouts of prefill's several-row product (lavapipe) differ
        # from decode's: at most two layouts of each weight, never three copies.
        memory = program.device_memory()
        pooled = memory["constants"]
        # The KV cache and the decode loop's record live in state buffers, counted apart,
        # and no method keeps memory of its own for a state the shared buffer replaced.
        assert memory["state"] > 0
        # generate builds every method (LoweredProgram.build), decode too, which it
        # does not call: its states are bound at the build.
        for name in ("prefill", "decode", "decode_next"):
            graph = program.runner(name).delegates[0].loaded
            assert graph.shared_states, name
            for i, state in graph.shared_states.items():
                t = graph.inputs[i]
                assert t.buffer is state.buffer and id(t.buffer) not in \
                    graph.values.owned_ids, (name, i)
        layouts = 1 if scheme is None or _gpu(program) else 2
        assert expected <= pooled <= layouts * RATIO * expected + 2**17, (pooled, expected)
    finally:
        program.close()
