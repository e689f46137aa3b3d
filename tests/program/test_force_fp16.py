"""force_fp16 with values float16 cannot hold: the nodes that need them stay float32
inside the delegate (vkdelegate/backend/fp16_ranges.py) and match eager float32.

Tolerance: delegate inputs and the float16 part of each graph round to fp16 (unit
roundoff 2**-11 = 4.9e-4); a few roundings of values of magnitude <= ~10 (attention
scores, normalised activations) stay below 1e-2, the bound test_calls.py's fp16 test
uses. Values that stay float32 end to end are compared with fp32 tolerances.
"""
import math

import numpy as np
import pytest
import torch

from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.fp16_ranges import value_problem
from vkdelegate.backend.report import PartitionReport
from vkdelegate.serialization.blob import read_blob
from vkdelegate.serialization.vkgraph import VkDataType, VkTensor

FP16 = dict(rtol=1e-2, atol=1e-2)
F32_MIN = torch.finfo(torch.float32).min


def _lower(module, inputs, executor, partitioner=None, fuse=False):
    # The tests below name the nodes the fp16 rules keep float32; a fused elementwise
    # chain would merge them (test_fused_chains_keep_the_fp16_rules runs them fused).
    ep = torch.export.export(module, inputs)
    options = {"force_fp16": True, "executor": executor, "fuse_elementwise": fuse}
    return to_backend(ep, VulkanPartitioner(options, **(partitioner or {})))


def _notes(program) -> dict:
    return {d.name: " ".join(d.notes) for d in program.methods["forward"].report.decisions
            if d.notes}


class RMSNorm(torch.nn.Module):
    def __init__(self, square):
        super().__init__()
        self.square = square

    def forward(self, x):
        sq = x * x if self.square == "mul" else x.pow(2)
        return x * torch.rsqrt(sq.mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("square", ["mul", "pow"])
def test_rmsnorm_of_large_values_matches_eager(executor, square):
    # x*x = 90000 overflows float16; mean, + eps and rsqrt stay float32.
    torch.manual_seed(0)
    x = torch.cat([300 * torch.ones(2, 16), 250 * torch.randn(2, 16)])
    module = RMSNorm(square)
    program = _lower(module, (x,), executor)
    out = program(x)
    torch.testing.assert_close(out, module(x), **FP16)
    notes = _notes(program)
    first = "mul" if square == "mul" else "pow_1"
    assert set(notes) == {first, "mean", "add", "rsqrt"}
    assert f"product {first} feeds mean" in notes[first]
    # The final x * rsqrt(...) runs in float16 (its operands fit): x enters float32
    # (a kept node reads it, so the glue does not cast it) and two casts give that
    # mul x and rsqrt's result in float16; its output is cast back by the glue.
    (delegate,) = program.methods["forward"].delegates
    graph = read_blob(delegate.blob).graph
    dtypes = {VkDataType.FLOAT16, VkDataType.FLOAT32}
    assert {v.datatype for v in graph.values if isinstance(v, VkTensor)} == dtypes
    assert [op.name for op in graph.chain].count("aten._to_copy.default") == 2
    (call,) = [n for n in program.methods["forward"].plan["nodes"] if n["op"] == "delegate"]
    assert call["cast_inputs"] == [None] and call["cast_outputs"] == ["float32"]


class MaskedFill(torch.nn.Module):
    def __init__(self, fill):
        super().__init__()
        self.fill = fill

    def forward(self, q, k, v, mask):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(scores.masked_fill(mask, self.fill), -1) @ v


class AdditiveMask(torch.nn.Module):
    def __init__(self, fill):
        super().__init__()
        self.fill = fill

    def forward(self, q, k, v, keep):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(scores + (1.0 - keep.float()) * self.fill, -1) @ v


def _attention_inputs():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 5, 8) for _ in range(3))
    masked = torch.rand(2, 5, 5) > 0.5
    masked[0, 2] = True          # a fully masked row
    masked[1, 3] = False         # a row with nothing masked
    return q, k, v, masked


