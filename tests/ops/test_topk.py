"""aten.topk on Vulkan (ops/families/topk.py): values and int64 indices against eager
for MoE router shapes (rows of E = 8..128 experts, k = 1..8) in fp32 and fp16, any
dim, largest both ways, k = 0 and k = the line's length, NaN and infinities, dynamic
row counts; lines with ties against ``torch.sort(stable=True)`` (lower index first),
the order the kernel documents; the rules' reasons for what stays on the CPU."""
import pytest
import torch
from torch.export import Dim

from tests.ops.harness import FnModule, assert_matches_eager, check_op, delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.ops.families.topk import K_MAX, N_MAX
from vkdelegate.ops.registry import NodeSpec, TensorSpec, lookup

OP = "aten.topk.default"
FLOATS = [torch.float32, torch.float16]


def _distinct(shape, dtype, g=None):
    """Values with no ties along any dim (so eager's order is unique): a random
    permutation of a grid fp16 holds exactly, shifted to both signs."""
    n = torch.Size(shape).numel()
    v = torch.randperm(n, generator=g).float() / 8 - n / 16
    return v.reshape(shape).to(dtype)


def _topk_dict(t, cases):
    return {f"k{k}_d{dim}_{'max' if largest else 'min'}":
            tuple(torch.topk(t, k, dim=dim, largest=largest))
            for k, dim, largest in cases}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("experts", [8, 60, 128])
def test_router_rows(dtype, experts):
    """Rows of softmaxed router logits (Mixtral: 8 experts, top 2; Qwen2-MoE: 60, top 4;
    Qwen3-MoE: 128, top 8)."""
    torch.manual_seed(experts)
    x = _distinct((7, experts), dtype)
    ks = sorted({1, 2, 4, 8, min(K_MAX, experts)})
    check_op(lambda t: _topk_dict(t, [(k, -1, True) for k in ks]), (x,), ops=[OP])
    # The router's softmax in front, as the models compute it (probabilities in fp32).
    check_op(lambda t: tuple(torch.topk(torch.softmax(t.float(), -1), 2, dim=-1)),
             (x,), ops=[OP])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_dims_and_smallest(dtype):
    torch.manual_seed(0)
    x = _distinct((6, 5, 9), dtype)
    check_op(lambda t: _topk_dict(t, [(3, 0, True), (2, 1, False), (5, 2, False),
                                      (5, -1, True), (9, 2, True), (1, -2, True)]),
             (x,), ops=[OP])


def test_k_zero_and_whole_line_and_defaults():
    torch.manual_seed(0)
    x = _distinct((4, 8), torch.float32)
    check_op(lambda t: (tuple(torch.topk(t, 0)), tuple(torch.topk(t, 8)),
                        tuple(t.topk(3, largest=False)), torch.topk(t, 2)[1]),
             (x,), ops=[OP])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_and_infinities(dtype):
    """One NaN per line (eager orders several NaNs among themselves unpredictably; the
    ties test covers that), infinities of both signs."""
    torch.manual_seed(0)
    x = _distinct((5, 16), dtype)
    nan, inf = float("nan"), float("inf")
    x[0, 3], x[0, 9] = nan, inf
    x[1, 0], x[1, 15] = -inf, nan
    x[2, 7], x[2, 8], x[2, 9] = nan, -inf, inf
    x[3, 5], x[3, 6] = inf, -inf
    check_op(lambda t: _topk_dict(t, [(1, -1, True), (4, -1, True), (4, -1, False),
                                      (16, -1, False)]), (x,), ops=[OP])


def test_dynamic_rows():
    """A prefill's token count: the rows resize; the experts' dim stays."""
    torch.manual_seed(0)
    tokens = Dim("tokens", min=1, max=64)
    x = _distinct((20, 60), torch.float32)
    check_op(lambda t: tuple(torch.topk(t, 4, dim=-1)), (x,), ops=[OP],
             dynamic_shapes=({0: tokens},),
             resize_inputs=[(_distinct((1, 60), torch.float32),),
                            (_distinct((64, 60), torch.float32),)])


