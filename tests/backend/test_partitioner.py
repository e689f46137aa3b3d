"""VulkanPartitioner: decisions, reasons, partitions, never raising.

The registry is patched per test (monkeypatch restores it) with declarations for ops
the real registry may or may not have, so that these tests do not depend on which op
families have landed.
"""
import logging

import pytest
import torch

from vkdelegate.ops import registry
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.ops.registry import FLOAT_DTYPES, OpSpec


def _impl(*args):  # runtime implementation; never called by the partitioner
    raise AssertionError("not called")


@pytest.fixture
def fake_ops(monkeypatch):
    """Declare sin (any float), cos (rule rejects rank > 1), exp (raising rule)."""
    registry.load_all()

    def rank_rule(node):
        return "cos only on 1-d tensors" if node.args[0].rank > 1 else None

    def broken_rule(node):
        raise RuntimeError("boom")

    specs = [
        OpSpec("aten.sin.default", FLOAT_DTYPES, _impl, shape_fn=lambda *a: None),
        OpSpec("aten.cos.default", FLOAT_DTYPES, _impl, rules=(rank_rule,)),
        OpSpec("aten.exp.default", FLOAT_DTYPES, _impl, rules=(broken_rule,)),
    ]
    for spec in specs:
        monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    return specs


class Chain(torch.nn.Module):
    def forward(self, x, i):
        a = torch.sin(x)
        b = torch.cos(a)           # rank 2: rejected by the rule
        c = torch.exp(b)           # the rule raises: stays on CPU with the reason
        d = torch.sin(c)
        return d, torch.sin(i.float()), torch.sort(x)[0]


def _ep():
    return torch.export.export(Chain(), (torch.randn(3, 5), torch.arange(4))
                               ).run_decompositions()


def _by_name(report):
    return {d.name: d for d in report.decisions}


def test_reasons_and_partitions(fake_ops, caplog):
    with caplog.at_level(logging.INFO, logger="vkdelegate"):
        report = VulkanPartitioner().report(_ep())
    d = _by_name(report)
    assert d["sin"].on_vulkan and d["sin_1"].on_vulkan
    assert d["cos"].reasons == ["cos only on 1-d tensors"]
    assert d["exp"].reasons == ["support check failed (RuntimeError: boom)"]
    assert any("no Vulkan implementation of aten.sort" in r
               for n in report.cpu_nodes for r in n.reasons)
    # sin and sin_1 are separated by CPU nodes: two partitions (sin of i.float() joins
    # one of them: independent nodes merge when that makes no cycle).
    assert report.num_partitions == 2
    assert len({d["sin"].partition, d["sin_1"].partition}) == 2
    assert report.summary() in caplog.text
    assert "cos only on 1-d tensors" in str(report)


def test_dtype_reason(fake_ops):
    ep = torch.export.export(Chain(), (torch.randn(3, 5).double(), torch.arange(4)))
    d = _by_name(VulkanPartitioner().report(ep.run_decompositions()))
    assert "argument 0 has dtype float64, supported: float16, float32" in d["sin"].reasons


def test_allow_and_block_lists(fake_ops):
    d = _by_name(VulkanPartitioner(operator_blocklist=[torch.ops.aten.sin.default])
                 .report(_ep()))
    assert d["sin"].reasons == ["in operator_blocklist"]
    d = _by_name(VulkanPartitioner(operator_allowlist=["aten.cos.default"]).report(_ep()))
    assert d["sin"].reasons == ["not in operator_allowlist"]


@pytest.mark.parametrize("lists, text", [
    ({"operator_blocklist": ["aten.relux.default"]},
     "operator_blocklist entry 'aten.relux.default' is not an operator torch or "
     "vkdelegate knows"),
    ({"operator_blocklist": ["aten.relu.defualt"]}, "entry 'aten.relu.defualt'"),
    ({"operator_allowlist": ["nosuchns.op.default"]},
     "operator_allowlist entry 'nosuchns.op.default'"),
    ({"operator_blocklist": ["relu"]}, "entry 'relu'"),
    ({"operator_blocklist": "aten.relu.default"},
     "operator_blocklist must be a list of ops .* got str 'aten.relu.default'"),
    ({"operator_blocklist": [3]}, "entry 3 of type int is not an operator"),
])
def test_unknown_list_entries_are_refused(lists, text):
    """A misspelled op name matched nothing, so the op stayed delegated, silently."""
    from vkdelegate import VkDelegateError

    with pytest.raises(VkDelegateError, match=text):
        VulkanPartitioner(**lists)


