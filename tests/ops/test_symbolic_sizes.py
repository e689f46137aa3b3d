"""Symbolic sizes inside delegates: sym_size.int, SymInt arithmetic and the ops that
take SymInt arguments (view/_unsafe_view, expand, slice, select, arange, full) run on
Vulkan without a partition boundary, against eager after several resizes."""
import re

import pytest
import torch
from torch.export import Dim

import vkdelegate
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.blob import read_blob

from tests.ops.harness import check_op
from tests.ops.movement_data import rand

VIEW = "aten.view.default"


def _all_on_vulkan(program):
    for method in program.methods.values():
        assert not method.report.cpu_nodes, str(method.report)
        assert method.report.num_partitions == 1, str(method.report)


def _chain(program) -> list[str]:
    return [op.name for m in program.methods.values() for d in m.delegates
            for op in read_blob(d.blob).graph.chain]


class _Unflatten(torch.nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[1], x.shape[0], 5)


def test_view_with_two_symbolic_sizes_runs_on_vulkan():
    """Two symbolic sizes (no -1 can stand for both): each is a sym_size.int node in
    the delegate, ExecuTorch's name, and the view follows them after resizes."""
    dims = {0: Dim("a", min=1, max=9), 1: Dim("b", min=1, max=9)}
    program = check_op(_Unflatten(), (rand(7, 3, 5),), ops=[VIEW], dynamic_shapes=(dims,),
                       resize_inputs=[(rand(2, 9, 5, seed=1),), (rand(9, 1, 5, seed=2),)])
    _all_on_vulkan(program)
    assert _chain(program).count("sym_size.int") == 2


def test_view_with_a_product_of_sizes():
    """x.reshape(a * b, c): operator.mul on two SymInts is a ``mul`` node."""
    dims = {0: Dim("a", min=1, max=6), 1: Dim("b", min=1, max=6), 2: Dim("c", min=1, max=6)}
    program = check_op(lambda x: x.reshape(x.shape[0] * x.shape[1], x.shape[2]) * 2,
                       (rand(3, 5, 4),), ops=[VIEW], dynamic_shapes=(dims,),
                       resize_inputs=[(rand(6, 1, 2, seed=1),), (rand(1, 6, 6, seed=2),)])
    _all_on_vulkan(program)
    assert "mul" in _chain(program)


def test_slice_with_a_symbolic_end_from_another_input():
    """x[:y.shape[0]]: the size of y becomes a SymInt inside the delegate."""
    dims = ({0: Dim("a", min=2, max=9)}, {0: Dim("b", min=1, max=9)})
    program = check_op(lambda x, y: x[:y.shape[0]].flip(0), (rand(7, 3), rand(4)),
                       ops=["aten.flip.default", "aten.slice.Tensor"], dynamic_shapes=dims,
                       resize_inputs=[(rand(5, 3, seed=1), rand(2, seed=2)),
                                      (rand(9, 3, seed=3), rand(9, seed=4))])
    _all_on_vulkan(program)


def test_slice_with_a_sub():
    dims = ({0: Dim("a", min=3, max=11)},)
    program = check_op(lambda x: x[: x.shape[0] - 1] + 1, (rand(7, 3),),
                       ops=["aten.slice.Tensor"], dynamic_shapes=dims,
                       resize_inputs=[(rand(11, 3, seed=1),), (rand(3, 3, seed=2),)])
    _all_on_vulkan(program)
    assert "sub" in _chain(program)


