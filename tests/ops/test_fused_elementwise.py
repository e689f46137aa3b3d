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
    body = chain.glsl_body(steps, 1, [float("-inf"), 6.0, 0.5], ["float32"] * 3)
    assert "uintBitsToFloat(0xff800000u)" in body    # -inf, exact
    assert "uintBitsToFloat(0x40c00000u)" in body    # 6.0
    assert "round_to_half" not in body               # float32 steps do not round
    assert chain.result_register(steps, 1) == "r2"
    half = chain.glsl_body(steps, 1, [float("-inf"), 6.0, 0.5], ["float16"] * 3)
    assert half.count("round_to_half(") == 2         # every float16 step rounds


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


# --- dtype casts inside chains ----------------------------------------------------
# ATen's decompositions compute a float16 op in float32 between two _to_copy nodes
# (F.silu of a float16 tensor exports as _to_copy(f32) -> sigmoid, mul -> _to_copy(f16));
# such casts join a chain, so inputs and output may differ in dtype.

#: One float16 ulp (2**-10 relative at worst): a chain computes each step as its op's
#: shader does, and eager's fp32 math may round a value the other way.
HALF_ULP = dict(rtol=1e-3, atol=1e-6)
SWIGLU = ("aten._to_copy.default(r0,'float32');aten.sigmoid.default(r2);"
          "aten.mul.Tensor(r2,r3);aten._to_copy.default(r4,'float16');"
          "aten.mul.Tensor(r5,r1)")


def _swiglu(gate, up):
    return F.silu(gate) * up


def _geglu(gate, up):
    return F.gelu(gate) * up + F.gelu(gate, approximate="tanh") * 0.5


def _mixed_inputs(x16, y32):
    """float16 and float32 inputs, float16 output."""
    return (torch.sigmoid(x16.float() * y32) + y32).half()


def _cast_in_middle(x):
    """float32 in and out, a float16 stretch in between (rounded there)."""
    return (torch.tanh(x * 3.0).half() * 2.0).float() + x


def _scale_to_half(x):
    return (x * 0.5 + 1.0).half()


HALF = torch.float16
CAST_CASES = {
    # name: (fn, inputs, ops the report notes, tolerance)
    "swiglu_fp16": (_swiglu, lambda: (torch.randn(2, 5, 64, dtype=HALF) * 3,
                                      torch.randn(2, 5, 64, dtype=HALF)),
                    "_to_copy, sigmoid, mul, _to_copy, mul", HALF_ULP),
    "geglu_fp16": (_geglu, lambda: (torch.randn(3, 40, dtype=HALF) * 3,
                                    torch.randn(3, 40, dtype=HALF)), None,
                   dict(zip(("rtol", "atol"), TOL[HALF]))),
    "mixed_inputs": (_mixed_inputs, lambda: (torch.randn(4, 9, dtype=HALF),
                                             torch.randn(9)),
                     "_to_copy, mul, sigmoid, add, _to_copy", HALF_ULP),
    "cast_in_middle": (_cast_in_middle, lambda: (torch.randn(6, 7) * 2,),
                       "mul, tanh, _to_copy, mul, _to_copy, add", dict(rtol=1e-3, atol=2e-3)),
    "fp32_to_fp16": (_scale_to_half, lambda: (torch.randn(5, 11) * 100,),
                     "mul, add, _to_copy", dict(rtol=0, atol=0)),
}


@pytest.mark.parametrize("case", sorted(CAST_CASES))
def test_chain_with_casts_is_one_node_and_matches_eager(case):
    torch.manual_seed(0)
    fn, make, notes, tol = CAST_CASES[case]
    inputs = make()
    program = check_op(fn, inputs, ops=[FUSED], **tol)
    assert _ops(program) == [FUSED]
    if notes is not None:
        (decision,) = program.report.decisions
        assert decision.notes == [f"chain of {len(notes.split(', '))} ops: {notes}"]
    if case == "cast_in_middle":
        # The float16 stretch rounds: float32 throughout would be this far off.
        (x,) = inputs
        unrounded = torch.tanh(x * 3.0) * 2.0 + x
        assert (program(x) - unrounded).abs().max() > 1e-4
    if case == "swiglu_fp16":
        # silu rounds to float16 before the product, as eager: bitwise equal to eager
        # for nearly every element (the rest one ulp off, HALF_ULP above).
        got, want = program(*inputs), fn(*inputs)
        assert (got != want).float().mean() < 0.01


