"""Fused elementwise chains (passes/fuse_elementwise.py, vkdelegate.fused_elementwise):
chains of float unary/binary ops lower to one node, match eager, and a chain text from
an untrusted file can only compose the registered expressions."""
import pytest
import torch
import torch.nn.functional as F

from tests.ops.harness import check_op, delegated_nodes
from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import elementwise_chain as chain

FUSED = "vkdelegate.fused_elementwise.default"
TOL = {torch.float32: (1e-5, 1e-5),
       # fp16: the chain computes in fp32 and rounds once at the store, eager rounds
       # after every op: a few fp16 ulps (2**-10 relative) apart over a 3-8 op chain.
       torch.float16: (4e-3, 4e-3)}


def _ops(program) -> list[str]:
    return [name for name, _ in delegated_nodes(program)]


def _silu_gate(x, up):
    return x * torch.sigmoid(x) * up


def _scale_shift(x, w, b):
    return torch.clamp(F.gelu(x * w + b, approximate="tanh"), max=2.0) - 0.25


def _many_unary(x):
    y = F.leaky_relu(torch.tanh(x) * 3.0) + F.elu(x, alpha=0.5)
    return torch.clamp(torch.abs(y).sqrt().exp() / 2.0, 0.7).pow(2) - torch.erf(x)


def _max_min(x, y):
    return torch.maximum(x, y * 0.5).sub(torch.minimum(x, y), alpha=2.0).relu()


