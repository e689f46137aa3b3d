"""HFDecoder hands the model OUR static cache under the name its forward takes
(``cache`` in transformers 5.24, ``past_key_values`` before), and refuses a model that
ignores it (one that makes its own cache would leave the program's cache empty)."""
import pytest
import torch

from tests.llm.models import make_model
from vkdelegate.errors import VkDelegateError

pytest.importorskip("transformers")


def test_prefill_writes_our_cache_buffers():
    from vkdelegate.llm.decoder import HFDecoder

    model = make_model("llama")
    decoder = HFDecoder(model, 16)
    embeds = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = decoder.logits(embeds, torch.tensor([0]))
        expected = model(inputs_embeds=embeds).logits[0, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    k = decoder.kv_cache.k_0
    assert k[:, :, :3].abs().amax(-1).min() > 0 and not k[:, :, 3:].any()


def test_a_model_that_ignores_the_cache_raises():
    from vkdelegate.llm import export_methods
    from vkdelegate.llm.decoder import HFDecoder

    model = make_model("llama")
    forward = model.forward

    def own_cache(*args, cache=None, past_key_values=None, **kwargs):
        return forward(*args, **kwargs)  # the model falls back to a DynamicCache
    model.forward = own_cache
    with pytest.raises(VkDelegateError, match="did not use the static cache"):
        HFDecoder(model, 16).logits(torch.zeros(1, 2, 64), torch.tensor([0]))
    with pytest.raises(VkDelegateError, match="did not use the static cache"):
        export_methods(model, 16)


def test_repeat_kv_of_the_cache_folds_into_gqa_sdpa(monkeypatch):
    # transformers' repeat_kv (unsqueeze, expand, reshape: a copy of each layer's whole
    # cache, n_rep times, per step) -> SDPA(enable_gqa=True) on the cache itself. On
    # the path of models that keep transformers' sdpa and mask (the mask-free
    # vkdelegate.sdpa_at path, decoder.uses_position_attention, has no repeat_kv: the
    # op reads the cache itself, test_decode_has_no_repeat_kv).
    from vkdelegate.backend.passes.cache_positions import fold_repeat_kv
    from vkdelegate.llm import decoder, export_methods

    monkeypatch.setattr(decoder, "uses_position_attention", lambda model: False)
    aten = torch.ops.aten
    graph = export_methods(make_model("llama"), 16)["decode"].graph_module.graph
    assert fold_repeat_kv(graph)
    sdpa = [n for n in graph.nodes if n.target == aten.scaled_dot_product_attention.default]
    assert len(sdpa) == 2 and all(n.kwargs.get("enable_gqa") for n in sdpa)
    for n in sdpa:  # key and value: [1, 2 KV heads, 16 positions, 16], the cache
        assert [tuple(a.meta["val"].shape) for a in n.args[1:3]] == [(1, 2, 16, 16)] * 2
    assert not any(n.target == aten.expand.default and n.meta["val"].dim() == 5
                   for n in graph.nodes)


def test_decode_has_no_repeat_kv():
    # vkdelegate.sdpa_at takes the [1, Hk, S, E] cache as it is (grouped-query heads).
    from vkdelegate.llm import export_methods

    aten = torch.ops.aten
    graph = export_methods(make_model("llama"), 16)["decode"].graph_module.graph
    at = [n for n in graph.nodes if n.target == torch.ops.vkdelegate.sdpa_at.default]
    assert len(at) == 2
    for n in at:
        assert [tuple(a.meta["val"].shape) for a in n.args[1:3]] == [(1, 2, 16, 16)] * 2
    # No copy of a cache per head group: repeat_kv's expand is 5-D ([B, Hk, n, S, E]);
    # transformers 5.17's rotary embedding has an expand of its own (3-D inv_freq).
    assert not any(n.target == aten.expand.default and n.meta["val"].dim() == 5
                   for n in graph.nodes)


class _Cache(torch.nn.Module):
    """A cache written at positions (index_copy_, as transformers' StaticLayer does) and
    read after; with ``peek`` its old value is read first too (then it cannot be
    updated in place: the copy stays)."""

    def __init__(self, peek: bool):
        super().__init__()
        self.peek = peek
        self.register_buffer("cache", torch.zeros(1, 2, 8, 4))

    def forward(self, k, pos):
        old = self.cache.sum() if self.peek else 0.0
        self.cache.index_copy_(2, pos, k)
        return self.cache * 2.0 + old


@pytest.mark.parametrize("peek", [False, True], ids=["in_place", "read_before"])
def test_state_update_in_place_only_where_nothing_else_reads_it(peek):
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate import VulkanPartitioner, to_backend

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    eager = _Cache(peek)
    program = to_backend(torch.export.export(
        _Cache(peek), (torch.zeros(1, 2, 1, 4), torch.tensor([0]))), VulkanPartitioner())
    gen = torch.Generator().manual_seed(3)
    for step in (0, 3, 1, 7):
        k, pos = torch.randn(1, 2, 1, 4, generator=gen), torch.tensor([step])
        torch.testing.assert_close(program(k, pos), eager(k, pos), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(program.state_dict()["cache"], eager.cache)
    (graph,) = [d.loaded for d in program.runner("forward").delegates]
    ((i, j),) = graph.state_bindings.items()
    assert (graph.outputs[j].buffer is graph.inputs[i].buffer) == (not peek)
    assert program.last_transfer()["state_upload_bytes"] == 0


@pytest.mark.parametrize("heads,dims,seq,dtype,message", [
    # one buffer of 2^33 + bytes: over LoadLimits.max_tensor_bytes (8 GiB)
    ([8], [128], 1 << 22, torch.float32, "max_tensor_bytes"),
    # 64 layers of 1 GiB buffers: 128 GiB, over max_device_bytes (32 GiB)
    ([8] * 64, [128], 1 << 18, torch.float32, "max_device_bytes"),
])
def test_cache_size_checked_before_allocation(heads, dims, seq, dtype, message):
    from vkdelegate.llm.decoder import KVCache, check_cache_size

    dims = dims * len(heads)
    with pytest.raises(VkDelegateError, match=message) as info:
        KVCache(heads, dims, seq, dtype)
    assert f"max_seq_len {seq}: the KV cache would take" in str(info.value)
    # a cache in bounds: its bytes
    assert check_cache_size([2, 2], [16, 16], 64, torch.float16) == 2 * 2 * 2 * 64 * 16 * 2