def test_view_with_a_floordiv():
    half = Dim("h", min=1, max=5)
    dims = ({0: 2 * half, 1: Dim("b", min=1, max=7)},)
    # Export narrows h to 2..5 (its range_constraints): the smallest x is [4, 1].
    program = check_op(lambda x: x.reshape(x.shape[0] // 2, 2 * x.shape[1]) + 1,
                       (rand(6, 5),), ops=[VIEW], dynamic_shapes=dims,
                       resize_inputs=[(rand(10, 7, seed=1),), (rand(4, 1, seed=2),)])
    _all_on_vulkan(program)
    with pytest.raises(vkdelegate.VkDelegateError, match=re.escape(
            "input 'args_0' dim 0 is 7, expected 2*h for h (s")):
        program(rand(7, 2))  # an odd size is no 2*h


def test_select_with_a_symbolic_index():
    dims = ({1: Dim("a", min=3, max=11)},)
    program = check_op(lambda x: x[:, x.shape[1] - 2] * 3, (rand(3, 7),),
                       ops=["aten.select.int"], dynamic_shapes=dims,
                       resize_inputs=[(rand(3, 11, seed=1),), (rand(3, 3, seed=2),)])
    _all_on_vulkan(program)


def test_expand_with_a_symbolic_size():
    dims = ({0: Dim("a", min=1, max=9)}, {})
    program = check_op(lambda x, y: x + y.expand(x.shape[0], 5), (rand(4, 5), rand(1, 5)),
                       ops=["aten.expand.default"], dynamic_shapes=dims,
                       resize_inputs=[(rand(9, 5, seed=1), rand(1, 5, seed=2)),
                                      (rand(1, 5, seed=3), rand(1, 5, seed=4))])
    _all_on_vulkan(program)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_arange_with_a_symbolic_end(dtype):
    dims = ({0: Dim("a", min=1, max=40)},)
    program = check_op(lambda x: x * torch.arange(x.shape[0], dtype=dtype),
                       (rand(7),), ops=["aten.arange.start_step"], dynamic_shapes=dims,
                       resize_inputs=[(rand(40, seed=1),), (rand(1, seed=2),)])
    _all_on_vulkan(program)


def test_full_and_zeros_with_symbolic_sizes():
    dims = ({0: Dim("a", min=1, max=9), 1: Dim("b", min=1, max=9)},)

    def fn(x):
        n, m = x.shape
        return x + torch.full((n, m), 2.5), torch.zeros(m, n) - x.t()
    program = check_op(fn, (rand(4, 6),), ops=["aten.full.default"], dynamic_shapes=dims,
                       resize_inputs=[(rand(9, 1, seed=1),), (rand(2, 9, seed=2),)])
    _all_on_vulkan(program)


def test_symint_in_a_saved_program(tmp_path):
    """The SymInt values and sym_size.int nodes survive save + load; the loaded
    program resizes like the original (growing, then shrinking)."""
    from tests.vulkan_skip import vulkan_unavailable
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    module = _Unflatten().eval()
    dims = {0: Dim("a", min=1, max=9), 1: Dim("b", min=1, max=9)}
    ep = torch.export.export(module, (rand(7, 3, 5),), dynamic_shapes=(dims,))
    program = vkdelegate.to_backend(ep)
    path = tmp_path / "unflatten.vkd"
    program.save(path)
    loaded = vkdelegate.load(path)
    graph = read_blob(loaded.methods["forward"].delegates[0].blob).graph
    assert sum(isinstance(v, vk.SymInt) for v in graph.values) == 2
    for shape in [(2, 3, 5), (9, 9, 5), (1, 1, 5), (4, 8, 5)]:
        x = rand(*shape, seed=sum(shape))
        torch.testing.assert_close(loaded(x), module(x), rtol=0, atol=0)


def test_resize_outside_the_exported_bounds_is_refused():
    from tests.vulkan_skip import vulkan_unavailable
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    dims = {0: Dim("a", min=2, max=9), 1: Dim("b", min=1, max=9)}
    ep = torch.export.export(_Unflatten(), (rand(7, 3, 5),), dynamic_shapes=(dims,))
    program = vkdelegate.to_backend(ep)
    with pytest.raises(vkdelegate.VkDelegateError, match=r"dim 0 is 10, allowed range 2\.\.9"):
        program(rand(10, 3, 5))
    with pytest.raises(vkdelegate.VkDelegateError, match=r"dim 0 is 1, allowed range 2\.\.9"):
        program(rand(1, 3, 5))
    x = rand(3, 4, 5)
    torch.testing.assert_close(program(x), x.reshape(4, 3, 5))


def _unflatten_graph():
    dims = {0: Dim("a", min=1, max=9), 1: Dim("b", min=1, max=9)}
    ep = torch.export.export(_Unflatten(), (rand(7, 3, 5),), dynamic_shapes=(dims,))
    program = vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner({"executor": "reference"}))
    delegate = program.methods["forward"].delegates[0]
    return read_blob(delegate.blob), delegate.named_data


def test_symint_numbers_in_the_blob_are_not_trusted():
    """ExecuTorch writes SymInt(0) for every SymInt: the load checks and the runtime
    compute the numbers from the nodes producing them."""
    from vkdelegate.backend.reference import ReferenceGraph
    blob, named = _unflatten_graph()
    graph = blob.graph
    graph.values = [vk.SymInt(0) if isinstance(v, vk.SymInt) else v for v in graph.values]
    ref = ReferenceGraph.from_graph(graph, lambda i: blob.constant_bytes(i, named))
    x = rand(4, 6, 5)
    assert (ref.execute([x.numpy()])[0] == x.reshape(6, 4, 5).numpy()).all()
    from tests.vulkan_skip import vulkan_unavailable
    if not vulkan_unavailable():
        from vkdelegate.runtime.graph import DelegateGraph
        with DelegateGraph(graph, lambda i: blob.constant_bytes(i, named)) as dg:
            for shape in [(4, 6, 5), (9, 9, 5), (1, 2, 5)]:
                x = rand(*shape, seed=1)
                out = dg.execute([x.numpy()])[0]
                assert (out == x.reshape(shape[1], shape[0], 5).numpy()).all()


def test_symint_read_before_it_is_produced_is_refused():
    from vkdelegate.serialization.graph_checks import check_graph
    blob, _ = _unflatten_graph()
    graph = blob.graph
    first = next(i for i, op in enumerate(graph.chain) if op.name == "sym_size.int")
    view = next(i for i, op in enumerate(graph.chain) if op.name == VIEW)
    graph.chain.insert(first, graph.chain.pop(view))  # the view before its sizes
    with pytest.raises(vkdelegate.VkDelegateError,
                       match=r"reads SymInt value \d+, which no earlier node produces"):
        check_graph(graph)


def test_symint_where_an_op_reads_a_static_value_is_refused_at_load():
    from vkdelegate.ops.load_checks import check_nodes
    blob, _ = _unflatten_graph()
    graph = blob.graph
    sym = next(op.args[-1] for op in graph.chain if op.name == "sym_size.int")
    x = graph.chain[-1].args[-1]
    dim = len(graph.values)
    graph.values += [vk.Bool(False), vk.VkTensor(vk.VkDataType.FLOAT32, [9, 9, 5])]
    graph.chain.append(vk.OperatorCall(99, "aten._softmax.default", [x, sym, dim, dim + 1]))
    with pytest.raises(vkdelegate.VkDelegateError,
                       match=r"node 99 \(aten._softmax.default\): argument 1 is a symbolic "
                             r"size, which this op reads only at load"):
        check_nodes(graph)
