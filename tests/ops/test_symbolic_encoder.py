"""A transformer encoder layer exported with a dynamic sequence length: symbolic
sizes cause no partition boundary, and the lowered program matches eager at several
sequence lengths (growing, then shrinking) on Vulkan and on the reference executor."""
import pytest
import torch
from torch.export import Dim

from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.ops import registry
from tests.vulkan_skip import vulkan_unavailable

#: Ops other engineers are adding (layer_norm: `norms`, Scalar ops: `scalarops`); a
#: node of one of these may stay on the CPU only while the registry lacks the op, so
#: the expected set shrinks by itself as they land. Nothing else may.
PENDING = frozenset({"aten.native_layer_norm.default", "aten.mul.Scalar", "aten.erf.default",
                     "aten.scaled_dot_product_attention.default"})
SEQ = (7, 32, 3, 2, 17, 32, 5)


def _layer(norm_first: bool, activation: str):
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True,
                                            norm_first=norm_first,
                                            activation=activation).eval()


def _cpu_ops(report) -> set:
    # A getitem stays where its producer is: it is reported, but it is no boundary of
    # its own.
    return {d.op for d in report.cpu_nodes if d.op != "operator.getitem"}


@pytest.mark.parametrize("executor", ["vulkan", "reference"])
@pytest.mark.parametrize("norm_first,activation",
                         [(False, "relu"), (True, "relu"), (False, "gelu"), (True, "gelu")])
def test_encoder_layer_with_a_dynamic_sequence(norm_first, activation, executor):
    if executor == "vulkan" and vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    layer = _layer(norm_first, activation)
    seq = Dim("seq", min=2, max=32)
    ep = torch.export.export(layer, (torch.randn(2, 7, 16),), dynamic_shapes=({1: seq},))
    program = to_backend(ep, VulkanPartitioner({"executor": executor}))
    report = program.methods["forward"].report
    present = {d.op for d in report.decisions}
    expected = {op for op in PENDING & present if op not in registry.load_all()}
    assert _cpu_ops(report) == expected, str(report)
    assert not any("symbolic" in r for d in report.cpu_nodes for r in d.reasons), str(report)
    if not expected:
        assert report.num_partitions == 1, str(report)
    for n in SEQ:
        x = torch.randn(2, n, 16, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(program(x), layer(x), rtol=1e-4, atol=1e-4)
    program.close()


def test_multihead_attention_on_the_reference_executor():
    """The reference executor ran nn.MultiheadAttention's permute -> select -> view
    with the lowering's clone removed and failed ("view size is not compatible with
    input tensor's size and stride"); CPU views now use reshape semantics."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x, mask):
            return self.mha(x, x, x, key_padding_mask=mask, need_weights=False)[0]

    x = torch.randn(2, 7, 16)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[1, 5:] = True
    module = Attention().eval()
    ep = torch.export.export(module, (x, mask))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    torch.testing.assert_close(program(x, mask), module(x, mask), rtol=1e-5, atol=1e-5)
