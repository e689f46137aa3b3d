"""Generates the ExecuTorch Vulkan (ET-VK) fixture blobs in this folder.

Run with a Python that has ``executorch==1.5.1`` (and its torch) installed, e.g. a
separate virtual environment, from the repository root::

    .venv-et/bin/python tests/data/et_vk/generate.py [OUT_DIR]

(OUT_DIR, default this folder: tests/serialization/test_et_compat.py writes fresh
ones to a temporary folder and also gets ``et_ops.json``, the op names of ET-VK's
registry, there.)

For each model in MODELS it lowers the model with ET's VulkanPartitioner, writes the
(first) delegate blob as ``<name>.bin``, what ET's own deserializer
(``executorch.backends.vulkan.serialization``) reports about it as ``<name>.json``, and
the blob's named constants (ET keeps weights outside the blob, keyed by SHA-256) as
``<name>.named.json`` ({key: hex bytes}). ``build_model(name)`` recreates the same
weights (seeded), so a runtime test can run a fixture blob and compare with eager.
``tests/serialization/test_et_compat.py`` checks our reader against those reports, and
imports this module to do the same live when executorch is importable.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class LinearReluAdd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)

    def forward(self, x, y):
        return torch.relu(self.lin(x)) + y, x * 2.0


class ConvSplitCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        a, b = torch.split(self.conv(x), [1, 3], dim=1)
        return torch.cat([b, a, a], dim=1).clamp(-1.0, 1.0)


class ReduceViewPermute(torch.nn.Module):
    def forward(self, x):
        y = x.permute(0, 2, 1).sum(dim=[1], keepdim=True)
        return torch.softmax(y.reshape(2, -1), dim=-1), x.mean(dim=-1)


def _inputs(seed: int, *shapes):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


#: name -> (module factory, example inputs)
MODELS = {
    "linear_relu_add": (LinearReluAdd, _inputs(0, (2, 5), (2, 3))),
    "conv_split_cat": (ConvSplitCat, _inputs(1, (1, 3, 6, 6))),
    "reduce_view_permute": (ReduceViewPermute, _inputs(2, (2, 4, 3))),
}


def build_model(name: str) -> torch.nn.Module:
    """Model ``name`` with the fixture's weights (seeded)."""
    torch.manual_seed(0)
    return MODELS[name][0]().eval()


def lower_with_named_data(module: torch.nn.Module, inputs: tuple) -> list[tuple[bytes, dict]]:
    """(blob, named data {key: bytes}) for each delegate ET's VulkanPartitioner
    produces for ``module``."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(module.eval(), inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()])
    out = []
    for _, m in edge.exported_program().graph_module.named_modules():
        if getattr(m, "backend_id", None) != "VulkanBackend":
            continue
        store = m.named_data_store_output
        named = {key: bytes(store.buffers[entry.buffer_index])
                 for key, entry in (store.pte_data if store else {}).items()}
        out.append((m.processed_bytes, named))
    return out


def lower(module: torch.nn.Module, inputs: tuple) -> list[bytes]:
    """The delegate blobs ET's VulkanPartitioner produces for ``module``."""
    return [blob for blob, _ in lower_with_named_data(module, inputs)]


def et_report(blob: bytes) -> dict:
    """What ET's own deserializer reads from ``blob``."""
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        extract_vk_flatbuffer, flatbuffer_to_vk_graph)

    g = flatbuffer_to_vk_graph(extract_vk_flatbuffer(blob))
    return {
        "value_count": len(g.values),
        "value_kinds": [type(v.value).__name__ for v in g.values],
        "op_names": [op.name for op in g.chain],
        "op_args": [list(op.args) for op in g.chain],
        "input_ids": list(g.input_ids),
        "output_ids": list(g.output_ids),
        "constant_count": len(g.constants),
    }


def et_registry_ops() -> list[str]:
    """The op names (as blobs spell them) of ET-VK's registry, ``vulkan_supported_ops``:
    edge ops by their ATen overload name, "ns::op" strings as "ns.op.default", torch
    OpOverloads by name; Python operators (ephemeral SymInt ops) are left out."""
    from executorch.backends.vulkan import op_registry

    names = set()
    for key in op_registry.vulkan_supported_ops:
        if isinstance(key, str):
            names.add(key.replace("::", ".") + ".default")
        elif isinstance(key, torch._ops.OpOverload):
            names.add(str(key))
        elif isinstance(getattr(key, "_op", None), torch._ops.OpOverload):  # edge op
            names.add(str(key._op))
    return sorted(names)


def main() -> int:
    from importlib.metadata import version

    here = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    here.mkdir(parents=True, exist_ok=True)
    if here != HERE:
        (here / "et_ops.json").write_text(json.dumps(et_registry_ops(), indent=0))
    for name, (_, inputs) in MODELS.items():
        lowered = lower_with_named_data(build_model(name), inputs)
        if not lowered:
            print(f"{name}: VulkanPartitioner produced no delegate blob", file=sys.stderr)
            return 1
        blobs = [blob for blob, _ in lowered]
        (here / f"{name}.bin").write_bytes(blobs[0])
        named = {key: data.hex() for key, data in sorted(lowered[0][1].items())}
        (here / f"{name}.named.json").write_text(json.dumps(named, indent=1) + "\n")
        report = {"generator": f"executorch {version('executorch')}",
                  **et_report(blobs[0])}
        (here / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"{name}: {len(blobs)} blob(s), {len(blobs[0])} bytes, "
              f"{report['value_count']} values, ops {report['op_names']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
