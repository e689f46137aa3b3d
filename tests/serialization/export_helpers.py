"""torch.export helpers shared by the builder tests."""
import torch

from vkdelegate.serialization.builder import build_vkgraph
from vkdelegate.serialization import vkgraph as vk


def export(module, args, dynamic_shapes=None):
    """(graph module, constants by placeholder name) of ``module`` exported and
    decomposed to ATen."""
    ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes).run_decompositions()
    sig = ep.graph_signature
    tables = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    constants = {name: ep.state_dict[target] for name, target in tables.items()}
    constants.update({name: ep.constants[target]
                      for name, target in sig.inputs_to_lifted_tensor_constants.items()})
    return ep.graph_module, constants


def build(module, args, dynamic_shapes=None, **kwargs):
    gm, constants = export(module, args, dynamic_shapes)
    return build_vkgraph(gm, constants, **kwargs)


def referenced_ids(graph: vk.VkGraph) -> set[int]:
    used = set(graph.input_ids) | set(graph.output_ids)
    for op in graph.chain:
        used.update(op.args)
    for v in graph.values:
        if isinstance(v, vk.ValueList):
            used.update(v.items)
    return used


def assert_well_formed(graph: vk.VkGraph) -> None:
    """No orphan values, no duplicated scalar/list/Null values, and the graph survives
    a blob round trip unchanged."""
    assert referenced_ids(graph) == set(range(len(graph.values))), "orphan values"
    seen = {}
    for vid, v in enumerate(graph.values):
        if isinstance(v, (vk.VkTensor, vk.SymInt)):
            continue
        key = (type(v).__name__, repr(v))
        assert key not in seen, f"value {vid} duplicates value {seen[key]}: {v}"
        seen[key] = vid
