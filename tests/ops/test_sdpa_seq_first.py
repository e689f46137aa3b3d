"""passes/sdpa_seq_first: an ATen SDPA between head transposes of [B, L, H, E] tensors
becomes one ``vkdelegate.sdpa_seq_first`` node (the attention kernels' SEQ_FIRST forms),
no transpose copied. The outputs are torch.equal to the program lowered with compile
option ``sdpa_seq_first`` off (the same kernels reading the other layout: the same sums
in the same order) and close to eager: a HF BERT with a padding mask, masks of both
kinds, causal, grouped-query heads, fp16, a dynamic sequence length. Graphs the pass
must leave alone keep their transposes: an output read untransposed, a transpose of
other dims, dropout, the op or ATen's SDPA on the block list."""
import pytest
import torch
from torch import nn

from tests.ops.harness import check_op, delegated_nodes, dispatched_ops
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend

SEQ_FIRST = "vkdelegate.sdpa_seq_first.default"
ATEN = "aten.scaled_dot_product_attention.default"
PERMUTE = "aten.permute.default"


@pytest.fixture(autouse=True)
def _vulkan():
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())


class Heads(nn.Module):
    """Attention over x [B, L, H * E] as HF encoders write it: three projections viewed
    to [B, L, H, E] and transposed, SDPA, the output transposed back and merged.
    ``kv_heads`` < ``heads``: grouped-query (enable_gqa); ``tail``: "merge" (transpose
    back, reshape), "raw" (the SDPA output also returned untransposed), "swap23" (the
    output's last two dims swapped instead)."""

    def __init__(self, heads=4, kv_heads=4, e=16, causal=False, tail="merge", dropout=0.0):
        super().__init__()
        self.h, self.hk, self.e, self.causal, self.tail = heads, kv_heads, e, causal, tail
        self.dropout = dropout
        self.q = nn.Linear(heads * e, heads * e)
        self.k = nn.Linear(heads * e, kv_heads * e)
        self.v = nn.Linear(heads * e, kv_heads * e)

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, self.e).transpose(1, 2)
        k = self.k(x).view(b, n, self.hk, self.e).transpose(1, 2)
        v = self.v(x).view(b, n, self.hk, self.e).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal, dropout_p=self.dropout,
            enable_gqa=self.hk != self.h)
        if self.tail == "swap23":
            return out.transpose(2, 3).reshape(b, -1)
        merged = out.transpose(1, 2).reshape(b, n, self.h * self.e)
        return (merged, out) if self.tail == "raw" else merged


def _lower(model, args, on=True, dynamic_shapes=None, **partitioner):
    with torch.no_grad():
        ep = torch.export.export(model.eval(), args, dynamic_shapes=dynamic_shapes)
    return to_backend(ep, VulkanPartitioner({"sdpa_seq_first": on}, **partitioner))


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


def _first(out):
    """The first output: of a tuple, or of a HF ModelOutput (a Record once lowered)."""
    return out if isinstance(out, torch.Tensor) else out[0]


def _check(model, args, atol=2e-6, count=1):
    """Lower with the pass on and off: the fused program has ``count`` sdpa_seq_first
    nodes and no permute, its output torch.equal to the unfused one's and within
    ``atol`` of eager; four dispatches fewer per attention."""
    with torch.no_grad():
        want = _first(model.eval()(*args))
    fused, plain = _lower(model, args), _lower(model, args, on=False)
    ops, plain_ops = _ops(fused), _ops(plain)
    assert ops.count(SEQ_FIRST) == count and PERMUTE not in ops, ops
    assert SEQ_FIRST not in plain_ops and plain_ops.count(ATEN) == count
    got, ref = _first(fused(*args)), _first(plain(*args))
    assert torch.equal(got, ref)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    assert len(dispatched_ops(fused, *args)) == len(dispatched_ops(plain, *args)) - 4 * count
    fused.close()
    plain.close()


def _padding(b, n, keep):
    mask = torch.zeros(b, 1, n, n, dtype=torch.bool)
    for i, k in enumerate(keep):
        mask[i, ..., :k] = True
    return mask