@pytest.mark.parametrize("fill", [-1e5, F32_MIN])
@pytest.mark.parametrize("form", [MaskedFill, AdditiveMask])
def test_attention_masks_match_eager(executor, form, fill):
    q, k, v, masked = _attention_inputs()
    module = form(fill)
    mask = masked if form is MaskedFill else ~masked
    program = _lower(module, (q, k, v, mask), executor)
    out = program(q, k, v, mask)
    expected = module(q, k, v, mask)
    assert not expected.isnan().any()
    # The fully masked row: eager gives the mean of v (masked_fill, or an additive
    # finfo.min that swallows the scores) or softmax(scores) @ v (-1e5 added).
    torch.testing.assert_close(out, expected, **FP16)
    notes = _notes(program)
    assert any(repr(float(fill)) in n and "inf in float16" in n for n in notes.values())
    assert "_softmax" in notes


def test_mask_value_report_names_node_and_value(executor):
    q, k, v, masked = _attention_inputs()
    program = _lower(MaskedFill(-1e5), (q, k, v, masked), executor)
    report = program.methods["forward"].report
    notes = _notes(program)
    # masked_fill exports as where(mask, scalar_tensor(-1e5), scores); scalar_tensor's
    # value is known at lowering.
    assert notes["where"] == ("float32 under force_fp16: reads scalar_tensor: "
                              "scalar_tensor holds -100000.0, which rounds to -inf in "
                              "float16")
    assert "where" in str(report) and "-100000.0" in str(report)
    again = PartitionReport.from_json(report.to_json())
    assert _notes_of(again) == notes


def _notes_of(report):
    return {d.name: " ".join(d.notes) for d in report.decisions if d.notes}


class Constants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("big", torch.tensor([1e5, -2e5, 3.0, 0.5]))

    def forward(self, x):
        y = torch.clamp(x, min=-1e5) * 2 + self.big + torch.full_like(x, 7e4)
        return y - 1e5


def test_constants_past_fp16_range(executor):
    x = torch.randn(3, 4)
    module = Constants()
    program = _lower(module, (x,), executor)
    # Everything after the constants stays float32: compare with fp32 tolerances.
    torch.testing.assert_close(program(x), module(x), rtol=1e-5, atol=1e-2)
    notes = _notes(program)
    assert "scalar min=-100000.0 rounds to -inf" in notes["clamp"]
    assert "b_big holds -200000.0, which rounds to -inf" in notes["add"]
    assert "scalar fill_value=70000.0 rounds to inf" in notes["full_like"]


class ProductMean(torch.nn.Module):
    def forward(self, a, b):
        return (a * b).mean(-1)


def test_products_past_fp16_range_feeding_a_mean(executor):
    a = torch.full((2, 8), 300.0)
    b = torch.full((2, 8), -400.0)
    program = _lower(ProductMean(), (a, b), executor)
    out = program(a, b)
    torch.testing.assert_close(out, ProductMean()(a, b), rtol=1e-6, atol=0)


class TinyEps(torch.nn.Module):
    def forward(self, x):
        return torch.log(x + 1e-30)


def test_tiny_scalar_that_flushes_to_zero(executor):
    x = torch.zeros(4)
    program = _lower(TinyEps(), (x,), executor)
    torch.testing.assert_close(program(x), TinyEps()(x))   # -69.08, not -inf
    assert "scalar other=1e-30 rounds to 0 in float16" in _notes(program)["add"]


class AcrossDelegates(torch.nn.Module):
    def forward(self, x):
        return torch.neg(x * 1e5) * 0.5


def test_wide_value_crosses_a_cpu_node(executor):
    # x * 1e5 leaves the first delegate as float32; neg runs on the CPU; the second
    # delegate's mul reads a value that may exceed float16 and stays float32 too.
    x = torch.randn(6) * 3
    program = _lower(AcrossDelegates(), (x,), executor,
                     partitioner={"operator_blocklist": ["aten.neg.default"]})
    assert len(program.methods["forward"].delegates) == 2
    torch.testing.assert_close(program(x), AcrossDelegates()(x))
    assert "reads neg, which may exceed float16" in _notes(program)["mul_1"]


