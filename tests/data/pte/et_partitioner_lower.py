"""Lowers a few models with vkdelegate's VkDelegateETPartitioner inside ExecuTorch.

Run with ExecuTorch's Python (.venv-et), the repository root on sys.path::

    .venv-et/bin/python tests/data/pte/et_partitioner_lower.py OUT_DIR

For each model of generate.py named in NAMES it lowers with
``to_edge_transform_and_lower(ep, partitioner=[VkDelegateETPartitioner()])``, writes
``NAME.pte`` and ``NAME.npz`` (generate.py's format) and checks the file with
ExecuTorch's own readers: ``deserialize_pte_binary`` (one plan, VulkanBackend
delegates only) and ET-VK's blob deserializer (``flatbuffer_to_vk_graph``) on every
delegate, whose op names must all be ones our registry runs.
tests/program/test_et_partitioner.py runs this and then loads the files here.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

NAMES = ("cnn_block", "mlp", "hardswish", "embedding", "multi_output", "cpu_kernel")


def main(out: Path) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    spec = importlib.util.spec_from_file_location("pte_generate", HERE / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    import torch
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        extract_vk_flatbuffer, flatbuffer_to_vk_graph)
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._serialize._program import deserialize_pte_binary

    from vkdelegate.backend.et_partitioner import VkDelegateETPartitioner
    from vkdelegate.ops.registry import load_all

    ours = set(load_all())
    out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        _, calls, dynamic = gen.MODELS[name]
        ep = torch.export.export(gen.build(name), calls[0], dynamic_shapes=dynamic)
        edge = to_edge_transform_and_lower(ep, partitioner=[VkDelegateETPartitioner()])
        ops = []
        for _, m in edge.exported_program().graph_module.named_modules():
            if getattr(m, "backend_id", None) == "VulkanBackend":
                graph = flatbuffer_to_vk_graph(extract_vk_flatbuffer(m.processed_bytes))
                ops += [op.name for op in graph.chain]
        assert ops, f"{name}: no VulkanBackend delegate"
        unknown = sorted({op for op in ops if op not in ours} - {"sym_size.int"})
        assert not unknown, f"{name}: ET-VK blob ops outside our registry: {unknown}"
        data = edge.to_executorch().buffer
        gen.check_with_executorch(name, data)
        (out / f"{name}.pte").write_bytes(data)
        gen.write_calls(out, name)
        print(name, len(data), "bytes", ops)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
