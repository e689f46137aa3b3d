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


def test_repeat_kv_of_the_cache_folds_into_gqa_sdpa():
    # transformers' repeat_kv (unsqueeze, expand, reshape: a copy of each layer's whole
    # cache, n_rep times, per step) -> SDPA(enable_gqa=True) on the cache itself.
    from vkdelegate.backend.passes.cache_positions import fold_repeat_kv
    from vkdelegate.llm import export_methods

    aten = torch.ops.aten
    graph = export_methods(make_model("llama"), 16)["decode"].graph_module.graph
    assert fold_repeat_kv(graph)
    sdpa = [n for n in graph.nodes if n.target == aten.scaled_dot_product_attention.default]
    assert len(sdpa) == 2 and all(n.kwargs.get("enable_gqa") for n in sdpa)
    for n in sdpa:  # key and value: [1, 2 KV heads, 16 positions, 16], the cache
        assert [tuple(a.meta["val"].shape) for a in n.args[1:3]] == [(1, 2, 16, 16)] * 2
    assert not any(n.target == aten.expand.default and n.meta["val"].dim() == 5
                   for n in graph.nodes)
