"""Pure ATen operators outside the core opset (allowed_ops.NON_CORE) run on the CPU
between Vulkan ops, match eager, and survive save and load: a model that uses
torch.cumprod, var_mean, Tensor.unfold, sort(stable=True), round(decimals=),
searchsorted, bucketize, median, kthvalue, cummax, logcumsumexp, masked_select, unique
or antialiased interpolation lowers instead of being refused."""
import pytest
import torch
import torch.nn.functional as F

import vkdelegate
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import allowed_ops

EDGES = torch.tensor([-1.0, -0.25, 0.0, 0.5, 1.5])

#: name: (function of x, the non-core op it leaves on the CPU)
CASES = {
    "cumprod": (lambda x: torch.cumprod(x * 0.5 + 1, -1), "aten.cumprod.default"),
    "var_mean": (lambda x: torch.stack(torch.var_mean(x, -1)), "aten.var_mean.correction"),
    "unfold": (lambda x: x.unfold(-1, 3, 2) * 2, "aten.unfold.default"),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, -1), "aten.logcumsumexp.default"),
    "round_decimals": (lambda x: torch.round(x * 3, decimals=1), "aten.round.decimals"),
    "sort_stable": (lambda x: torch.sort(x.round(), dim=-1, stable=True)[1].float(),
                    "aten.sort.stable"),
    "searchsorted_right": (lambda x: torch.searchsorted(EDGES, x.round(), right=True),
                           "aten.searchsorted.Tensor"),
    "bucketize": (lambda x: torch.bucketize(x * 2, EDGES).float(), "aten.bucketize.Tensor"),
    "median": (lambda x: x.median(-1).values + x.median(), "aten.median.dim"),
    "kthvalue": (lambda x: torch.kthvalue(x, 2, -1).values, "aten.kthvalue.default"),
    "cummax": (lambda x: torch.cummax(x, -1)[0] - torch.cummin(x, -1)[0],
               "aten.cummax.default"),
    "masked_select": (lambda x: (x + 1).masked_select(x > 0) * 2,
                      "aten.masked_select.default"),
    "unique": (lambda x: torch.unique((x * 2).round()) + 1, "aten._unique2.default"),
    "interpolate_antialias": (lambda x: F.interpolate(
        x[None, None], size=(2, 3), mode="bilinear", antialias=True) * 2,
        "aten._upsample_bilinear2d_aa.default"),
}


class Model(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return torch.relu(self.fn(torch.tanh(x) * 1.5))


@pytest.mark.parametrize("case", sorted(CASES))
def test_non_core_op_runs_on_the_cpu_between_vulkan_ops(case, executor, tmp_path):
    fn, op = CASES[case]
    assert op in allowed_ops.NON_CORE
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=g)
    model = Model(fn)
    program = to_backend(torch.export.export(model, (x,)),
                         VulkanPartitioner({"executor": executor}))
    assert op in {d.op for d in program.report.cpu_nodes}
    assert program.report.num_partitions >= 1  # the tanh / relu run on Vulkan
    program.save(tmp_path / "p.vkdp")
    with vkdelegate.load(tmp_path / "p.vkdp") as loaded:
        for seed in (1, 2):
            x = torch.randn(4, 9, generator=g)
            want = model(x)
            for runner in (program, loaded):
                torch.testing.assert_close(runner(x), want, rtol=1e-5, atol=1e-5)


def test_searchsorted_side_is_a_checked_choice():
    assert allowed_ops.STR_CHOICES["aten.searchsorted.Tensor"] == {
        "side": ("left", "right")}
