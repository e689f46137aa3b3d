"""passes/cse: duplicate pure calls merged, no-op arithmetic folded, impure and float
elementwise calls kept; the graph still computes eager's values (and on Vulkan)."""
import torch

from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.passes.cse import cse
from vkdelegate.backend.program_graph import from_exported_program

aten = torch.ops.aten


def _run(pg, *inputs):
    values = dict(pg.constants)
    values.update(pg.state)
    values.update(zip(pg.user_inputs, inputs))
    pg.gm.graph.eliminate_dead_code()
    pg.gm.recompile()
    args = [values[n.name] for n in pg.gm.graph.find_nodes(op="placeholder")]
    return pg.gm(*args)


def _count(pg, target):
    return sum(1 for n in pg.gm.graph.nodes if n.op == "call_function" and n.target == target)


class Positions(torch.nn.Module):
    """What a HF decode step exports per layer: cache positions start_pos[0] + arange(T)
    and a mask from arange(S) <= position; plus no-op arithmetic."""

    def forward(self, x, start_pos):
        a = torch.arange(x.shape[1]) + start_pos[0]
        b = torch.arange(x.shape[1], dtype=torch.int64) + start_pos[0]
        c = torch.arange(x.shape[1]) + start_pos[0]
        mask = (torch.arange(8) + 0) <= a.unsqueeze(-1)
        mask = mask.expand(1, 8).to(torch.int32)  # not returned itself: folded
        y = x * 1.0
        return (a * 2 + b * 3 + c).float() + y.sum(), mask


def test_duplicate_positions_merge_and_noops_fold():
    x, pos = torch.randn(1, 1, 4), torch.tensor([5])
    m = Positions()
    pg = from_exported_program(torch.export.export(m, (x, pos)))
    assert _count(pg, aten.arange.start_step) + _count(pg, aten.arange.default) == 4
    assert cse(pg)
    pg.gm.graph.eliminate_dead_code()
    # arange(0, 1) + start_pos[0] is start_pos itself: no arange of one element, no
    # add, no select; the mask's arange(8) + 0 is arange(8); the expand and x * 1.0 go.
    aranges = _count(pg, aten.arange.start_step) + _count(pg, aten.arange.default)
    assert aranges == 1
    assert _count(pg, aten.select.int) == 0
    assert _count(pg, aten.expand.default) == 0
    for out, ref in zip(_run(pg, x, pos), m(x, pos)):
        assert torch.equal(out, ref)
    for p in (0, 3, 7):
        p = torch.tensor([p])
        for out, ref in zip(_run(pg, x, p), m(x, p)):
            assert torch.equal(out, ref)


class Dynamic(torch.nn.Module):
    """Duplicates with a dynamic length: arange(0, T) twice, merged; T + start_pos[0]."""

    def forward(self, x, start_pos):
        a = torch.arange(x.shape[1]) + start_pos[0]
        b = torch.arange(x.shape[1]) + start_pos[0]
        return x * a.float() + b.float().unsqueeze(-1)


def test_dynamic_lengths_merge():
    x, pos = torch.randn(1, 3, 1), torch.tensor([2])
    dims = ({1: torch.export.Dim("t", min=1, max=8)}, None)
    m = Dynamic()
    pg = from_exported_program(torch.export.export(m, (x, pos), dynamic_shapes=dims))
    before = _count(pg, aten.arange.start_step) + _count(pg, aten.arange.default)
    assert cse(pg)
    pg.gm.graph.eliminate_dead_code()
    assert _count(pg, aten.arange.start_step) + _count(pg, aten.arange.default) == before - 1
    for t in (1, 3, 5):
        x = torch.randn(1, t, 1)
        assert torch.equal(_run(pg, x, pos)[0], m(x, pos))


class Impure(torch.nn.Module):
    """Random ops and float elementwise duplicates are never merged."""

    def forward(self, x):
        r1 = torch.rand_like(x)
        r2 = torch.rand_like(x)
        s1 = torch.sigmoid(x) * 2.0
        s2 = torch.sigmoid(x) * 3.0
        return r1 - r2, s1 + s2


def test_impure_and_float_elementwise_kept():
    x = torch.randn(4, 4)
    pg = from_exported_program(torch.export.export(Impure(), (x,)))
    targets = [n.target for n in pg.gm.graph.nodes if n.op == "call_function"]
    cse(pg)
    pg.gm.graph.eliminate_dead_code()
    assert [n.target for n in pg.gm.graph.nodes if n.op == "call_function"] == targets
    diff, s = _run(pg, x)
    assert not torch.equal(diff, torch.zeros_like(diff))  # two draws, not one
    torch.testing.assert_close(s, torch.sigmoid(x) * 5.0)


class Returned(torch.nn.Module):
    def forward(self, x):
        return torch.arange(4) + x.shape[0], torch.arange(4) + x.shape[0], x + 0


def test_returned_duplicates_stay_distinct():
    x = torch.randn(2, 2)
    pg = from_exported_program(torch.export.export(Returned(), (x,)))
    cse(pg)
    outs = _run(pg, x)
    refs = Returned()(x)
    out_node = next(iter(pg.gm.graph.find_nodes(op="output")))
    returned = out_node.args[0]
    assert len({id(n) for n in returned}) == 3
    for o, r in zip(outs, refs):
        assert torch.equal(o, r)


def test_positions_on_vulkan_equal_eager():
    x, pos = torch.randn(1, 1, 4), torch.tensor([5])
    m = Positions()
    program = to_backend(torch.export.export(m, (x, pos)), VulkanPartitioner())
    for p in (0, 5, 7):
        p = torch.tensor([p])
        for out, ref in zip(program(x, p), m(x, p)):
            torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