class SinusoidalEncoding(torch.nn.Module):
    """The position encoding of "Attention is all you need", computed in forward."""

    def forward(self, x):
        pos = torch.arange(x.shape[1], dtype=torch.float32)[:, None]
        div = torch.exp(torch.arange(0, x.shape[2], 2, dtype=torch.float32)
                        * (-math.log(10000.0) / x.shape[2]))
        return torch.relu(x) + torch.cat([torch.sin(pos * div), torch.cos(pos * div)], -1)


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
def test_periodic_arguments_stay_float32(executor, fuse):
    """sin(pos * div) at pos 1023: float16 rounds the argument by up to 0.5 (the result
    was 0.40 off eager); the sine, the cosine and everything their arguments come from
    stay float32, the relu of x stays float16."""
    x = torch.randn(1, 1024, 16, generator=torch.Generator().manual_seed(0))
    program = _lower(SinusoidalEncoding(), (x,), executor, fuse=fuse)
    # only the final float16 rounding of values in [-1, 1] (+ relu(x) up to ~4)
    torch.testing.assert_close(program(x), SinusoidalEncoding()(x), rtol=1e-3, atol=2e-3)
    notes = _notes(program)
    assert any("sin of a float16 argument" in n for n in notes.values())
    assert any("cos of a float16 argument" in n for n in notes.values())
    assert any("computes the argument of" in n for n in notes.values())
    assert not any(name.startswith("relu") for name in notes)


def test_plain_fp16_graph_is_unchanged(executor):
    # Nothing out of range: every tensor is float16 and there are no casts.
    program = _lower(torch.nn.Tanh(), (torch.randn(3),), executor)
    graph = read_blob(program.methods["forward"].delegates[0].blob).graph
    assert all(v.datatype == VkDataType.FLOAT16 for v in graph.values
               if isinstance(v, VkTensor))
    assert not _notes(program)


@pytest.mark.parametrize("value,problem", [
    (65504.0, None), (65519.0, None), (65520.0, "rounds to inf in float16"),
    (-1e5, "rounds to -inf in float16"), (float("-inf"), None), (float("nan"), None),
    (2.0 ** -24, None), (2.0 ** -25, "rounds to 0 in float16"), (0.0, None),
])
def test_value_problem_thresholds(value, problem):
    assert value_problem(value) == problem
    if problem is None and math.isfinite(value):
        assert np.isfinite(np.float16(value)) and (value == 0 or np.float16(value) != 0)


def test_report_without_notes_reads_old_format():
    old = {"num_partitions": 1, "decisions": [["add", "aten.add.Tensor", [], 0]]}
    (decision,) = PartitionReport.from_json(old).decisions
    assert decision.notes == [] and decision.partition == 0


@pytest.mark.parametrize("case", ["rmsnorm-mul", "rmsnorm-pow", "constants", "tiny-eps",
                                  "additive-mask-1e5", "additive-mask-min"])
def test_fused_chains_keep_the_fp16_rules(executor, case):
    """The same programs with fused elementwise chains (passes/fuse_elementwise): a
    chain holding a scalar or a product the rules flag stays float32
    (fp16_ranges._fused_seed) and the results match eager as unfused."""
    torch.manual_seed(0)
    x = torch.cat([300 * torch.ones(2, 16), 250 * torch.randn(2, 16)])
    module, inputs, tol = {
        "rmsnorm-mul": (RMSNorm("mul"), (x,), FP16),
        "rmsnorm-pow": (RMSNorm("pow"), (x,), FP16),
        "constants": (Constants(), (torch.randn(3, 4),), dict(rtol=1e-5, atol=1e-2)),
        "tiny-eps": (TinyEps(), (torch.zeros(4),), {}),
    }.get(case) or (AdditiveMask(-1e5 if case.endswith("1e5") else F32_MIN),
                    _attention_inputs()[:3] + (~_attention_inputs()[3],), FP16)
    program = _lower(module, inputs, executor, fuse=True)
    assert any(d.op == "vkdelegate.fused_elementwise.default"
               for d in program.methods["forward"].report.decisions)
    torch.testing.assert_close(program(*inputs), module(*inputs), **tol)


class HalfStretch(torch.nn.Module):
    """A float32 model with a float16 stretch of its own: casts that a fused chain
    holds (passes/fuse_elementwise)."""

    def forward(self, x):
        return (torch.tanh(x * 3.0).half() * 2.0).float() + x


def test_fused_chain_with_casts_keeps_its_dtypes(executor):
    """A fused chain holding casts names the dtypes it converts to, so force_fp16 keeps
    it as lowered (fp16_ranges._fused_cast), not as a seed: the model's own float16
    stretch still rounds, the rest is eager's float32."""
    torch.manual_seed(0)
    x = torch.randn(4, 16) * 2
    module = HalfStretch()
    program = _lower(module, (x,), executor, fuse=True)
    (note,) = _notes(program).values()
    assert "dtype casts" in note
    torch.testing.assert_close(program(x), module(x), rtol=1e-3, atol=2e-3)
