"""Makes ExecuTorch 1.5.1 .pte files of small models, with inputs and eager outputs.

Run with the Python of ``.venv-et`` (``make et-venv``), which has executorch::

    .venv-et/bin/python tests/data/pte/generate.py OUT_DIR [NAME ...]

For each model in MODELS (or the NAMEs given) it lowers the model with ExecuTorch's
VulkanPartitioner (``to_edge_transform_and_lower(...).to_executorch()``), writes
``NAME.pte``, checks the file with ExecuTorch's own reader (``deserialize_pte_binary``:
one execution plan, the delegates it expects), and writes ``NAME.npz``: for each call
``c``, its inputs ``c{c}_in{i}`` and the eager outputs ``c{c}_out{j}``.
tests/program/test_pte.py runs this in a subprocess and compares our outputs with
those at test time. The .pte files in this folder are the fuzz seeds of the ``pte``
target (docs/FUZZING.md), made by this script::

    .venv-et/bin/python tests/data/pte/generate.py tests/data/pte mlp cpu_kernel \
        multi_output dynamic_batch && rm tests/data/pte/*.npz
"""
from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

nn = torch.nn
Dim = torch.export.Dim


class CnnBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        return nn.functional.adaptive_avg_pool2d(torch.clamp(self.dw(y), 0, 6), 1)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class ReduceSoftmax(nn.Module):
    def forward(self, x):
        return (torch.softmax(x, dim=-1), x.sum(dim=1), x.mean(dim=-1, keepdim=True),
                torch.amax(x, dim=0))


class Elementwise(nn.Module):
    def forward(self, x, y):
        z = torch.sigmoid(x) * y + torch.tanh(x - y)
        return torch.clamp(z / (1.0 + y.abs()), -0.5, 0.5) ** 2


class MultiOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        a, b = torch.split(h, [2, 4], dim=1)
        return {"relu": torch.relu(a), "cat": torch.cat([b, a], dim=1)}, h.permute(1, 0)


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)

    def forward(self, idx):
        return self.emb(idx).sum(dim=1)


class IndexSelect(nn.Module):
    def forward(self, x, idx):
        return torch.index_select(x, 0, idx) * 2.0


class DynamicBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 5)

    def forward(self, x):
        return torch.softmax(self.lin(x), dim=-1)


class CpuKernel(nn.Module):
    """cumsum is not in ET-VK's registry: it stays a KernelCall (aten::cumsum.out)
    between two delegates."""

    def forward(self, x):
        return torch.relu(torch.cumsum(torch.sigmoid(x), dim=1)) * 3.0


class HardswishBlock(nn.Module):
    """ET-VK keeps aten.hardswish whole (MobileNetV3's activation)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        return nn.functional.hardswish(self.conv(x))


class MaxPoolIndices(nn.Module):
    """max_pool2d_with_indices: ET-VK declares the indices output int32."""

    def forward(self, x):
        return nn.functional.max_pool2d(x, 3, stride=2, padding=1) * 2.0


class TransposedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1)

    def forward(self, x):
        return torch.relu(self.up(x))


class DepthwiseSeparable(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6)
        self.pw = nn.Conv2d(6, 10, 1)
        self.bn = nn.BatchNorm2d(10)

    def forward(self, x):
        return nn.functional.relu6(self.bn(self.pw(self.dw(x))))


class UpsamplePad(nn.Module):
    def forward(self, x):
        up = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        bi = nn.functional.interpolate(x, size=(6, 10), mode="bilinear",
                                       align_corners=False)
        return nn.functional.pad(up, (1, 2, 0, 1), value=0.5), bi


class PoolVariants(nn.Module):
    def forward(self, x):
        return (nn.functional.avg_pool2d(x, 2, stride=1),
                nn.functional.max_pool2d(x, 2, ceil_mode=True))


class LayerNormModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(12)

    def forward(self, x):
        return self.norm(x) * 1.5


class GroupNormModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(2, 6)

    def forward(self, x):
        return self.norm(x) + 1.0


class Attention(nn.Module):
    """Single-head self-attention written out (matmul, softmax, linear)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).split(16, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1)
        return self.out(att @ v)


