"""passes/unique_index_put: an accumulating index_put whose constant positions name each
element once (``nn.functional.fold`` with non-overlapping patches, as MobileViT v2
folds its patches back) becomes gather + add + index_put over the indexed dims merged,
all on Vulkan, with eager's bits; overlapping patches (a real scatter-add) and
positions from an input stay on the CPU, still eager's values."""
import pytest
import torch
from torch import nn

from tests.ops.harness import delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.passes.unique_index_put import _flat_positions

ACC = "aten.index_put.default"


class Fold(nn.Module):
    """Patches [B, C * k * k, L] folded into [B, C, H, W], times 2 first (so that the
    values are computed, not an input) and plus the image after."""

    def __init__(self, size, kernel, stride):
        super().__init__()
        self.size, self.kernel, self.stride = size, kernel, stride

    def forward(self, patches, image):
        out = nn.functional.fold(patches * 2, self.size, self.kernel, stride=self.stride)
        return out + image


def _lower(model, args):
    with torch.no_grad():
        ep = torch.export.export(model, args)
    return to_backend(ep, VulkanPartitioner())


def _cpu_nodes(program):
    return [d.op for m in program.methods.values() for d in m.report.decisions
            if getattr(d, "reasons", None)]


@pytest.mark.parametrize("size,kernel", [((8, 8), 2), ((6, 9), 3), ((4, 4), 4)])
def test_non_overlapping_fold_runs_on_vulkan_with_eager_bits(size, kernel):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(0)
    model = Fold(size, kernel, kernel)
    blocks = (size[0] // kernel) * (size[1] // kernel)
    patches = torch.randn(2, 3 * kernel * kernel, blocks)
    patches[0, 0, 0] = -0.0
    image = torch.randn(2, 3, *size)
    program = _lower(model, (patches, image))
    assert not _cpu_nodes(program), program.report
    assert ACC in [name for name, _ in delegated_nodes(program)]
    assert torch.equal(program(patches, image), model(patches, image))
    program.close()


def test_overlapping_fold_stays_on_the_cpu():
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(1)
    model = Fold((6, 6), 3, 1)  # 16 overlapping 3 x 3 patches: a real scatter-add
    patches, image = torch.randn(1, 9, 16), torch.randn(1, 1, 6, 6)
    program = _lower(model, (patches, image))
    assert ACC in _cpu_nodes(program)
    torch.testing.assert_close(program(patches, image), model(patches, image))
    program.close()


def test_flat_positions():
    i = torch.tensor([[0], [1]])
    j = torch.tensor([0, -1])  # -1 wraps to 2
    d0, d1, flat = _flat_positions((5, 2, 3), [None, i, j])
    assert (d0, d1) == (1, 2) and flat.tolist() == [[0, 2], [3, 5]]
    assert _flat_positions((5, 2, 3), [None, i, torch.tensor([0, 3])]) is None  # 3 >= 3
    assert _flat_positions((5, 2, 3), [None, i, torch.tensor([1, -2])]) is None  # repeat
    assert _flat_positions((5, 2, 3), [i, None, j]) is None  # not adjacent
    assert _flat_positions((5, 2, 3), [torch.tensor([True, False])]) is None  # a mask
