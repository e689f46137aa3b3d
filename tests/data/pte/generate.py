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
        arrays = {}
        with torch.no_grad():
            for c, inputs in enumerate(MODELS[name][1]):
                for i, x in enumerate(inputs):
                    arrays[f"c{c}_in{i}"] = x.numpy()
                for j, y in enumerate(_leaves(build(name)(*inputs))):
                    arrays[f"c{c}_out{j}"] = y
        np.savez(out / f"{name}.npz", **arrays)
        print(name, len(data), "bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