@pytest.mark.parametrize("kind", ["none", "bool", "float", "causal"])
def test_masks_and_causal(kind):
    torch.manual_seed(0)
    model = Heads(causal=kind == "causal")
    x = torch.randn(2, 40, 64)
    mask = None
    if kind == "bool":
        mask = _padding(2, 40, [40, 23])
    elif kind == "float":
        mask = torch.randn(2, 4, 40, 40)
    _check(model, (x,) if mask is None else (x, mask))


@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_grouped_query_heads_and_float16(mask):
    torch.manual_seed(1)
    model = Heads(heads=8, kv_heads=2, e=32).half()
    x = torch.randn(1, 70, 256, dtype=torch.float16)
    args = (x,)
    if mask == "bool":
        args = (x, _padding(1, 70, [51]))
    elif mask == "float":
        args = (x, torch.randn(1, 1, 70, 70, dtype=torch.float16))
    _check(model, args, atol=2e-3)


def test_dynamic_sequence_length():
    torch.manual_seed(2)
    model = Heads()
    n = torch.export.Dim("n", min=2, max=64)
    x = torch.randn(2, 48, 64)
    fused = _lower(model, (x,), dynamic_shapes=({1: n},))
    plain = _lower(model, (x,), on=False, dynamic_shapes=({1: n},))
    assert _ops(fused).count(SEQ_FIRST) == 1
    for length in (48, 5, 64):
        xs = torch.randn(2, length, 64)
        got = fused(xs)
        assert torch.equal(got, plain(xs))
        with torch.no_grad():
            torch.testing.assert_close(got, model(xs), atol=2e-6, rtol=0)


def test_hf_bert_with_padding_mask():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128,
                           attn_implementation="sdpa")
    model = tf.BertModel(config, add_pooling_layer=False).eval()
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    _check(model, (ids, mask), count=2)


@pytest.mark.parametrize("tail", ["raw", "swap23"])
def test_output_read_otherwise_keeps_the_transposes(tail):
    torch.manual_seed(3)
    model = Heads(tail=tail)
    x = torch.randn(2, 24, 64)
    program = _lower(model, (x,))
    ops = _ops(program)
    assert SEQ_FIRST not in ops and ATEN in ops, ops
    with torch.no_grad():
        torch.testing.assert_close(_first(program(x)), _first(model(x)), atol=2e-6, rtol=0)
    program.close()


def test_dropout_is_left_alone():
    from vkdelegate.backend.passes.sdpa_seq_first import _match

    model = Heads(dropout=0.5)
    ep = torch.export.export(model.eval(), (torch.randn(1, 8, 64),))
    sdpa = [n for n in ep.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert len(sdpa) == 1 and sdpa[0].args[4] == 0.5 and _match(sdpa[0]) is None


@pytest.mark.parametrize("blocked", [SEQ_FIRST, ATEN])
def test_block_list(blocked):
    """Blocking the new op keeps ATen's SDPA (on Vulkan, transposes copied); blocking
    ATen's keeps it on the CPU, never delegated under the new name."""
    torch.manual_seed(4)
    model = Heads()
    x = torch.randn(2, 24, 64)
    program = _lower(model, (x,), operator_blocklist=[blocked])
    ops = _ops(program)
    assert SEQ_FIRST not in ops
    assert (ATEN in ops) == (blocked == SEQ_FIRST)
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), atol=2e-6, rtol=0)
    program.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mask", ["bool", "float"])
def test_check_op_masks(dtype, mask):
    """The harness's check (eager's values, the op in a delegate, nothing on the CPU) with
    each mask dtype, so that the registry's claims are covered."""
    torch.manual_seed(5)
    model = Heads().to(dtype)
    x = torch.randn(2, 33, 64).to(dtype)
    m = _padding(2, 33, [33, 20]) if mask == "bool" else torch.randn(2, 1, 33, 33).to(dtype)
    tol = dict(rtol=1e-2, atol=2e-3) if dtype == torch.float16 else dict(rtol=0, atol=2e-6)
    check_op(model, (x, m), ops=[SEQ_FIRST], **tol)
