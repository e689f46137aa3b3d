"""The reference executor runs a delegate blob's ops only from the allow-list: a
crafted blob op name is refused at load naming the node id, a creation op over the
load limits too."""
import re

import pytest
import torch

from vkdelegate.backend.reference import load_reference
from vkdelegate.errors import ResourceLimitError, VkDelegateError
from vkdelegate.limits import LoadLimits
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob, write_blob
from vkdelegate.serialization.builder import build_vkgraph


class AddFull(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + torch.full((3, 4), 2.0)


def _blob():
    ep = torch.export.export(AddFull(), (torch.randn(3, 4),))
    serialized = build_vkgraph(ep.graph_module, {})
    return serialized.blob


def _edited(edit) -> bytes:
    decoded = read_blob(_blob())
    graph = decoded.graph
    edit(graph)
    return write_blob(graph, bytes(decoded.constants_section))


def test_the_untouched_blob_matches_eager():
    x = torch.randn(3, 4)
    out, = load_reference(_blob()).execute([x.numpy()])
    torch.testing.assert_close(torch.from_numpy(out), AddFull()(x))


@pytest.mark.parametrize("name,why", [
    ("aten.from_file.default", "file access"),
    ("aten.resize_.default", "storage or raw memory access"),
    ("aten._pin_memory.default", "memory pinning"),
    ("aten.relu_.default", "writes its arguments (in-place or out= overload)"),
    ("aten.einsum.default", "takes a str argument"),
])
def test_blob_op_outside_the_list_is_refused_naming_the_node(name, why):
    def edit(graph):
        graph.chain[0].name = name
        graph.chain[0].node_id = 41

    with pytest.raises(VkDelegateError, match=re.escape(
            f"node 41 of the delegate calls {name}, which a delegate run by the reference "
            f"executor may not call (not on the glue allow-list: {why})")):
        load_reference(_edited(edit))


def _full(graph):
    return next(c for c in graph.chain if c.name == "aten.full.default")


def test_blob_creation_op_over_the_tensor_limit_is_refused():
    def edit(graph):
        size = graph.values[_full(graph).args[0]]
        assert isinstance(size, vk.IntList) and size.items == [3, 4]
        size.items = [2 ** 40]

    with pytest.raises(ResourceLimitError, match=re.escape(
            "(aten.full.default): the tensor it makes, in bytes, is 4,398,046,511,104, "
            "over the load limit max_tensor_bytes=")):
        load_reference(_edited(edit))
    load_reference(_blob(), limits=LoadLimits(max_tensor_bytes=48))  # 12 float32: fits
    with pytest.raises(ResourceLimitError, match="is 48, over the load limit "
                                                 "max_tensor_bytes=47"):
        load_reference(_blob(), limits=LoadLimits(max_tensor_bytes=47))


def test_blob_str_argument_outside_the_choices_is_refused():
    def edit(graph):
        call = _full(graph)
        graph.values.append(vk.String("/etc/passwd"))
        call.name = "aten.gelu.default"  # gelu(Tensor self, str approximate)
        call.args = [graph.input_ids[0], len(graph.values) - 1, call.args[-1]]

    with pytest.raises(VkDelegateError, match=re.escape(
            "passes aten.gelu.default the string '/etc/passwd' as argument 'approximate', "
            "which takes one of 'none', 'tanh'")):
        load_reference(_edited(edit))
