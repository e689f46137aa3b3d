"""passes/merge_linears: sibling linears (one row or several) become one linear and its
narrow_last parts, with eager's values (and, on Vulkan, bitwise the unmerged lowering's); groups
that do not qualify are left alone."""
from unittest import mock

import pytest
import torch
from torch import nn

import vkdelegate.backend.passes as passes
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.passes.merge_linears import merge_linears
from vkdelegate.backend.program_graph import from_exported_program

from tests.ops.harness import assert_matches_eager, delegated_nodes
from tests.vulkan_skip import vulkan_unavailable

aten = torch.ops.aten
NARROW = "vkdelegate.narrow_last.default"


class Siblings(nn.Module):
    """An attention block's q/k/v and an MLP's gate/up shape: three and two linears of
    one input (N a multiple of 32, so that each part's offset meets lavapipe's 64-byte
    buffer alignment and the parts are aliases)."""

    def __init__(self, bias, k=64):
        super().__init__()
        self.q = nn.Linear(k, 64, bias=bias)
        self.k = nn.Linear(k, 32, bias=bias)
        self.v = nn.Linear(k, 32, bias=bias)
        self.gate = nn.Linear(k, 96, bias=bias)
        self.up = nn.Linear(k, 96, bias=bias)

    def forward(self, x):
        h = x * 2
        q, k, v = self.q(h), self.k(h), self.v(h)
        h2 = x * 3
        mlp = torch.nn.functional.silu(self.gate(h2)) * self.up(h2)
        return q.view(*q.shape[:-1], 4, 16) + 1, k * v, mlp


def _lower(module, inputs, merge=True, dynamic_shapes=None):
    ep = torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes)
    kept = passes.PASSES if merge else tuple(p for p in passes.PASSES
                                             if p is not merge_linears)
    with mock.patch.object(passes, "PASSES", kept):
        return to_backend(ep, VulkanPartitioner({"executor": "vulkan"}))


def _ops(program):
    return [name for name, _ in delegated_nodes(program)]


def _values(pg, *inputs):
    values = dict(pg.constants)
    values.update(zip(pg.user_inputs, inputs))
    pg.gm.recompile()
    return pg.gm(*[values[n.name] for n in pg.gm.graph.find_nodes(op="placeholder")])


@pytest.mark.parametrize("bias", [False, True])
def test_pass_merges_groups_and_keeps_values(bias):
    torch.manual_seed(0)
    m, x = Siblings(bias).eval(), torch.randn(1, 1, 64)
    pg = from_exported_program(torch.export.export(m, (x,)),
                               preserve=(aten.linear.default,))
    before = sum(n.target == aten.linear.default for n in pg.gm.graph.nodes)
    constants = len(pg.constants)
    assert merge_linears(pg)
    pg.drop_unused_constants()
    pg.gm.graph.eliminate_dead_code()
    linears = [n for n in pg.gm.graph.nodes if n.target == aten.linear.default]
    assert (before, len(linears)) == (5, 2)
    assert sorted(n.args[1].meta["val"].shape[0] for n in linears) == [128, 192]
    assert all((n.args[2] is not None) == bias for n in linears)
    # 5 weights (and biases) became 2.
    assert len(pg.constants) == constants - 3 * (2 if bias else 1)
    with torch.no_grad():
        want = m(x)
    # On the CPU, ATen's GEMM blocks the K sum by N: an fp32 ulp or so apart.
    for got, ref in zip(_values(pg, x), want):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