def test_list_entries_torch_or_the_registry_knows():
    """Overloads, overload packets (names and objects: they name every overload),
    ops only the registry knows (ExecuTorch's) and the glue's size operators."""
    import operator

    from vkdelegate import to_backend

    VulkanPartitioner(operator_blocklist=["aten.add.Tensor", "aten.linalg_det.default",
                                          "et_vk.prepack.default", "et_vk.prepack",
                                          "vkdelegate.fused_elementwise",
                                          "operator.mul", operator.getitem])

    class AddTwice(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x + 1.0) + x

    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(6))
    for blocked in ("aten.add", torch.ops.aten.add):
        program = to_backend(torch.export.export(AddTwice(), (x,)),
                             VulkanPartitioner({"executor": "reference",
                                                "fuse_elementwise": False},
                                               operator_blocklist=[blocked]))
        d = _by_name(program.report)
        assert d["add"].reasons == d["add_1"].reasons == ["in operator_blocklist"]
        assert d["relu"].on_vulkan
        torch.testing.assert_close(program(x), AddTwice()(x))


def test_dynamic_shapes(fake_ops):
    batch = torch.export.Dim("batch", min=2, max=16)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cos(torch.sin(x).sum(1))

    ep = torch.export.export(M(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    d = _by_name(VulkanPartitioner().report(ep.run_decompositions()))
    assert d["sin"].on_vulkan                  # resizable
    assert "dynamic shapes not supported by this op" in d["cos"].reasons
    d = _by_name(VulkanPartitioner({"require_dynamic_shapes": True})
                 .report(ep.run_decompositions()))
    assert d["sin"].on_vulkan


def test_unbounded_dynamic_dim_stays_on_cpu(fake_ops, caplog):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x)

    ep = torch.export.export(M(), (torch.randn(4, 3),),
                             dynamic_shapes=({0: torch.export.Dim("n")},))
    with caplog.at_level("WARNING", logger="vkdelegate"):
        d = _by_name(VulkanPartitioner().report(ep.run_decompositions()))
    assert "has no upper bound" in d["sin"].reasons[0]
    # Not silent: one warning, naming the user's Dim where export kept its name.
    warned = [r.getMessage() for r in caplog.records if "no upper bound" in r.getMessage()]
    assert len(warned) == 1 and "1 node(s) stay on the CPU" in warned[0], warned
    if "(s" in d["sin"].reasons[0]:  # torch kept the Dim's name: "n (s77)"
        assert "dynamic size n (s" in d["sin"].reasons[0]


def test_require_dynamic_shapes_rejects_static_only_ops(fake_ops):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cos(x)

    ep = torch.export.export(M(), (torch.randn(4),)).run_decompositions()
    assert _by_name(VulkanPartitioner().report(ep))["cos"].on_vulkan
    d = _by_name(VulkanPartitioner({"require_dynamic_shapes": True}).report(ep))
    assert d["cos"].reasons == ["op cannot be resized and require_dynamic_shapes is set"]


def test_linear_preserved_whole_when_supported():
    # aten.linear on a 3-D input decomposes into views around a matrix multiply; when
    # the registry runs linear, every linear node stays whole.
    if "aten.linear.default" not in registry.load_all():
        pytest.skip("the registry has no aten.linear.default")
    m = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    part = VulkanPartitioner()
    ep = torch.export.export(m, (torch.randn(2, 5, 8),))
    assert part.ops_to_preserve(ep) == {torch.ops.aten.linear.default}
    targets = [n.target for n in part.prepare(ep).gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.linear.default, torch.ops.aten.relu.default,
                       torch.ops.aten.linear.default]
    # float64 is not supported: the linear decomposes as usual.
    ep64 = torch.export.export(m.double(), (torch.randn(2, 5, 8).double(),))
    assert part.ops_to_preserve(ep64) == set()


@pytest.mark.parametrize("executor", ["reference", "vulkan"])
@pytest.mark.parametrize("pool", [torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(2)])
def test_conv_pool_conv_is_one_partition(pool, executor):
    # max_pool2d becomes max_pool2d_with_indices + getitem: the getitem (supported
    # with its producer) must not cut the graph into two partitions with the data
    # going through the host between them, as it did before.
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate import to_backend

    if executor == "vulkan" and vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), pool, torch.nn.Conv2d(4, 5, 3))
    x = torch.randn(1, 3, 16, 16)
    program = to_backend(torch.export.export(m, (x,)),
                         VulkanPartitioner({"executor": executor}))
    assert program.num_delegates() == 1
    assert program.report.num_partitions == 1
    assert all(d.on_vulkan for d in program.report.decisions)
    torch.testing.assert_close(program(x), m(x), rtol=1e-4, atol=1e-4)
