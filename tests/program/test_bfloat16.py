"""bfloat16 models run on the device in float32 (vkdelegate/backend/passes/bfloat16.py):
weights converted at lowering, inputs cast at the delegate boundary, outputs cast back
to bfloat16; the partition report says so.

Tolerance. The program computes eager's graph with float32 intermediates and rounds
each output to bf16 once, so against eager in float32 on the same bf16 weights and
inputs (``_fp32_reference``) it is within one bf16 ulp (2**-7 relative, RTOL_ULP) plus
fp32 noise. Against eager bf16, which rounds every intermediate to bf16 (2**-9 relative
each), the difference grows with the depth of the chain: a few of those roundings over
values of magnitude <= ~4 give up to ~3e-2 (BF16_CHAIN), below which a real bug (a
wrong weight, a missed cast) would not hide.
"""
import copy

import pytest
import torch
import torch.nn as nn

from vkdelegate import VulkanPartitioner, load, to_backend
from vkdelegate.backend.passes.bfloat16 import BF16_NOTE, BOUNDARY_REASON
from vkdelegate.serialization.blob import read_blob
from vkdelegate.serialization.vkgraph import VkDataType, VkTensor

BF16 = torch.bfloat16
RTOL_ULP = dict(rtol=2 ** -7, atol=1e-3)
BF16_CHAIN = dict(rtol=3e-2, atol=3e-2)


def _lower(module, inputs, executor):
    ep = torch.export.export(module, inputs)
    return to_backend(ep, VulkanPartitioner({"executor": executor}))


def _fp32_reference(module, inputs):
    with torch.no_grad():
        out = copy.deepcopy(module).float()(*(x.float() for x in inputs))
    return out.to(BF16)


def _report(program):
    return program.methods["forward"].report


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(),
                                 nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x).softmax(-1) * 3


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1)


@pytest.mark.parametrize("make,shape", [(Mlp, (5, 8)), (ConvNet, (2, 3, 9, 9))],
                         ids=["mlp", "conv"])
def test_bf16_model_runs_on_vulkan_as_float32(make, shape, executor):
    torch.manual_seed(0)
    module = make().to(BF16).eval()
    x = torch.randn(shape).to(BF16)
    program = _lower(module, (x,), executor)
    report = _report(program)
    # Only the boundary casts stay on the CPU, each saying why; every delegated node
    # says it computes bf16 as float32.
    assert {d.op for d in report.cpu_nodes} == {"aten._to_copy.default"}, str(report)
    assert all(d.reasons == [BOUNDARY_REASON] for d in report.cpu_nodes)
    assert len(report.cpu_nodes) == 2  # the input in, the output out
    assert report.noted_nodes and all(d.notes == [BF16_NOTE] for d in report.noted_nodes)
    got = program(x)
    with torch.no_grad():
        expected = module(x)
    assert got.dtype == BF16 and got.shape == expected.shape
    torch.testing.assert_close(got, _fp32_reference(module, (x,)), **RTOL_ULP)
    torch.testing.assert_close(got, expected, **BF16_CHAIN)


def test_bf16_weights_are_stored_as_float32_in_the_delegate():
    torch.manual_seed(0)
    module = nn.Linear(4, 3).to(BF16).eval()
    program = _lower(module, (torch.randn(2, 4).to(BF16),), "reference")
    graphs = [read_blob(d.blob).graph for d in program.methods["forward"].delegates]
    dtypes = {v.datatype for g in graphs for v in g.values if isinstance(v, VkTensor)}
    assert dtypes == {VkDataType.FLOAT32}


class Stateful(nn.Module):
    """A mutable bf16 buffer, a bf16 input returned as it is and a bf16 constant
    returned: the state stays bf16 between calls, the pass-throughs are exact."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4, dtype=BF16))
        self.register_buffer("table", torch.linspace(-1, 1, 4).to(BF16))

    def forward(self, x):
        self.total.add_(x.sum(0))
        return x, self.table, x * self.total + self.table


def test_bf16_state_and_pass_through_outputs(executor):
    torch.manual_seed(0)
    module = Stateful().eval()
    eager = copy.deepcopy(module)
    x = torch.randn(3, 4).to(BF16)
    program = _lower(module, (x,), executor)
    for step in range(2):
        xi = x + step
        got = program(xi)
        with torch.no_grad():
            expected = eager(xi)
        assert [g.dtype for g in got] == [BF16] * 3
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
        torch.testing.assert_close(got[2], expected[2], **BF16_CHAIN)


def test_bf16_program_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    module = Mlp().to(BF16).eval()
    x = torch.randn(5, 8).to(BF16)
    program = _lower(module, (x,), "reference")
    path = tmp_path / "bf16.vkdp"
    program.save(path)
    loaded = load(path)
    torch.testing.assert_close(loaded(x), program(x), rtol=0, atol=0)
    assert any(BF16_NOTE in d.notes for d in loaded.methods["forward"].report.decisions)


class CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_bf16_causal_attention(executor):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8).to(BF16) for _ in range(3))
    module = CausalAttention()
    program = _lower(module, (q, k, v), executor)
    report = _report(program)
    assert [d.reasons for d in report.cpu_nodes] == [[BOUNDARY_REASON]] * 4  # 3 in, 1 out
    torch.testing.assert_close(program(q, k, v), _fp32_reference(module, (q, k, v)),
                               **RTOL_ULP)
    torch.testing.assert_close(program(q, k, v), module(q, k, v), **BF16_CHAIN)


class MaskToDtype(nn.Module):
    """A ``.to(dtype)`` of a value that already has it (HF decoders' ``x.to(dtype)`` of
    their bf16 activations): export leaves ``_assert_tensor_metadata(dtype=
    torch.bfloat16)``, which stayed bf16 while the value became float32 and failed at
    the call (a bf16 Qwen3 through vkdelegate.llm, 2026-12-05)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x, mask):
        y = (x * self.w).to(torch.bfloat16)
        return y + (1.0 - mask.to(self.w.dtype)) * -100.0


def test_bf16_to_dtype_assert(executor):
    torch.manual_seed(0)
    module = MaskToDtype().to(BF16).eval()
    x = torch.randn(3, 8).to(BF16)
    mask = (torch.rand(3, 8) > 0.5).to(torch.int64)
    ep = torch.export.export(module, (x, mask))
    assert any(n.target == torch.ops.aten._assert_tensor_metadata.default
               for n in ep.graph.nodes)
    program = _lower(module, (x, mask), executor)
    torch.testing.assert_close(program(x, mask), _fp32_reference(module, (x, mask)),
                               **RTOL_ULP)
    torch.testing.assert_close(program(x, mask), module(x, mask), **BF16_CHAIN)