class Prelude(torch.nn.Module):
    """A HF decode prelude: a mask from arange(S) <= position and the rotary angles
    position * inv_freq (a float16 buffer read as float32), both from start_pos."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", (1.0 / 500000 ** (torch.arange(0, 8, 2) / 8))
                             .half(), persistent=False)

    def forward(self, x, start_pos):
        pos = torch.arange(x.shape[1]) + start_pos[0]
        mask = torch.arange(16)[None, None, None, :] <= pos[None, None, :, None]
        ang = pos[None, :, None].float() * self.inv_freq.float()
        return x + ang.cos().sum(), mask


def test_prelude_folds_to_constants_and_unviewed_operands():
    from vkdelegate.backend.passes import run_passes

    x, pos = torch.randn(1, 1, 4), torch.tensor([5])
    m = Prelude()
    pg = from_exported_program(torch.export.export(m, (x, pos)))
    changed = run_passes(pg)
    assert "cse" in changed and "fold_constants" in changed
    # No arange left (the mask's is a constant, the positions are start_pos), no
    # view of start_pos (the comparison broadcasts it; the cast comes before the
    # view), no cast of the float16 buffer (a float32 constant).
    assert _count(pg, aten.arange.start_step) + _count(pg, aten.arange.default) == 0
    assert _count(pg, aten.unsqueeze.default) == 0
    casts = [n for n in pg.gm.graph.nodes if n.target == aten._to_copy.default]
    assert [c.args[0].name for c in casts] == ["start_pos"]
    folded = [name for name in pg.constants if name.endswith("_folded")]
    assert any(pg.constants[n].dtype == torch.float32 for n in folded)
    for p in (0, 5, 15):
        p = torch.tensor([p])
        for out, ref in zip(_run(pg, x, p), m(x, p)):
            assert out.shape == ref.shape and torch.equal(out, ref)


def test_prelude_on_vulkan_equal_eager():
    x, pos = torch.randn(1, 1, 4), torch.tensor([5])
    m = Prelude()
    program = to_backend(torch.export.export(m, (x, pos)), VulkanPartitioner())
    assert " 0 on CPU" in str(program.report), program.report
    for p in (0, 5, 15):
        p = torch.tensor([p])
        out, mask = program(x, p)
        want, want_mask = m(x, p)
        assert torch.equal(mask, want_mask)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)  # cos on the device


class LastToken(torch.nn.Module):
    """logits[0, -1] of hidden[:, -1:] (one token): select along size-1 dims and a
    slice keeping the whole dim become views; pos[0] (0-d) stays a select."""

    def forward(self, h, w, pos):
        logits = (h[:, -1:] @ w)[0, -1]
        return logits * 2, h[:, :, 1:] + pos[0]


def test_selects_of_size_one_dims_and_whole_slices_become_views():
    h, w, pos = torch.randn(1, 1, 6), torch.randn(6, 5), torch.tensor([3])
    m = LastToken()
    pg = from_exported_program(torch.export.export(m, (h, w, pos)))
    assert cse(pg)
    pg.gm.graph.eliminate_dead_code()
    selects = [n for n in pg.gm.graph.nodes if n.target == aten.select.int]
    assert [n.args[0].name for n in selects] == ["pos"]  # the 0-d one
    slices = [n for n in pg.gm.graph.nodes if n.target == aten.slice.Tensor]
    assert len(slices) == 1 and slices[0].args[2] == 1  # h[:, :, 1:] is a real slice
    for out, ref in zip(_run(pg, h, w, pos), m(h, w, pos)):
        assert out.shape == ref.shape and torch.equal(out, ref)
    program = to_backend(torch.export.export(m, (h, w, pos)), VulkanPartitioner())
    for out, ref in zip(program(h, w, pos), m(h, w, pos)):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


class RelativeIndex(torch.nn.Module):
    """BEiT's relative position bias: an int64 index computed from a constant grid by
    meshgrid, sub, permute, where and sum on every call, then a gather of a float
    table; and a random draw of a constant's size (never folded)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(64, 2))
        self.register_buffer("size", torch.tensor([4, 4]), persistent=False)

    def forward(self, x):
        h, w = torch.arange(4), torch.arange(4)
        coords = torch.stack(torch.meshgrid(h, w, indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)
        rel = torch.where(rel < 0, rel + self.size - 1, rel)
        index = (rel * torch.tensor([7, 1])).sum(-1)
        noise = torch.rand(x.shape[0], 1) * 0  # random: stays
        return x + self.table[index.flatten() % 64].sum(-1).view(16, 16)[:x.shape[0]] + noise


def test_integer_results_of_constants_fold():
    from vkdelegate.backend.passes import run_passes

    m = RelativeIndex()
    x = torch.randn(16, 16)
    pg = from_exported_program(torch.export.export(m, (x,)))
    assert "fold_constants" in run_passes(pg)
    calls = [n for n in pg.gm.graph.nodes if n.op == "call_function"]
    left = {str(n.target) for n in calls}
    # No integer or boolean op is left: the index is one constant, gathered from the
    # table (the float gather and sum stay, as does the random draw).
    assert not [n.format_node() for n in calls if n.meta["val"].dtype in
                (torch.int64, torch.bool)]
    assert "aten.rand.default" in left, sorted(left)
    index = [v for n, v in pg.constants.items() if n.endswith("_folded")
             and v.dtype == torch.int64 and v.numel() == 256]
    assert index, {n: (v.dtype, tuple(v.shape)) for n, v in pg.constants.items()}
    torch.testing.assert_close(_run(pg, x)[0], m(x))
