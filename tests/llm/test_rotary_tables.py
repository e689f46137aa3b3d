"""passes/rotary_tables: a decode step's rotary cos/sin read from a table of eager's
values (one row gather) instead of computed on the device every step.

The table's rows are HF's own rotary embedding at each position, bit for bit (the
float32 prelude and its cast, as HF eager computes them in a decode step); a
HF-style layer (transformers 5.24's product and older versions' matmul of the expanded
inv_freq, with and without attention scaling) lowers to one aten.index.Tensor before
its rotary cache write, whose q' and caches are bitwise the same graph's with eager's
cos/sin passed in as inputs, at every position the cache accepts (negative ones wrap
as the write's index does); positions past the cache raise; what the pass must not
take (a prefill's T positions, cos/sin reading another input, compile option
rotary_tables off) keeps the prelude."""
import sys

import pytest
import torch
from torch import nn

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import make_model
from tests.ops.harness import delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.errors import VkDelegateError

TABLE_OPS = {"aten.index.Tensor", "vkdelegate.narrow_last.default"}
PRELUDE_OPS = {"aten.cos.default", "aten.sin.default", "aten.cat.default",
               "aten._to_copy.default", "aten.mul.Tensor", "aten.bmm.default",
               "vkdelegate.fused_elementwise.default"}
S, D = 10, 8


def _prepared(ep, options=None):
    from vkdelegate.backend.to_backend import mutated_buffers

    return VulkanPartitioner(options).prepare(ep, mutated_buffers(ep))


def _tables(pg) -> list:
    return [v for k, v in pg.constants.items() if k.startswith("rotary_cos_sin_table")]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma"])
def test_table_rows_are_hf_rotary_embedding_bit_for_bit(kind):
    """Row p (p >= 0) and row 2 S + p (p < 0) of the decode method's table hold HF's
    rotary_emb(x, position_ids=[[p]]) cos and sin, float16, exactly."""
    pytest.importorskip("transformers")
    from vkdelegate.llm.lower import export_methods

    sin_offset = sys.modules["vkdelegate.backend.passes.rotary_tables"].sin_offset
    model = make_model(kind).half()
    methods = export_methods(model, MAX_SEQ_LEN)
    for name in ("decode", "decode_next"):
        pg = _prepared(methods[name])
        (table,) = _tables(pg)
        assert table.dtype == torch.float16 and table.shape[0] == 2 * MAX_SEQ_LEN, name
        x = torch.zeros(1, 1, model.config.hidden_size, dtype=torch.float16)
        for p in (0, 1, 7, 41, MAX_SEQ_LEN - 1, -1, -MAX_SEQ_LEN):
            with torch.no_grad():
                cos, sin = model.model.rotary_emb(x, torch.tensor([[p]]))
            row = table[p if p >= 0 else 2 * MAX_SEQ_LEN + p]
            at = sin_offset(cos.numel(), cos.dtype)
            assert at * 2 % 256 == 0 and table.shape[1] == at + sin.numel()
            assert torch.equal(row[:cos.numel()], cos.reshape(-1)), (name, p)
            assert torch.equal(row[at:], sin.reshape(-1)), (name, p)
    # The prefill's T positions keep the prelude.
    prefill = _prepared(methods["prefill"])
    assert not _tables(prefill)


def _rotate_half(x):
    return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)


class Layer(nn.Module):
    """A HF decoder layer's rotary embedding and K/V cache writes at one position:
    ``form`` "mul" (transformers 5.24: position_ids[..., None].float() * inv_freq) or
    "matmul" (older: inv_freq[None, :, None] @ position_ids[:, None, :], transposed),
    cos/sin times ``scaling`` and cast to the cache's dtype; ``given`` takes cos and
    sin as inputs instead (the same graph with eager's values passed in); ``extra``
    scales the angles by another input (not a function of the position alone)."""

    def __init__(self, form="mul", scaling=1.0, dtype=torch.float16, given=False,
                 extra=False):
        super().__init__()
        self.form, self.scaling, self.given, self.extra = form, scaling, given, extra
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float) / D))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.register_buffer("kc", torch.zeros(1, 2, S, D, dtype=dtype))
        self.register_buffer("vc", torch.zeros(1, 2, S, D, dtype=dtype))

    def cos_sin(self, pos, dtype, factor=None):
        position_ids = pos[None]
        if self.form == "mul":
            freqs = position_ids[..., None].float() * self.inv_freq.float()
        else:
            inv = self.inv_freq[None, :, None].float().expand(1, -1, 1)
            freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        if factor is not None:
            freqs = freqs * factor
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.scaling).to(dtype).unsqueeze(1),
                (emb.sin() * self.scaling).to(dtype).unsqueeze(1))

    def forward(self, q, k, v, pos, cos=None, sin=None):
        if not self.given:
            cos, sin = self.cos_sin(pos, q.dtype, cos if self.extra else None)
        qr = q * cos + _rotate_half(q) * sin
        kr = k * cos + _rotate_half(k) * sin
        self.kc.index_copy_(2, pos, kr)
        self.vc.index_copy_(2, pos, v)
        return qr


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, 1, D, generator=g).to(dtype) for h in (4, 2, 2))