CASES = {
    "silu_gate": (_silu_gate, lambda dt: (torch.randn(2, 7, 33, dtype=dt),
                                          torch.randn(2, 7, 33, dtype=dt))),
    "scale_shift_broadcast": (_scale_shift, lambda dt: (
        torch.randn(2, 3, 5, 6, dtype=dt), torch.randn(3, 1, 1, dtype=dt),
        torch.randn(6, dtype=dt))),
    "many_unary": (_many_unary, lambda dt: (torch.randn(4, 50, dtype=dt),)),
    "max_min_alpha": (_max_min, lambda dt: (torch.randn(3, 1, 8, dtype=dt),
                                            torch.randn(5, 1, dtype=dt))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_chain_is_one_node_and_matches_eager(case, dtype):
    torch.manual_seed(0)
    fn, make = CASES[case]
    rtol, atol = TOL[dtype]
    program = check_op(fn, make(dtype), ops=[FUSED], rtol=rtol, atol=atol)
    assert _ops(program) == [FUSED]
    # the report says what the chain holds
    (decision,) = program.report.decisions
    assert decision.notes and decision.notes[0].startswith("chain of ")
    assert "chain of " in str(program.report)


def test_option_off_keeps_every_op():
    torch.manual_seed(0)
    x, up = torch.randn(4, 8), torch.randn(4, 8)
    program = check_op(_silu_gate, (x, up), ops=["aten.sigmoid.default", "aten.mul.Tensor"],
                       options={"fuse_elementwise": False})
    assert FUSED not in _ops(program)


def test_blocklisted_op_stays_out_of_chains():
    """An op the user keeps on the CPU is not hidden in a fused node."""
    torch.manual_seed(0)
    x, up = torch.randn(4, 8), torch.randn(4, 8)
    program = check_op(lambda x, y: torch.relu(torch.sigmoid(x) * y) + 1.0, (x, up),
                       ops=[FUSED], blocklist=["aten.sigmoid.default"])
    assert "aten.sigmoid.default" not in _ops(program)


def test_shared_intermediate_and_input_limit():
    """An intermediate with two users ends its chain (it is materialised once); a
    chain reads at most MAX_INPUTS tensors, so four inputs make two chains."""
    torch.manual_seed(0)
    a, b, c, d = (torch.randn(3, 16) for _ in range(4))

    def fn(a, b, c, d):
        t = torch.sigmoid(a) * b         # read twice below
        return (t + c).relu() * d, t.exp() * 2.0

    program = check_op(fn, (a, b, c, d), ops=[FUSED])
    ops = _ops(program)
    assert ops.count(FUSED) >= 2 and len(ops) <= 4, ops


def test_dynamic_shape_resizes():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = check_op(_silu_gate, (torch.randn(4, 32), torch.randn(4, 32)), ops=[FUSED],
                       dynamic_shapes=({0: batch}, {0: batch}),
                       resize_inputs=[(torch.randn(9, 32), torch.randn(9, 32)),
                                      (torch.randn(1, 32), torch.randn(1, 32))])
    assert _ops(program) == [FUSED]


def test_edges_nan_inf():
    """Each step keeps its op's ATen edge results (clamp/relu propagate NaN, sqrt of a
    negative is NaN, exp overflows to inf)."""
    x = torch.tensor([float("nan"), -1.0, 0.0, 1.0, 100.0, float("inf"), -float("inf"),
                      3.0])
    check_op(lambda x: torch.clamp(torch.sqrt(x).exp() * 2.0, min=0.5).relu(), (x,),
             ops=[FUSED])


def test_encoder_mlp_gelu_bias():
    """A transformer MLP's linear -> bias -> GELU -> scale stays one linear and one
    chain (the linears are not elementwise)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 32)
    program = check_op(lambda x: F.gelu(lin(x)) * 0.5 + 0.1, (torch.randn(2, 5, 16),),
                       ops=[FUSED])
    assert _ops(program).count(FUSED) == 1


def test_every_edge_op_fused_keeps_its_edges():
    """The unary edge cases of tests/ops/test_unary.py (NaN, infinities, signed zeros,
    half-way points) through each op fused with a multiply by one: the composed
    expressions keep each op's ATen results."""
    from tests.ops.test_unary import EDGE_OPS, EDGES

    fns = [fn for _, fn in EDGE_OPS]
    program = check_op(lambda x: tuple(fn(x) * 1.0 for fn in fns), (EDGES,), ops=[FUSED])
    assert _ops(program).count(FUSED) >= 10


# --- the chain language: what a program file may say -----------------------------

@pytest.mark.parametrize("text, message", [
    ("", "empty step list"),
    ("aten.relu.default(r1)", "register r1 is not written"),
    ("aten.relu.default(r0);aten.relu.default(r2)", "register r2 is not written"),
    ("aten.softmax.int(r0)", "aten.softmax.int is not a fusable op"),
    ("aten.relu.default(r0));}", "malformed step"),
    ("aten.relu.default(x)", "malformed argument"),
    ("aten.relu.default(r0,s0)", "wrong arguments for aten.relu.default"),
    ("aten.clamp.default(r0,s0,s9)", "scalar s9 out of range"),
    ("aten.gelu.default(r0,'erf')", "wrong arguments for aten.gelu.default"),
    ("aten.add.Tensor(s0,s0,s0)", "wrong arguments for aten.add.Tensor"),
    ("aten.mul.Tensor(r0)", "wrong arguments for aten.mul.Tensor"),
    (";".join(["aten.relu.default(r0)"] * (chain.MAX_STEPS + 1)), "steps"),
])
def test_parse_refuses(text, message):
    with pytest.raises(VkDelegateError, match=message):
        chain.parse(text, 1, 2)


def test_parse_refuses_too_many_inputs():
    with pytest.raises(VkDelegateError, match="4 tensor inputs"):
        chain.parse("aten.relu.default(r0)", 4, 0)


def test_render_uses_only_table_expressions():
    steps = chain.parse("aten.clamp.default(r0,s0,s1);aten.add.Tensor(r1,s2,s0)", 1, 3)
    body = chain.glsl_body(steps, 1, [float("-inf"), 6.0, 0.5])
    assert "uintBitsToFloat(0xff800000u)" in body    # -inf, exact
    assert "uintBitsToFloat(0x40c00000u)" in body    # 6.0
    assert chain.result_register(steps, 1) == "r2"


def test_cpu_kernel_matches_eager_and_checks():
    """The op's CPU kernel (reference executor, CPU glue) is each step's ATen op."""
    from vkdelegate.backend.custom_ops import FUSED_ELEMENTWISE

    op = FUSED_ELEMENTWISE.overload()
    x, y = torch.randn(4, 5), torch.randn(5)
    got = op([x, y], "aten.sigmoid.default(r0);aten.mul.Tensor(r0,r2);"
                     "aten.sub.Tensor(r3,r1,s0)", [2.0])
    torch.testing.assert_close(got, x * torch.sigmoid(x) - 2.0 * y, rtol=0, atol=0)
    with pytest.raises(VkDelegateError, match="register r5 is not written"):
        op([x], "aten.relu.default(r5)", [])


def test_crafted_chain_in_blob_is_refused_at_load():
    """A program whose fused node says something outside the grammar fails to load
    with the chain step named, before any shader is compiled."""
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate.runtime.graph import DelegateGraph
    from vkdelegate.serialization import vkgraph as g
    from vkdelegate.serialization.blob import read_blob

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    torch.manual_seed(0)
    program = check_op(_silu_gate, (torch.randn(2, 8), torch.randn(2, 8)), ops=[FUSED])
    parsed = read_blob(program.methods["forward"].delegates[0].blob)
    values = parsed.graph.values
    found = [i for i, v in enumerate(values)
             if isinstance(v, g.String) and v.string_val.startswith("aten.")]
    assert len(found) == 1
    values[found[0]] = g.String("aten.relu.default(r0);} void evil() {")
    with pytest.raises(VkDelegateError, match="fused elementwise chain step 1"):
        DelegateGraph(parsed.graph, parsed.constant_bytes)
