"""Lowering passes: each changes the graph as intended and keeps eager's values."""
import pytest
import torch

from vkdelegate.ops import registry
from vkdelegate.backend.passes import fold_batch_norm, remove_noop_copies, run_passes
from vkdelegate.backend.passes.linear import addmm_to_linear
from vkdelegate.backend.program_graph import from_exported_program
from vkdelegate.ops.registry import FLOAT_DTYPES, OpSpec

aten = torch.ops.aten


def _run(pg, *inputs):
    """Execute the ProgramGraph's module with its constants, like the program would."""
    values = dict(pg.constants)
    values.update(pg.state)
    values.update(zip(pg.user_inputs, inputs))
    pg.gm.recompile()
    args = [values[n.name] for n in pg.gm.graph.find_nodes(op="placeholder")]
    return pg.gm(*args)


def _targets(pg):
    return [n.target for n in pg.gm.graph.nodes if n.op == "call_function"]


def _randomize_bn(bn):
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    bn.weight.data.normal_()
    bn.bias.data.normal_()


class ConvBn(torch.nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3, padding=1, bias=bias)
        self.bn = torch.nn.BatchNorm2d(5)
        self.conv2 = torch.nn.Conv2d(5, 7, 1, groups=1)
        self.bn2 = torch.nn.BatchNorm2d(7)

    def forward(self, x):
        return self.bn2(self.conv2(torch.relu(self.bn(self.conv(x)))))


@pytest.mark.parametrize("bias", [True, False])
def test_fold_batch_norm_into_conv(bias):
    torch.manual_seed(0)
    m = ConvBn(bias).eval()
    _randomize_bn(m.bn)
    _randomize_bn(m.bn2)
    x = torch.randn(2, 3, 11, 7)
    pg = from_exported_program(torch.export.export(m, (x,)))
    assert fold_batch_norm(pg)
    pg.drop_unused_constants()
    assert aten._native_batch_norm_legit_no_training.default not in _targets(pg)
    assert not any("running" in name for name in pg.constants)
    (out,) = _run(pg, x)
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)


def test_batch_norm_with_shared_conv_output_is_kept():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(2, 2, 1), torch.nn.BatchNorm2d(2)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y      # y is needed unnormalized too

    pg = from_exported_program(torch.export.export(M().eval(), (torch.randn(1, 2, 3, 3),)))
    assert not fold_batch_norm(pg)


@pytest.fixture
def with_linear(monkeypatch):
    registry.load_all()
    monkeypatch.setitem(registry.REGISTRY, "aten.linear.default",
                        OpSpec("aten.linear.default", FLOAT_DTYPES, lambda *a: None))


def test_linear_and_batch_norm1d(with_linear):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4),
                            torch.nn.Linear(4, 3, bias=False)).eval()
    _randomize_bn(m[1])
    x = torch.randn(5, 6)
    pg = from_exported_program(torch.export.export(m, (x,)))
    assert run_passes(pg) == ["addmm_to_linear", "fold_batch_norm"]
    assert _targets(pg) == [aten.linear.default, aten.linear.default]
    (out,) = _run(pg, x)
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)


def test_linear_pass_needs_registry_op(monkeypatch):
    registry.load_all()
    monkeypatch.delitem(registry.REGISTRY, "aten.linear.default", raising=False)
    m = torch.nn.Linear(3, 2)
    pg = from_exported_program(torch.export.export(m, (torch.randn(4, 3),)))
    assert not addmm_to_linear(pg)
    assert aten.addmm.default in _targets(pg)


def test_remove_noop_copies_keeps_returned_clone():
    class M(torch.nn.Module):
        def forward(self, x):
            a = x.clone() * 2
            b = a.to(torch.float32) + 1          # same dtype: no-op
            c = b.to(torch.float64)              # real conversion: kept
            return c, b.clone()                  # returned clone: kept

    x = torch.randn(3, 4)
    pg = from_exported_program(torch.export.export(M(), (x,)))
    assert remove_noop_copies(pg)
    targets = _targets(pg)
    assert targets.count(aten.clone.default) == 1
    assert aten._to_copy.default in targets
    out = _run(pg, x)
    for got, want in zip(out, M()(x)):
        torch.testing.assert_close(got, want)
    assert not remove_noop_copies(pg)           # nothing left to remove


def test_channels_last_copies_are_removed_unless_storage_is_read():
    """A clone / _to_copy to channels_last changes only strides: removed (YOLOS's
    position-embedding interpolation has one), but kept where as_strided, whose result
    depends on the strides, is in the graph, and where it is returned."""
    class M(torch.nn.Module):
        def __init__(self, strided=False):
            super().__init__()
            self.strided = strided

        def forward(self, x):
            cl = torch.channels_last
            a = x.clone(memory_format=cl)
            b = torch.ops.aten._to_copy.default(a * 2, memory_format=cl)
            out = b.flatten(2).transpose(1, 2) + 1
            if self.strided:
                out = out + torch.as_strided(a, (2, 3), (1, 2)).sum()
            return out, x.clone(memory_format=cl)  # returned: kept

    x = torch.randn(1, 3, 4, 5)
    for strided in (False, True):
        m = M(strided)
        pg = from_exported_program(torch.export.export(m, (x,)))
        remove_noop_copies(pg)
        copies = [n for n in pg.gm.graph.nodes if n.op == "call_function" and
                  n.kwargs.get("memory_format") == torch.channels_last]
        assert len(copies) == (3 if strided else 1), [n.format_node() for n in copies]
        out = _run(pg, x)
        for got, want in zip(out, m(x)):
            assert torch.equal(got, want)