def _ops(program) -> set:
    return {op for op, _ in delegated_nodes(program)}


@pytest.mark.parametrize("form, scaling, dtype", [
    ("mul", 1.0, torch.float16), ("matmul", 1.0, torch.float16),
    ("mul", 0.7, torch.float16), ("mul", 1.0, torch.float32), ("matmul", 1.3, torch.float32)])
def test_layer_reads_the_table_bitwise_eager_cos_sin(form, scaling, dtype):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    q, k, v = _inputs(dtype)
    args = (q, k, v, torch.tensor([3]))
    table = to_backend(torch.export.export(Layer(form, scaling, dtype), args),
                       VulkanPartitioner())
    ops = _ops(table)
    assert TABLE_OPS <= ops and not PRELUDE_OPS & ops, ops
    assert "vkdelegate.rotary_index_put_pair.default" in ops, ops
    eager = Layer(form, scaling, dtype)
    cos, sin = eager.cos_sin(torch.tensor([3]), dtype)
    given = to_backend(torch.export.export(Layer(form, scaling, dtype, given=True),
                                           args + (cos, sin)), VulkanPartitioner())
    for step, p in enumerate([3, 0, S - 1, 5, -1, -S]):
        q, k, v = _inputs(dtype, step)
        pos = torch.tensor([p])
        cos, sin = eager.cos_sin(pos, dtype)
        got, want = table(q, k, v, pos), given(q, k, v, pos, cos, sin)
        assert torch.equal(got, want), p
        caches, given_caches = table.state_dict(), given.state_dict()
        for name in ("kc", "vc"):
            assert torch.equal(caches[name], given_caches[name]), (p, name)
        if p < 0:
            # The exported graph's index_put wraps a negative position (eager's
            # index_copy_ raises): the two lowered graphs agree, eager has no value.
            continue
        torch.testing.assert_close(got, eager(q, k, v, pos), rtol=2e-3, atol=2e-3)
        for name in ("kc", "vc"):
            torch.testing.assert_close(caches[name], getattr(eager, name), rtol=2e-3,
                                       atol=2e-3)
    for p in (S, -S - 1):  # the cache write refuses it
        with pytest.raises(VkDelegateError, match="out of range"):
            table(q, k, v, torch.tensor([p]))


def test_cos_sin_of_another_input_keep_the_prelude():
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    q, k, v = _inputs(torch.float32)
    args = (q, k, v, torch.tensor([3]), torch.tensor(0.5))
    program = to_backend(torch.export.export(Layer(dtype=torch.float32, extra=True), args),
                         VulkanPartitioner())
    ops = _ops(program)
    assert "aten.index.Tensor" not in ops and "aten.cos.default" in ops, ops
    eager = Layer(dtype=torch.float32, extra=True)
    torch.testing.assert_close(program(*args), eager(*args), rtol=1e-5, atol=1e-5)


def test_option_off_keeps_the_prelude():
    pytest.importorskip("transformers")
    from vkdelegate.llm.lower import export_methods

    methods = export_methods(make_model("llama").half(), MAX_SEQ_LEN)
    on, off = (_prepared(methods["decode"], {"rotary_tables": flag}) for flag in (True, False))
    assert _tables(on) and not _tables(off)
    targets = {str(n.target) for n in off.gm.graph.nodes if n.op == "call_function"}
    assert "aten.cat.default" in targets, targets