def _lower(fn, x):
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    ep = torch.export.export(FnModule(fn).eval(), (x,))
    program = to_backend(ep, VulkanPartitioner({"executor": "vulkan"}))
    assert OP in {name for name, _ in delegated_nodes(program)}
    return program


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("largest", [True, False])
def test_ties_take_the_lower_index_first(dtype, largest):
    """Small integers (many ties), -0.0 against 0.0, several NaNs and infinities in a
    line: the kernel's order is torch.sort(stable=True)'s, lower index first among
    equal values (eager's CPU topk does not promise one)."""
    torch.manual_seed(0)
    x = torch.randint(-3, 4, (9, 40)).to(dtype)
    x[0, 4], x[0, 20] = -0.0, -0.0
    x[1, ::5] = float("nan")
    x[2, 1::7] = float("inf")
    x[2, 2::9] = -float("inf")
    x[3] = 1.0
    x[4, 30:] = float("nan")
    k = 8
    program = _lower(lambda t: (tuple(torch.topk(t, k, largest=largest)),
                                tuple(torch.topk(t, 5, dim=0, largest=largest))), x)
    try:
        got = program(x.clone())
    finally:
        program.close()
    expected = []
    for dim, kk in ((-1, k), (0, 5)):
        values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
        expected.append((values.narrow(dim, 0, kk), indices.narrow(dim, 0, kk)))
    assert_matches_eager(got, tuple(expected), 0, 0)
    # -0.0 keeps its sign: the element itself is returned.
    assert torch.equal(torch.signbit(got[0][0]), torch.signbit(expected[0][0]))


def _node(shape, k, dim=-1, largest=True, dtype="float32"):
    x = TensorSpec(dtype, shape)
    out = list(shape)
    out[dim] = k
    return NodeSpec(OP, (x, k, dim, largest, True),
                    (TensorSpec(dtype, tuple(out)), TensorSpec("int64", tuple(out))))


def test_rules_give_reasons():
    spec = lookup(OP)
    assert spec.check(_node((4, 128), 8)) == []
    assert spec.check(_node((4, 128), K_MAX)) == []
    assert spec.check(_node((4, 8), 0)) == []
    assert any("k = 17" in r for r in spec.check(_node((4, 128), K_MAX + 1)))
    assert any("ATen raises" in r for r in spec.check(_node((4, 8), 9)))
    assert any("up to" in r for r in spec.check(_node((2, N_MAX + 1), 2)))
    bad_dim = NodeSpec(OP, (TensorSpec("float32", (4, 8)), 2, 2, True, True),
                       (TensorSpec("float32", (4, 2)), TensorSpec("int64", (4, 2))))
    assert any("out of range" in r for r in spec.check(bad_dim))
    assert any("int32" in r for r in spec.check(_node((4, 8), 2, dtype="int32")))
    # A dynamic line could shrink below k at run time, where ATen raises: CPU.
    dyn = NodeSpec(OP, (TensorSpec("float32", (4, 8), (False, True)), 2, -1, True, True),
                   (TensorSpec("float32", (4, 2), (False, False)),
                    TensorSpec("int64", (4, 2), (False, False))))
    assert any("dynamic size along dim 1" in r for r in spec.check(dyn))
    rows = NodeSpec(OP, (TensorSpec("float32", (4, 8), (True, False)), 2, -1, True, True),
                    (TensorSpec("float32", (4, 2), (True, False)),
                     TensorSpec("int64", (4, 2), (True, False))))
    assert spec.check(rows) == []


def test_unsorted_request_gets_the_sorted_result():
    """sorted=False leaves the order to the implementation: the kernel's is sorted."""
    torch.manual_seed(0)
    x = _distinct((6, 32), torch.float32)
    program = _lower(lambda t: tuple(torch.topk(t, 5, sorted=False)), x)
    try:
        got = program(x.clone())
    finally:
        program.close()
    assert_matches_eager(got, tuple(torch.topk(x, 5)), 0, 0)