def test_swiglu_of_hf_llama_mlp_fp16_is_one_dispatch():
    """transformers' LlamaMLP in float16, ``down(silu(gate(x)) * up(x))``: a decode
    row and a prefill block (gate/up merged by passes/merge_linears, read through
    narrow_last: a part of one row is an alias, of several a copy) each run casts,
    SiLU and the product as one fused node (with compile option fuse_linear_swiglu
    off: by default that chain goes into the merged linear's epilogue,
    vkdelegate.linear_swiglu)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=160)
    mlp = LlamaMLP(config).half().eval()
    lin, part = "aten.linear.default", "vkdelegate.narrow_last.default"
    for rows in (1, 5):
        expected = [lin, part, part, FUSED, lin]
        x = torch.randn(1, rows, 64, dtype=HALF)
        program = check_op(mlp, (x,), ops=[FUSED], rtol=5e-3, atol=5e-4,
                           options={"fuse_linear_swiglu": False})
        assert _ops(program) == expected, rows
        fused = [d for d in program.report.decisions if d.op == FUSED]
        assert fused[0].notes == ["chain of 5 ops: _to_copy, sigmoid, mul, _to_copy, mul"]
    swiglu = "vkdelegate.linear_swiglu.default"
    for rows in (1, 5):
        program = check_op(mlp, (torch.randn(1, rows, 64, dtype=HALF),), ops=[swiglu],
                           rtol=5e-3, atol=5e-4)
        assert _ops(program) == [swiglu, lin]


def test_only_plain_float_casts_join():
    """A cast joins only between float32 and float16 with default layout, device and
    memory format: one to float64 or to channels_last stays a node of its own."""
    from vkdelegate.backend.passes import run_passes
    from vkdelegate.backend.program_graph import from_exported_program

    def fn(x):
        s = torch.sigmoid(x)
        return (s.half(), torch.exp(x).to(torch.float64),
                torch.relu(x).to(torch.float16, memory_format=torch.channels_last))

    x = torch.randn(1, 2, 3, 4)
    pg = from_exported_program(torch.export.export(_Wrap(fn), (x,)))
    run_passes(pg)
    nodes = [n for n in pg.gm.graph.nodes if n.op == "call_function"]
    fused = [n for n in nodes if str(n.target) == FUSED]
    assert [n.args[1] for n in fused] == ["aten.sigmoid.default(r0);"
                                          "aten._to_copy.default(r1,'float16')"]
    kept = [n.kwargs for n in nodes if str(n.target) == "aten._to_copy.default"]
    assert sorted(str(k["dtype"]) for k in kept) == ["torch.float16", "torch.float64"]


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@pytest.mark.parametrize("text, message", [
    ("aten._to_copy.default(r0,'float64')", "wrong arguments for aten._to_copy.default"),
    ("aten._to_copy.default(r0)", "wrong arguments for aten._to_copy.default"),
    ("aten._to_copy.default(r0,s0)", "wrong arguments for aten._to_copy.default"),
])
def test_parse_refuses_bad_casts(text, message):
    with pytest.raises(VkDelegateError, match=message):
        chain.parse(text, 1, 2)


@pytest.mark.parametrize("text, inputs, output, message", [
    ("aten.mul.Tensor(r0,r1)", ["float16", "float32"], "float32",
     r"step 0 \(aten.mul.Tensor\): operands of dtypes \['float16', 'float32'\]"),
    ("aten._to_copy.default(r0,'float16')", ["float16"], "float16",
     "casts r0 to its own dtype float16"),
    ("aten.relu.default(r0)", ["int32"], "int32", "input 0 is int32"),
    (SWIGLU, ["float16", "float16"], "float32",
     "output tensor of dtype float32, but the chain's last step gives float16"),
    (SWIGLU, ["float16", "float32"], "float16", r"step 4 .*operands of dtypes"),
])
def test_dtypes_refused(text, inputs, output, message):
    steps = chain.parse(text, len(inputs), 0)
    with pytest.raises(VkDelegateError, match=message):
        chain.check_dtypes(steps, inputs, output)


def test_register_dtypes_and_render_of_casts():
    steps = chain.parse(SWIGLU, 2, 0)
    dtypes = chain.check_dtypes(steps, ["float16", "float16"], "float16")
    assert dtypes == ["float16", "float16", "float32", "float32", "float32", "float16",
                      "float16"]
    body = chain.glsl_body(steps, 2, [], dtypes)
    assert "const float r2 = (r0);" in body                  # to float32: exact
    assert "const float r5 = round_to_half(r4);" in body     # to float16: rounds
    assert body.count("round_to_half(") == 2                 # and the fp16 product
    with pytest.raises(VkDelegateError, match="register dtypes"):
        chain.glsl_body(steps, 2, [], dtypes[:-1])


def test_cpu_kernel_runs_casts():
    """The CPU kernel (reference executor, fake tensors at export) runs each cast as
    ATen's _to_copy: the SwiGLU chain is eager's op sequence bit for bit."""
    from vkdelegate.backend.custom_ops import FUSED_ELEMENTWISE

    op = FUSED_ELEMENTWISE.overload()
    torch.manual_seed(0)
    g, u = torch.randn(4, 33, dtype=HALF) * 3, torch.randn(4, 33, dtype=HALF)
    got = op([g, u], SWIGLU, [])
    want = (g.float() * torch.sigmoid(g.float())).half() * u
    assert got.dtype == HALF
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    mixed = op([g, torch.randn(33)], "aten._to_copy.default(r0,'float32');"
                                     "aten.add.Tensor(r2,r1,s0)", [1.0])
    assert mixed.dtype == torch.float32
    with pytest.raises(VkDelegateError, match="operands of dtypes"):
        op([g, torch.randn(33)], "aten.mul.Tensor(r0,r1)", [])


def _swiglu_blob():
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate.serialization.blob import read_blob

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    torch.manual_seed(0)
    program = check_op(_swiglu, (torch.randn(2, 8, dtype=HALF), torch.randn(2, 8, dtype=HALF)),
                       ops=[FUSED], **HALF_ULP)
    return read_blob(program.methods["forward"].delegates[0].blob)


def test_crafted_chain_dtypes_in_blob_are_refused_at_load():
    """A program file whose fused node's tensors disagree with its chain's dtypes
    fails to load, naming the problem: a chain ending in float32 that writes a
    float16 tensor, or a float16 step reading an input the file declares float32."""
    from vkdelegate.runtime.graph import DelegateGraph
    from vkdelegate.serialization import vkgraph as g

    parsed = _swiglu_blob()
    values = parsed.graph.values
    (text,) = [i for i, v in enumerate(values)
               if isinstance(v, g.String) and v.string_val.startswith("aten.")]
    assert values[text].string_val == SWIGLU
    values[text] = g.String(SWIGLU.rsplit(";", 2)[0])   # no cast back, no product
    with pytest.raises(VkDelegateError, match="output tensor of dtype float16, but the "
                                              "chain's last step gives float32"):
        DelegateGraph(parsed.graph, parsed.constant_bytes)

    parsed = _swiglu_blob()
    (call,) = [c for c in parsed.graph.chain if c.name == FUSED]
    up = parsed.graph.values[call.args[0]].items[1]
    parsed.graph.values[up].datatype = g.VkDataType.FLOAT32
    with pytest.raises(VkDelegateError, match="operands of dtypes"):
        DelegateGraph(parsed.graph, parsed.constant_bytes)
