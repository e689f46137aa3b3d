"""A partitioner for ExecuTorch's own flow whose delegates vkdelegate runs.

    from executorch.exir import to_edge_transform_and_lower
    from vkdelegate.backend.et_partitioner import VkDelegateETPartitioner

    edge = to_edge_transform_and_lower(ep, partitioner=[VkDelegateETPartitioner()])
    open("model.pte", "wb").write(edge.to_executorch().buffer)

Importable only where ``executorch`` (1.5.1) is installed (ImportError otherwise).
A node is delegated when BOTH ExecuTorch's VulkanSupportedOperators accepts it (so
ExecuTorch's ``VulkanBackend`` preprocess serializes it: the blob is ET-VK's, same
schema, op names and constant conventions, loadable by ET-VK's reader and runtime) AND
vkdelegate's registry runs it (the same ``VulkanPartitioner.check_node`` rules as our
own lowering: dtypes, ranks, arguments). The delegates are tagged for backend id
"VulkanBackend" with ET's compile specs (``parse_compile_options`` of
``compile_options``), exactly as ET's VulkanPartitioner does (its ``partition``,
executorch/backends/vulkan/partitioner/vulkan_partitioner.py), so the .pte runs both
under ExecuTorch's Vulkan runtime and ``vkdelegate.load``.
"""
from __future__ import annotations

import types
from typing import Any, Dict, Mapping, Optional

import torch
import executorch.backends.vulkan.patterns as vk_patterns
import executorch.backends.vulkan.utils as vk_utils
from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
    VulkanSupportedOperators, ops_not_to_decompose, parse_compile_options)
from executorch.backends.vulkan.vulkan_preprocess import VulkanBackend
from executorch.exir.backend.partitioner import (DelegationSpec, Partitioner,
                                                 PartitionResult)
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from vkdelegate.backend.partitioner import VulkanPartitioner as _OurPartitioner
from vkdelegate.ops import registry


def aten_view(node: torch.fx.Node):
    """``node`` as our checks read it: an edge-dialect target (EdgeOpOverload) is
    replaced by its ATen OpOverload; other nodes are returned unchanged."""
    op = getattr(node.target, "_op", None)
    if isinstance(op, torch._ops.OpOverload) and not isinstance(node.target,
                                                                torch._ops.OpOverload):
        return types.SimpleNamespace(op=node.op, name=node.name, target=op,
                                     args=node.args, kwargs=node.kwargs, meta=node.meta)
    return node


class _BothSupport(OperatorSupportBase):
    """ET-VK's operator support, narrowed to the nodes our registry also runs."""

    def __init__(self, et: VulkanSupportedOperators, ours: _OurPartitioner):
        super().__init__()
        self.et, self.ours, self.reasons = et, ours, {}

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module],
                          node: torch.fx.Node) -> bool:
        if not self.et.is_node_supported(submodules, node):
            return False
        view = aten_view(node)
        if not isinstance(view.target, torch._ops.OpOverload):
            return True  # getitem and SymInt ops: ET-VK handles them with their producer
        why = self.ours.check_node(view)
        if why:
            self.reasons[node.name] = why
        return not why


class VkDelegateETPartitioner(Partitioner):
    """ExecuTorch Partitioner (``to_edge_transform_and_lower(..., partitioner=[...])``):
    delegates to "VulkanBackend" the nodes both ET-VK and vkdelegate run.

    compile_options: ET-VK's compile options (``texture_limits``, ``buffer_limit``,
    ``require_dynamic_shapes``, ``skip_bool_tensors``, ``small_texture_limits`` and the
    ones ``parse_compile_options`` reads). ``reasons`` after ``partition``: node name ->
    why our registry kept an ET-VK-supported node out of the delegates.
    """

    def __init__(self, compile_options: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        self.options = dict(compile_options or {})
        self.delegation_spec = DelegationSpec(VulkanBackend.__name__,
                                              parse_compile_options(self.options))
        self.ours = _OurPartitioner({"require_dynamic_shapes": bool(
            self.options.get("require_dynamic_shapes", False))})
        self.reasons: dict = {}

    def ops_to_not_decompose(self, ep):
        """ET-VK's ops kept whole, where our registry has them too (the others are
        decomposed into ops both run)."""
        ours = registry.load_all()
        keep = [op for op in ops_not_to_decompose if str(op) in ours]
        return keep, lambda node: True

    def partition(self, exported_program) -> PartitionResult:
        """Tag the delegated nodes (``delegation_tag``) and the constants they use."""
        gm = exported_program.graph_module
        if "texture_limits" in self.options:
            limits = self.options["texture_limits"]
        elif self.options.get("small_texture_limits", False):
            limits = vk_utils.SMALL_TEXTURE_LIMITS
        else:
            limits = vk_utils.DEFAULT_TEXTURE_LIMITS
        et_support = VulkanSupportedOperators(
            limits, self.options.get("buffer_limit", vk_utils.DEFAULT_BUFFER_LIMIT),
            require_dynamic_shape=self.options.get("require_dynamic_shapes", False),
            skip_bool_tensors=self.options.get("skip_bool_tensors", False),
            fusable_subgraphs=vk_patterns.get_all_fusable_subgraphs(gm))
        support = _BothSupport(et_support, self.ours)
        partitions = CapabilityBasedPartitioner(
            gm, support, allows_single_node_partition=True).propose_partitions()
        tags = {}
        for partition in partitions:
            for node in partition.nodes:
                node.meta["delegation_tag"] = f"tag{partition.id}"
                tags[f"tag{partition.id}"] = self.delegation_spec
        self.reasons = support.reasons
        tag_constant_data(exported_program)
        tag_mutated_buffer(exported_program)
        return PartitionResult(tagged_exported_program=exported_program,
                               partition_tags=tags)