def test_static_dtype_asserts_are_removed_and_others_kept():
    class M(torch.nn.Module):
        def forward(self, x, mask):
            keep = mask.to(torch.bool)            # export: _assert_tensor_metadata + copy
            return x.masked_fill(~keep, 0.0) * 2

    x, mask = torch.randn(2, 5), torch.tensor([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1]])
    pg = from_exported_program(torch.export.export(M(), (x, mask)))
    asserts = [n for n in pg.gm.graph.nodes if n.target == aten._assert_tensor_metadata.default]
    assert asserts, "export no longer emits _assert_tensor_metadata for .to(dtype)"
    # An assert on a dtype the value does not have must stay (it would raise).
    with pg.gm.graph.inserting_after(asserts[0]):
        wrong = pg.gm.graph.call_function(aten._assert_tensor_metadata.default,
                                          (asserts[0].args[0], None, None, torch.float16))
    assert remove_noop_copies(pg)
    left = [n for n in pg.gm.graph.nodes if n.target == aten._assert_tensor_metadata.default]
    assert left == [wrong]
    pg.gm.graph.erase_node(wrong)
    torch.testing.assert_close(_run(pg, x, mask)[0], M()(x, mask))


@pytest.mark.parametrize("bias", [True, False])
def test_fold_batch_norm_into_decomposed_linear(bias, monkeypatch):
    # Without aten.linear in the registry the layer stays addmm/mm(x, permute(w)).
    registry.load_all()
    monkeypatch.delitem(registry.REGISTRY, "aten.linear.default", raising=False)
    torch.manual_seed(2)
    m = torch.nn.Sequential(torch.nn.Linear(6, 4, bias=bias), torch.nn.BatchNorm1d(4)).eval()
    _randomize_bn(m[1])
    x = torch.randn(5, 6)
    pg = from_exported_program(torch.export.export(m, (x,)))
    assert run_passes(pg) == ["fold_batch_norm"]
    assert _targets(pg) == [aten.permute.default, aten.addmm.default]
    (out,) = _run(pg, x)
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)


class ConvClamp(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


@pytest.mark.parametrize("act,bounds", [
    (torch.nn.ReLU(), (0.0, None)),
    (torch.nn.ReLU6(), (0.0, 6.0)),
    (lambda y: torch.clamp(y, max=0.25), (None, 0.25)),
])
def test_fuse_conv_clamp(act, bounds):
    from vkdelegate.backend.passes.fuse_conv_clamp import FUSED, fuse_conv_clamp

    if FUSED not in registry.load_all():
        pytest.skip("the registry has no fused conv op")
    torch.manual_seed(4)
    m = ConvClamp(act).eval()
    x = torch.randn(1, 3, 6, 5) * 3
    pg = from_exported_program(torch.export.export(m, (x,)))
    assert fuse_conv_clamp(pg)
    (node,) = [n for n in pg.gm.graph.nodes if n.op == "call_function"]
    assert str(node.target) == FUSED and tuple(node.args[-2:]) == bounds
    (out,) = _run(pg, x)
    torch.testing.assert_close(out, m(x), rtol=1e-5, atol=1e-5)


def test_conv_read_twice_is_not_fused():
    from vkdelegate.backend.passes.fuse_conv_clamp import fuse_conv_clamp

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 2, 1)

        def forward(self, x):
            y = self.conv(x)
            return torch.relu(y), y

    pg = from_exported_program(torch.export.export(M(), (torch.randn(1, 2, 3, 3),)))
    assert not fuse_conv_clamp(pg)


class _ChannelsLastPool(torch.nn.Module):
    """torchvision ConvNeXt's head: a global average of a channels-last activation
    (adaptive_avg_pool2d(1) decomposes to mean + as_strided with the input's memory
    format), then a flatten."""

    def forward(self, x):
        x = torch.nn.functional.conv2d(x, torch.ones(8, 3, 1, 1))
        y = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels last
        return torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)


def test_as_strided_views():
    from vkdelegate import VulkanPartitioner, to_backend
    from vkdelegate.backend.passes.as_strided_views import as_strided_views

    x = torch.randn(2, 3, 5, 6)
    ep = torch.export.export(_ChannelsLastPool(), (x,))
    pg = from_exported_program(ep)
    assert torch.ops.aten.as_strided.default in _targets(pg)
    assert as_strided_views(pg)
    assert torch.ops.aten.as_strided.default not in _targets(pg)
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    torch.testing.assert_close(program(x), _ChannelsLastPool()(x))


class _RealStrides(torch.nn.Module):
    def forward(self, x):
        return x.as_strided((3, 2), (1, 3)) * 2  # a transpose through storage


def test_as_strided_with_other_strides_is_kept_and_refused():
    from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
    from vkdelegate.backend.passes.as_strided_views import as_strided_views

    ep = torch.export.export(_RealStrides(), (torch.randn(2, 3),))
    pg = from_exported_program(ep)
    assert not as_strided_views(pg)
    with pytest.raises(VkDelegateError, match="as_strided"):
        to_backend(ep, VulkanPartitioner({"executor": "reference"}))
