"""passes/index_put_values: index_put values that broadcast to the written region (a
multi-query model's one K/V head written into a cache of several, as Falcon does on
transformers releases that keep its own attention) get an expand to the region and
run on Vulkan with eager's values; values that do not broadcast keep their reason."""
import pytest
import torch
from torch import nn

from tests.ops.harness import delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.passes.index_put_values import _expand_sizes


class CacheWrite(nn.Module):
    """k [B, 1, 1, E] (one K head, one position) written at ``pos`` into a cache
    [B, H, S, E] of H heads, then the cache times 2 (a computed output)."""

    def __init__(self, heads, seq, dim, batch=1):
        super().__init__()
        self.register_buffer("cache", torch.zeros(batch, heads, seq, dim))

    def forward(self, k, pos):
        self.cache[:, :, pos] = k
        return self.cache * 2


def _cpu_ops(program):
    return [d.op for m in program.methods.values() for d in m.report.decisions
            if getattr(d, "reasons", None)]


@pytest.mark.parametrize("batch,heads,k_shape", [(1, 4, (1, 1, 1, 16)), (2, 3, (2, 1, 1, 8)),
                                                 (1, 4, (16,))])
def test_broadcast_values_run_on_vulkan(batch, heads, k_shape):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(0)
    dim = k_shape[-1]
    model = CacheWrite(heads, 6, dim, batch)
    k, pos = torch.randn(k_shape), torch.tensor([3])
    with torch.no_grad():
        ep = torch.export.export(CacheWrite(heads, 6, dim, batch), (k, pos))
    program = to_backend(ep, VulkanPartitioner())
    assert not _cpu_ops(program), program.report
    ops = [name for name, _ in delegated_nodes(program)]
    assert "aten.expand.default" in ops, ops
    torch.testing.assert_close(program(k, pos), model(k, pos), rtol=0, atol=0)
    program.close()


def test_expand_sizes():
    ones = torch.empty(1, 1, 1, 16)
    assert _expand_sizes(ones, (1, 4, 1, 16)) == [-1, 4, -1, -1]
    assert _expand_sizes(torch.empty(16), (2, 4, 1, 16)) == [2, 4, 1, -1]
    assert _expand_sizes(torch.empty(1, 2, 1, 16), (1, 4, 1, 16)) is None  # 2 vs 4
    assert _expand_sizes(torch.empty(1, 1, 1, 1, 16), (1, 4, 1, 16)) is None  # rank