# fp16: the products accumulate in fp32 and round once, as eager's fp16 linear does on
# CPU (up to summation order: 1e-2 at |outputs| < 4 is a few fp16 ulps).
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_merged_on_vulkan_matches_eager_and_unmerged_bitwise(dtype, bias, tol):
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    torch.manual_seed(1)
    m, x = Siblings(bias).to(dtype).eval(), torch.randn(1, 1, 64).to(dtype)
    merged, plain = _lower(m, (x,)), _lower(m, (x,), merge=False)
    try:
        ops = _ops(merged)
        # q/k/v: one linear and 3 parts; gate/up: one linear whose SwiGLU chain is in
        # its epilogue (passes/fuse_linear_swiglu), bitwise the unmerged chain too.
        assert ops.count("aten.linear.default") == 1 and ops.count(NARROW) == 3
        assert ops.count("vkdelegate.linear_swiglu.default") == 1
        assert _ops(plain).count("aten.linear.default") == 5
        with torch.no_grad():
            want = m(x)
        got, ref = merged(x), plain(x)
        assert_matches_eager(got, want, tol, tol)
        for a, b in zip(got, ref):
            assert torch.equal(a, b)  # each output: the same K loop in both
    finally:
        merged.close()
        plain.close()


class NotSiblings(nn.Module):
    """Linears that must not merge: different inputs, a shared weight, a weight that is
    a user input, one with and one without bias."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 32, bias=False)
        self.d = nn.Linear(32, 32)
        self.e = nn.Linear(32, 32)
        self.f = nn.Linear(32, 32, bias=False)

    def forward(self, x, w):
        h = x * 2
        g = x + 1
        shared = nn.functional.linear(h, self.c.weight) + nn.functional.linear(
            g * 3, self.c.weight)
        return (self.a(h), self.b(g), shared, nn.functional.linear(h, w),
                self.d(h * 0.5), nn.functional.linear(h * 0.5, self.c.weight * 1),
                self.e(x - 1) + self.f(x - 1))


def test_non_siblings_are_not_merged():
    torch.manual_seed(2)
    m = NotSiblings().eval()
    pg = from_exported_program(torch.export.export(m, (torch.randn(1, 1, 32),
                                                       torch.randn(32, 32))),
                               preserve=(aten.linear.default,))
    assert not merge_linears(pg)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
def test_rows_merge_too(dtype, tol):
    # Prefill's [1, T, K] (T dynamic) merges as decode's [1, 1, K] does, so both
    # methods of an LLM read the same merged constants and a program file stores each
    # weight once; each part of several rows is one strided copy (narrow_last), the
    # gate/up chain still in the merged product's epilogue. Values: eager's, and
    # bitwise the unmerged lowering's on Vulkan.
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    torch.manual_seed(3)
    m, x = Siblings(True).to(dtype).eval(), torch.randn(1, 5, 64).to(dtype)
    pg = from_exported_program(torch.export.export(m, (x,)),
                               preserve=(aten.linear.default,))
    assert merge_linears(pg)
    rows = torch.export.Dim("rows", min=2, max=16)
    _check_merged(m, [x] + [torch.randn(1, t, 64).to(dtype) for t in (2, 16)],
                  {"aten.linear.default": 1, NARROW: 3,
                   "vkdelegate.linear_swiglu.default": 1}, {}, tol,
                  dynamic_shapes=({1: rows},))


class Q4Siblings(nn.Module):
    """Three et_vk.linear_q4gsw of one input (torchao int4 weight-only q/k/v after
    passes/quantized_linear): packed weights uint8 [N, K/2], scales [K/32, N]."""

    def __init__(self, dtype, bias, k=64, ns=(64, 32, 32), padded=False):
        super().__init__()
        g = torch.Generator().manual_seed(4)
        for i, n in enumerate(ns):
            self.register_buffer(f"w{i}", torch.randint(0, 256, (n, k // 2), generator=g,
                                                        dtype=torch.uint8))
            # A padded scale row (as ExecuTorch's blobs have) for the first linear.
            cols = n + 4 if padded and i == 0 else n
            self.register_buffer(f"s{i}", (torch.rand(k // 32, cols, generator=g) * 0.1
                                           + 0.01).to(dtype))
            if bias:
                self.register_buffer(f"b{i}", torch.randn(n, generator=g).to(dtype))
        self.count = len(ns)

    def forward(self, x):
        h = x * 2
        op = torch.ops.et_vk.linear_q4gsw
        return tuple(op(h, getattr(self, f"w{i}"), getattr(self, f"s{i}"), 32,
                        getattr(self, f"b{i}", None)) for i in range(self.count))


# fp16: eager's dequantized fp16 weights and fp32 sums against the shader's (same
# rounding of each dequantized weight, summation order apart).
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_q4gsw_siblings_merge(dtype, bias, tol):
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    from vkdelegate.backend import custom_ops

    custom_ops.ensure_defined()
    torch.manual_seed(5)
    m, x = Q4Siblings(dtype, bias, padded=True).eval(), torch.randn(1, 1, 64).to(dtype)
    _check_merged_three(m, x, "et_vk.linear_q4gsw.default", tol)


def _check_merged_three(m, x, op, tol):
    """Three sibling ``op`` nodes merge into one and three narrow_last parts."""
    _check_merged(m, [x], {op: 1, NARROW: 3}, {op: 3}, tol)


def _check_merged(m, xs, merged_counts, plain_counts, tol, dynamic_shapes=None):
    """``m`` lowered with and without merge_linears (exported on ``xs[0]``): each
    program's op counts (op -> count), and for every input of ``xs`` outputs that are
    eager's within ``tol`` and bitwise the unmerged lowering's."""
    merged = _lower(m, (xs[0],), dynamic_shapes=dynamic_shapes)
    plain = _lower(m, (xs[0],), merge=False, dynamic_shapes=dynamic_shapes)
    try:
        assert {op: _ops(merged).count(op) for op in merged_counts} == merged_counts
        assert {op: _ops(plain).count(op) for op in plain_counts} == plain_counts
        for x in xs:
            with torch.no_grad():
                want = m(x)
            got, ref = merged(x), plain(x)
            assert_matches_eager(got, want, tol, tol)
            for a, b in zip(got, ref):
                assert torch.equal(a, b)
    finally:
        merged.close()
        plain.close()


def test_q4gsw_of_other_group_sizes_do_not_merge():
    from vkdelegate.backend import custom_ops

    custom_ops.ensure_defined()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = Q4Siblings(torch.float32, False, ns=(32, 32))
            self.s16 = nn.Buffer(torch.rand(4, 32) * 0.1)

        def forward(self, x):
            a = torch.ops.et_vk.linear_q4gsw(x, self.q.w0, self.q.s0, 32)
            b = torch.ops.et_vk.linear_q4gsw(x, self.q.w1, self.s16, 16)
            return a, b

    pg = from_exported_program(torch.export.export(M().eval(), (torch.randn(1, 1, 64),)),
                               preserve=(aten.linear.default,))
    assert not merge_linears(pg)


class Q8Siblings(nn.Module):
    """Three int8 weight-only linears of one input as torchao's exports them (each
    views x as [-1, K] and calls aten._weight_int8pack_mm): int8 [N, K], scales [N]."""

    def __init__(self, dtype, k=64, ns=(64, 32, 32)):
        super().__init__()
        g = torch.Generator().manual_seed(6)
        for i, n in enumerate(ns):
            self.register_buffer(f"w{i}", torch.randint(-128, 128, (n, k), generator=g,
                                                        dtype=torch.int8))
            self.register_buffer(f"s{i}", (torch.rand(n, generator=g) * 0.1 + 0.01).to(dtype))
        self.count, self.k = len(ns), k

    def forward(self, x):
        h = x * 2
        return tuple(torch.ops.aten._weight_int8pack_mm(h.view(-1, self.k),
                                                         getattr(self, f"w{i}"),
                                                         getattr(self, f"s{i}"))
                     for i in range(self.count))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_int8pack_siblings_merge(dtype, tol):
    """The three views become one, the three products one, bitwise the unmerged
    lowering, and eager's values within the int8 GEMV tolerance."""
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    torch.manual_seed(7)
    m, x = Q8Siblings(dtype).eval(), torch.randn(1, 1, 64).to(dtype)
    _check_merged_three(m, x, "aten._weight_int8pack_mm.default", tol)
