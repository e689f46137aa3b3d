"""build_vkgraph on real torch.export programs, checked against eager PyTorch by
running the serialized graph with ATen ops (vkdelegate.backend.reference)."""
import hashlib

import pytest
import torch

from vkdelegate.backend import reference
from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob
from vkdelegate.serialization.builder import build_vkgraph

from .export_helpers import assert_well_formed, build, export


def run_blob(part, inputs):
    blob = read_blob(part.blob)
    assert blob.graph == part.graph
    assert_well_formed(blob.graph)
    ref = reference.ReferenceGraph.from_graph(
        blob.graph, lambda i: blob.constant_bytes(i, part.named_data),
        extra_ops=_TEST_OPS)
    return [torch.from_numpy(out) for out in ref.execute([x.numpy() for x in inputs])]


def check_against_eager(module, args, part=None, **kwargs):
    part = part or build(module, args, **kwargs)
    got = run_blob(part, list(args))
    expected = module(*args)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    return part


class Mixed(torch.nn.Module):
    """Linear, buffer, split (multi-output + getitem), dtype cast, reduction, view."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)
        self.register_buffer("shift", torch.linspace(-1, 1, 3))

    def forward(self, x):
        a, b = torch.split(x, [2, 3], dim=1)
        y = torch.relu(self.lin(x)) + self.shift
        z = y.to(torch.float16).sum(dim=[0], keepdim=True)
        return y, a * b.mean(), z, x.view(-1)


def test_mixed_module_matches_eager():
    torch.manual_seed(0)
    part = check_against_eager(Mixed(), (torch.randn(7, 5),))
    names = [op.name for op in part.graph.chain]
    assert "aten.split_with_sizes.default" in names and "operator.getitem" not in names
    assert "getitem" not in names


def test_args_are_in_schema_order_with_defaults_and_output_last():
    torch.manual_seed(1)
    part = build(Mixed(), (torch.randn(7, 5),))
    g = part.graph
    for op in g.chain:
        fn = reference.resolve(op.name)
        assert len(op.args) == len(fn._schema.arguments) + 1, op.name
    to_copy = next(op for op in g.chain if op.name == "aten._to_copy.default")
    # _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
    kinds = [type(g.values[i]).__name__ for i in to_copy.args]
    assert kinds == ["VkTensor", "Int", "Null", "Null", "Null", "Bool", "Null", "VkTensor"]
    assert g.values[to_copy.args[1]] == vk.Int(vk.VkDataType.FLOAT16)
    assert g.values[to_copy.args[-1]].datatype == vk.VkDataType.FLOAT16
    split = next(op for op in g.chain if op.name == "aten.split_with_sizes.default")
    out = g.values[split.args[-1]]
    assert isinstance(out, vk.ValueList)
    assert [g.values[i].dims for i in out.items] == [[7, 2], [7, 3]]


class Kinds(torch.nn.Module):
    def forward(self, x, m):
        y = torch.sum(x + 1, dim=[1, 0], keepdim=True)        # Int 1, IntList, Bool True
        y = y * 1.0                                           # Double 1.0
        y = y + torch.ops.vkdelegate_test.mask(x, [True, False]).sum()  # BoolList
        return y, m.any(dim=0, keepdim=False)                 # Bool False


@torch.library.custom_op("vkdelegate_test::mask", mutates_args=())
def _mask(x: torch.Tensor, keep: list[bool]) -> torch.Tensor:
    return x * torch.tensor(keep, dtype=x.dtype)


@_mask.register_fake
def _(x, keep):
    return torch.empty_like(x)


# The reference executor runs only allow-listed ops; this test's own op is added here.
_TEST_OPS = {"vkdelegate_test.mask.default": torch.ops.vkdelegate_test.mask.default}


def test_true_one_one_point_zero_and_lists_keep_their_kinds():
    x, m = torch.randn(3, 2), torch.tensor([[True, False], [False, False]])
    part = check_against_eager(Kinds(), (x, m))
    values = part.graph.values
    for expected in [vk.Int(1), vk.Double(1.0), vk.Bool(True), vk.Bool(False),
                     vk.IntList([1, 0]), vk.BoolList([True, False])]:
        matches = [v for v in values if type(v) is type(expected) and v == expected]
        assert len(matches) == 1, (expected, matches)


class TwoSameWeights(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=False)
        self.b = torch.nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight)
        self.register_buffer("c", torch.arange(6, dtype=torch.int32))

    def forward(self, x):
        return self.a(x) - self.b(x) * 0.5, self.c + 1


@pytest.mark.parametrize("named", [False, True])
def test_constants_are_deduplicated_inline_or_named(named):
    torch.manual_seed(2)
    module = TwoSameWeights()
    part = check_against_eager(module, (torch.randn(3, 4),), named_constants=named)
    g = part.graph
    weight = module.a.weight.detach().numpy().tobytes()
    buf = module.c.numpy().tobytes()
    assert len(g.constants) == 2  # a.weight and b.weight are the same bytes
    blob = read_blob(part.blob)
    got = sorted(bytes(blob.constant_bytes(i, part.named_data)) for i in range(2))
    assert got == sorted([weight, buf])
    tensors = [v for v in g.values if isinstance(v, vk.VkTensor) and v.constant_id >= 0]
    assert len(tensors) == 3  # two weight placeholders share one constant
    if named:
        assert all(c.is_named for c in g.constants)
        assert set(part.named_data) == {hashlib.sha256(weight).hexdigest(),
                                        hashlib.sha256(buf).hexdigest()}
        assert blob.header.constants_size == 0
    else:
        assert part.named_data == {}
        assert all(c.offset % 16 == 0 for c in g.constants)


class Outputs(torch.nn.Module):
    def forward(self, x, unused):
        y = x.relu()
        return y, x, y


def test_repeated_outputs_and_input_outputs_repeat_ids():
    part = check_against_eager(Outputs(), (torch.randn(4), torch.randn(2)))
    g = part.graph
    assert len(g.input_ids) == 2
    x_id = g.input_ids[0]
    assert g.output_ids[1] == x_id and g.output_ids[0] == g.output_ids[2] != x_id


class Chain(torch.nn.Module):
    def forward(self, x):
        for _ in range(6):
            x = torch.tanh(x) * 2.0
        return x


def _lifetimes(g: vk.VkGraph):
    spans = {}
    for k, op in enumerate(g.chain):
        for vid in op.args:
            lo, _ = spans.get(vid, (k, k))
            spans[vid] = (lo, k)
    return spans


def test_memory_planning_shares_only_disjoint_lifetimes():
    part = check_against_eager(Chain(), (torch.randn(5, 3),))
    g = part.graph
    tensors = {i: v for i, v in enumerate(g.values) if isinstance(v, vk.VkTensor)}
    for vid in g.input_ids + g.output_ids:
        assert tensors[vid].mem_obj_id == -1
    spans = _lifetimes(g)
    by_mem = {}
    for vid, t in tensors.items():
        if t.mem_obj_id >= 0:
            by_mem.setdefault(t.mem_obj_id, []).append(spans[vid])
    assert sum(len(s) for s in by_mem.values()) == 11  # 12 ops, last output is pinned
    assert len(by_mem) == 2                             # a chain needs two buffers
    for group in by_mem.values():
        group.sort()
        for (a0, a1), (b0, b1) in zip(group, group[1:]):
            assert a1 < b0, group  # an op's output never aliases its inputs


def test_skip_memory_planning():
    part = build(Chain(), (torch.randn(5, 3),), skip_memory_planning=True)
    assert all(v.mem_obj_id == -1 for v in part.graph.values if isinstance(v, vk.VkTensor))


class Views(torch.nn.Module):
    """Views of intermediates read before and after other ops, a view of a view, a
    view of an input and a view that is an output."""

    def forward(self, x):
        a = torch.tanh(x)                     # [4, 6]
        v = a.view(2, 12).unsqueeze(0)        # two aliases of a
        b = torch.exp(a) * 2.0                # reads a while v is live
        c = v.squeeze(0).view(4, 6) + b       # reads the alias after b
        w = x.view(24)                        # a view of an input: memory of its own
        return c.relu(), w.sum(), b.view(24)  # a view that is an output: copied


def test_views_share_their_input_memory_and_lifetimes_stay_disjoint():
    from vkdelegate.ops.registry import alias_ops
    part = check_against_eager(Views(), (torch.randn(4, 6),), alias_ops=alias_ops())
    g = part.graph
    mem = {i: v.mem_obj_id for i, v in enumerate(g.values) if isinstance(v, vk.VkTensor)}
    views = [op for op in g.chain if op.name in alias_ops()]
    assert len(views) == 6
    shared = [op for op in views if mem[op.args[0]] >= 0 and mem[op.args[-1]] >= 0]
    assert len(shared) == 4                            # a.view, unsqueeze, squeeze, view
    for op in shared:
        assert mem[op.args[0]] == mem[op.args[-1]]
    for vid in g.input_ids + g.output_ids:
        assert mem[vid] == -1                          # x.view and b.view copy
    # Tensors of one memory object: one alias class, or lifetimes that do not overlap.
    alias_of = {}
    for op in shared:
        alias_of[op.args[-1]] = alias_of.get(op.args[0], op.args[0])
    spans = _lifetimes(g)
    by_mem = {}
    for vid, m in mem.items():
        if m >= 0:
            root = alias_of.get(vid, vid)
            lo, hi = by_mem.setdefault(m, {}).get(root, spans[vid])
            by_mem[m][root] = (min(lo, spans[vid][0]), max(hi, spans[vid][1]))
    for classes in by_mem.values():
        group = sorted(classes.values())
        for (a0, a1), (b0, b1) in zip(group, group[1:]):
            assert a1 < b0, group


def test_alias_needs_same_dtype_and_bytes():
    from vkdelegate.serialization.memory_planning import plan_memory
    part = build(Views(), (torch.randn(4, 6),))
    g = part.graph
    view = next(op for op in g.chain if op.name == "aten.view.default"
                and op.args[0] not in g.input_ids)
    g.values[view.args[-1]].datatype = vk.VkDataType.FLOAT16  # a hand-edited graph
    plan_memory(g, frozenset({"aten.view.default"}))
    assert g.values[view.args[0]].mem_obj_id != g.values[view.args[-1]].mem_obj_id


class Dynamic(torch.nn.Module):
    def forward(self, x):
        return torch.cat([x, x]).view(x.shape[0] * 2, -1).relu()


def test_dynamic_dims_use_upper_bound_and_symint_values():
    batch = torch.export.Dim("batch", min=2, max=50)
    x = torch.randn(4, 3)
    part = build(Dynamic(), (x,), dynamic_shapes={"x": {0: batch}})
    g = part.graph
    assert g.values[g.input_ids[0]].dims == [50, 3]
    assert g.values[g.output_ids[0]].dims == [100, 3]
    assert any(isinstance(v, vk.SymInt) for v in g.values)
    for n in (2, 4, 50):  # the graph computes sizes at run time from sym_size
        xi = torch.randn(n, 3)
        torch.testing.assert_close(run_blob(part, [xi])[0], Dynamic()(xi))


def test_dynamic_dim_without_upper_bound_is_rejected():
    gm, constants = export(Dynamic(), (torch.randn(4, 3),),
                           dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    with pytest.raises(VkDelegateError, match=r"input|node 'x'.*has no upper bound.*Dim"):
        build_vkgraph(gm, constants)


def test_unsupported_dtype_names_the_node():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.bfloat16)

    with pytest.raises(VkDelegateError, match=r"node '_to_copy'.*dtype torch.bfloat16 has no "
                                              r"Vulkan equivalent"):
        build(M(), (torch.randn(3),))


def test_get_attr_tensors_are_constants():
    torch.manual_seed(3)
    module = TwoSameWeights()
    x = torch.randn(3, 4)
    gm, constants = export(module, (x,))
    weight_ph = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name in constants
                     and constants[n.name].dtype == torch.float32)
    gm.register_buffer("weight_attr", constants.pop(weight_ph.name))
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first_op):
        attr = gm.graph.get_attr("weight_attr")
    attr.meta = dict(weight_ph.meta)
    weight_ph.replace_all_uses_with(attr)
    gm.graph.erase_node(weight_ph)
    gm.recompile()
    part = build_vkgraph(gm, constants)
    assert len(part.graph.input_ids) == 1
    got = run_blob(part, [x])
    for g, e in zip(got, module(x)):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
