"""F.one_hot lowers: its arithmetic runs on Vulkan, the class-range checks its
decomposition emits (aten._assert_async.msg) run on the CPU glue and raise eager's
message for a class out of range, also after save and load."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from tests.torch_version import TORCH

#: On the GPU machine's torch 2.11 one_hot's decomposition emits no class-range check
#: (no aten._assert_async.msg), so a program lowered there raises nothing for a class out
#: of range (seen on an H100 lease, 2026-12-06). torch 2.13 (the pinned version) exports
#: the checks.
pytestmark = pytest.mark.skipif(
    TORCH < (2, 13), reason=f"torch {torch.__version__}'s export of one_hot has no "
                            f"class-range check (aten._assert_async.msg needs torch 2.13)")


class OneHot(torch.nn.Module):
    def forward(self, i, x):
        return F.one_hot(i, 5).float() * x


def _program(executor):
    n = Dim("n", min=2, max=32)
    ep = torch.export.export(OneHot(), (torch.tensor([0, 3, 4]), torch.randn(3, 5)),
                             dynamic_shapes=({0: n}, {0: n}))
    return to_backend(ep, VulkanPartitioner({"executor": executor}))


def test_one_hot_runs_on_vulkan_with_its_checks_on_the_cpu(executor, tmp_path):
    program = _program(executor)
    cpu = program.report.cpu_nodes
    assert [(d.op, d.reasons) for d in cpu] == [
        ("aten._assert_async.msg", ["no Vulkan implementation of aten._assert_async.msg "
                                    "(from the model's one_hot)"])] * 2
    assert program.report.num_partitions == 1
    g = torch.Generator().manual_seed(0)
    program.save(tmp_path / "p.vkdp")
    with vkdelegate.load(tmp_path / "p.vkdp") as loaded:
        for n in (2, 7, 32):
            i, x = torch.randint(0, 5, (n,), generator=g), torch.randn(n, 5, generator=g)
            for runner in (program, loaded):
                torch.testing.assert_close(runner(i, x), OneHot()(i, x), rtol=0, atol=0)


@pytest.mark.parametrize("classes,text", [
    ([0, 5, 1], "one_hot: Class values must be smaller than num_classes."),
    ([2, -1, 1], "one_hot: Class values must be non-negative."),
])
def test_a_class_out_of_range_raises_as_in_eager(executor, classes, text, tmp_path):
    i, x = torch.tensor(classes), torch.randn(3, 5)
    with pytest.raises(RuntimeError, match=re.escape(text.split(": ")[1])):
        OneHot()(i, x)
    program = _program(executor)
    program.save(tmp_path / "p.vkdp")
    with vkdelegate.load(tmp_path / "p.vkdp") as loaded:
        for runner in (program, loaded):
            with pytest.raises(VkDelegateError, match=r"CPU op aten\._assert_async\.msg "
                                                      r"\(node _assert_async(_1)?\) failed: "
                                                      r"RuntimeError: " + re.escape(text)):
                runner(i, x)
