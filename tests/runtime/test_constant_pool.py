"""runtime/constant_pool.py at the runtime level: graphs built with one ConstantPools
share each named constant's buffer (staging or mapped), the pool lives while a graph
is attached, and a load that fails before its uploads ran leaves no unwritten entry
behind for the next graph to bind."""
import numpy as np
import pytest
import torch

from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend

pytestmark = pytest.mark.skipif(bool(vulkan_unavailable()),
                                reason=vulkan_unavailable() or "")


def _linear_delegate(seed: int, k: int = 64, n: int = 48):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n).eval()
    x = torch.randn(3, k)
    program = to_backend(torch.export.export(lin, (x,)), VulkanPartitioner())
    d = program.methods["forward"].delegates[0]
    with torch.no_grad():
        want = lin(x).numpy()
    return d.blob, d.named_data, x.numpy(), want


@pytest.mark.parametrize("staging", [False, True], ids=["mapped", "staging"])
def test_graphs_share_pooled_buffers(staging):
    from vkdelegate.runtime import load_delegate
    from vkdelegate.runtime.constant_pool import ConstantPools

    blob, named, x, want = _linear_delegate(0)
    pools = ConstantPools()
    a = load_delegate(blob, named, constant_pools=pools, staging=staging)
    pool = pools.for_device(a.device, staging)
    held = pool.nbytes
    assert held >= sum(len(v) for v in named.values())
    b = load_delegate(blob, dict(named), constant_pools=pools, staging=staging)
    assert pool.nbytes == held  # the second graph added nothing
    for g in (a, b):
        np.testing.assert_allclose(g.execute([x])[0], want, rtol=1e-4, atol=1e-4)
    a.close()
    np.testing.assert_allclose(b.execute([x])[0], want, rtol=1e-4, atol=1e-4)
    b.close()
    assert pool.nbytes == 0 and pool.entries == 0  # freed with the last graph


def test_a_failed_load_leaves_no_unwritten_entry(monkeypatch):
    """Staging: a pooled constant's bytes are copied at the end of the load. A graph
    whose load fails before that must take its entries out of the pool, or the next
    graph would bind a buffer that was never written."""
    from vkdelegate.runtime import commands, load_delegate
    from vkdelegate.runtime.constant_pool import ConstantPools

    other_blob, other_named, other_x, other_want = _linear_delegate(1, 32, 16)
    blob, named, x, want = _linear_delegate(2)
    pools = ConstantPools()
    keeper = load_delegate(other_blob, other_named, constant_pools=pools, staging=True)
    pool = pools.for_device(keeper.device, True)
    kept = set(pool._entries)

    def broken(*args, **kwargs):
        raise VkDelegateError("injected: descriptor sets")
    with monkeypatch.context() as m:
        m.setattr(commands, "create_descriptor_sets", broken)
        with pytest.raises(VkDelegateError, match="injected"):
            load_delegate(blob, named, constant_pools=pools, staging=True)
    # The failed graph's entries are gone, but for those written directly (a CPU
    # driver maps even device-local memory: nothing was queued for them).
    left = {k: e for k, e in pool._entries.items() if k not in kept}
    assert all(e.buffer.host is not None for e in left.values()), left
    good = load_delegate(blob, named, constant_pools=pools, staging=True)
    np.testing.assert_allclose(good.execute([x])[0], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(keeper.execute([other_x])[0], other_want, rtol=1e-4,
                               atol=1e-4)
    good.close()
    keeper.close()


def test_a_dispatch_writing_a_constant_is_refused():
    """Pooled buffers are other graphs' too: a crafted graph whose node writes a
    constant tensor (its output names a constant) is refused at load."""
    from vkdelegate.runtime import load_delegate
    from vkdelegate.runtime.constant_pool import ConstantPools
    from vkdelegate.serialization.blob import read_blob, write_blob

    class AddConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.arange(8.0))
            self.register_buffer("d", torch.ones(8))

        def forward(self, x):
            return x + self.c, self.c + self.d

    x = torch.randn(8)
    program = to_backend(torch.export.export(AddConstant(), (x,)), VulkanPartitioner())
    d = program.methods["forward"].delegates[0]
    decoded = read_blob(d.blob)
    graph = decoded.graph
    # Point the first node's output at a constant tensor: it would write the weight.
    const = next(i for i, v in enumerate(graph.values)
                 if getattr(v, "constant_id", -1) >= 0)
    node = graph.chain[0]
    node.args[-1] = const
    blob = write_blob(graph, bytes(decoded.constants_section))
    with pytest.raises(VkDelegateError, match="writes constant"):
        load_delegate(blob, d.named_data, constant_pools=ConstantPools())