class TransformerBlock(nn.Module):
    """Pre-norm block: layer norm, decomposed attention, layer norm, GELU MLP."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)
        self.att = Attention()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        x = x + self.att(self.ln1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class DynamicSeq(nn.Module):
    """A dynamic sequence dim through elementwise ops with a constant, softmax and a
    reduction."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(-1.0, 1.0, 8))

    def forward(self, x):
        y = torch.softmax(x * self.scale, dim=-1) + torch.tanh(x)
        return y, y.sum(dim=-1)


class DynamicLinear(nn.Module):
    """A Linear and a view over a dynamic sequence dim: ET-VK's blob carries
    sym_size.int and a view_copy whose sizes are SymInt values updated per call."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 12)

    def forward(self, x):
        y = self.fc(x)
        return y.view(y.shape[0], y.shape[1], 3, 4).sum(dim=-1)


class Gather(nn.Module):
    def forward(self, x, idx):
        return torch.gather(x, 1, idx) + 1.0


class ArgmaxModel(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=-1), torch.argmin(x, dim=0)


class ConcatSplit(nn.Module):
    def forward(self, x, y):
        z = torch.cat([x, y * 2.0, x - y], dim=1)
        a, b, c = torch.split(z, [3, 5, 4], dim=1)
        return a * c[:, :3], b.sum(dim=1)


class Reductions(nn.Module):
    def forward(self, x):
        return (torch.amin(x, dim=1), x.sum(dim=(0, 2)), x.mean(dim=(1, 2), keepdim=True),
                torch.amax(x, dim=-1, keepdim=True))


class Comparisons(nn.Module):
    def forward(self, x, y):
        m = (x > y) & (x < 1.0)
        return torch.where(m, x, y * 0.5), (x >= 0.0).logical_or(y <= 0.0)


class UnaryMix(nn.Module):
    def forward(self, x):
        return (torch.exp(x * 0.3) + torch.cos(x) - torch.sin(x) + torch.sqrt(x.abs())
                + torch.rsqrt(x.abs() + 1.0) - torch.neg(torch.round(x)))


class Activations(nn.Module):
    def forward(self, x):
        return (nn.functional.leaky_relu(x, 0.1) + nn.functional.hardtanh(x, -0.5, 0.7)
                + torch.sigmoid(x) * nn.functional.gelu(x, approximate="tanh"))


class MatmulBmm(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b), torch.mm(a[0], b[0])


class Movement(nn.Module):
    def forward(self, x):
        y = x.permute(0, 2, 1).reshape(2, 12).unsqueeze(0)
        return torch.flip(y, [2]).squeeze(0), x[:, 1:3, :].repeat(1, 1, 2), x[1, 2]


class LogSoftmaxDiv(nn.Module):
    def forward(self, x, y):
        return torch.log_softmax(x, dim=-1), torch.div(x, y.abs() + 1.0), \
            torch.minimum(x, y) ** 2.0


class ToCopy(nn.Module):
    def forward(self, x):
        return (x * 4.0).to(torch.int32).to(torch.float32) + 0.5


def _rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _idx(seed, high, *shape):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


#: name -> (module class, calls (each a tuple of inputs; the first is the example),
#: dynamic_shapes or None)
MODELS = {
    "cnn_block": (CnnBlock, [(_rand(0, 1, 3, 8, 8),)], None),
    "mlp": (Mlp, [(_rand(1, 3, 16),)], None),
    "reduce_softmax": (ReduceSoftmax, [(_rand(2, 4, 6),)], None),
    "elementwise": (Elementwise, [(_rand(3, 2, 7), _rand(4, 2, 7))], None),
    "multi_output": (MultiOutput, [(_rand(5, 3, 6),)], None),
    "embedding": (Embedding, [(_idx(6, 20, 2, 5),)], None),
    "index_select": (IndexSelect, [(_rand(7, 6, 3), _idx(8, 6, 4))], None),
    "dynamic_batch": (DynamicBatch, [(_rand(9, 4, 8),), (_rand(10, 1, 8),),
                                     (_rand(11, 9, 8),)],
                      {"x": {0: Dim("batch", min=1, max=16)}}),
    "cpu_kernel": (CpuKernel, [(_rand(12, 3, 5),)], None),
    "hardswish": (HardswishBlock, [(_rand(13, 1, 3, 6, 6) * 3.0,)], None),
    "max_pool_indices": (MaxPoolIndices, [(_rand(14, 1, 4, 9, 9),)], None),
    "transposed_conv": (TransposedConv, [(_rand(15, 1, 4, 5, 5),)], None),
    "depthwise_separable": (DepthwiseSeparable, [(_rand(16, 1, 6, 8, 8),)], None),
    "upsample_pad": (UpsamplePad, [(_rand(17, 1, 2, 3, 5),)], None),
    "pool_variants": (PoolVariants, [(_rand(18, 1, 3, 6, 6),)], None),
    "layer_norm": (LayerNormModel, [(_rand(19, 2, 5, 12),)], None),
    "group_norm": (GroupNormModel, [(_rand(20, 1, 6, 4, 4),)], None),
    "attention": (Attention, [(_rand(21, 1, 6, 16),)], None),
    "transformer_block": (TransformerBlock, [(_rand(22, 1, 5, 16),)], None),
    "dynamic_seq": (DynamicSeq, [(_rand(23, 1, 6, 8),), (_rand(24, 1, 2, 8),),
                                 (_rand(25, 1, 11, 8),)],
                    {"x": {1: Dim("seq", min=2, max=32)}}),
    "dynamic_linear": (DynamicLinear, [(_rand(42, 1, 6, 8),), (_rand(43, 1, 2, 8),),
                                       (_rand(44, 1, 13, 8),)],
                       {"x": {1: Dim("seq", min=2, max=32)}}),
    "gather": (Gather, [(_rand(26, 3, 5), _idx(27, 5, 3, 4))], None),
    "argmax": (ArgmaxModel, [(_rand(28, 4, 7),)], None),
    "concat_split": (ConcatSplit, [(_rand(29, 2, 4, 3), _rand(30, 2, 4, 3))], None),
    "reductions": (Reductions, [(_rand(31, 3, 4, 5),)], None),
    "comparisons": (Comparisons, [(_rand(32, 3, 6), _rand(33, 3, 6))], None),
    "unary_mix": (UnaryMix, [(_rand(34, 4, 5),)], None),
    "activations": (Activations, [(_rand(35, 2, 9),)], None),
    "matmul_bmm": (MatmulBmm, [(_rand(36, 2, 3, 4), _rand(37, 2, 4, 5))], None),
    "movement": (Movement, [(_rand(38, 2, 4, 3),)], None),
    "log_softmax_div": (LogSoftmaxDiv, [(_rand(39, 3, 5), _rand(40, 3, 5))], None),
    "to_copy": (ToCopy, [(_rand(41, 3, 4),)], None),
}


def build(name: str) -> nn.Module:
    """Model ``name`` with seeded weights (batch norm with non-trivial statistics)."""
    torch.manual_seed(0)
    module = MODELS[name][0]()
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return module.eval()


def lower(name: str) -> bytes:
    """The .pte bytes of model ``name``, lowered by ExecuTorch's VulkanPartitioner."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    _, calls, dynamic = MODELS[name]
    ep = torch.export.export(build(name), calls[0], dynamic_shapes=dynamic)
    edge = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()])
    return edge.to_executorch().buffer


def check_with_executorch(name: str, data: bytes) -> None:
    """ExecuTorch's own reader must accept the file: one plan, Vulkan delegates."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(data).program
    assert len(program.execution_plan) == 1, name
    backends = {d.id for d in program.execution_plan[0].delegates}
    assert backends == {"VulkanBackend"}, (name, backends)


def _leaves(value) -> list:
    return [t.detach().numpy() for t in torch.utils._pytree.tree_leaves(value)]


def main(out: Path, names: list[str]) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    for name in names or list(MODELS):
        data = lower(name)
        check_with_executorch(name, data)
        (out / f"{name}.pte").write_bytes(data)
        write_calls(out, name)
        print(name, len(data), "bytes")


def write_calls(out: Path, name: str) -> None:
    """``out/NAME.npz``: each call's inputs and the eager outputs (module docstring)."""
    arrays = {}
    with torch.no_grad():
        for c, inputs in enumerate(MODELS[name][1]):
            for i, x in enumerate(inputs):
                arrays[f"c{c}_in{i}"] = x.numpy()
            for j, y in enumerate(_leaves(build(name)(*inputs))):
                arrays[f"c{c}_out{j}"] = y
    np.savez(out / f"{name}.npz", **arrays)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
