"""The runtime takes its ops by injection: importing it, and building and running a
graph through an injected OpTable, imports neither torch nor any vkdelegate.backend
module (a fresh interpreter, checked through sys.modules)."""
import subprocess
import sys
import textwrap

import pytest

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import DelegateGraph, OpTable
from vkdelegate.serialization import vkgraph as g
from tests.vulkan_skip import requires_vulkan

# A relu written against the runtime alone (unary_op.glsl, bindings declared here
# because the backend that normally declares them is never imported).
_RELU = """
    from vkdelegate.runtime.dtypes import storage_defines
    from vkdelegate.runtime.param_block import tensor_meta_block
    from vkdelegate.shaders.bindings import Bindings, shader_bindings

    shader_bindings("unary_op")(lambda d: Bindings(
        outputs=("out_data",), inputs=("in_data",),
        params=(tensor_meta_block("out_meta"),)))

    class Relu:
        shape_fn = staticmethod(lambda args: tuple(args[0].shape))
        @staticmethod
        def impl(b, node):
            x, out = b.tensor(node.args[0]), b.tensor(node.args[1])
            d = storage_defines(OUT=out, IN=x)
            d.update(ACC_T="float", ACC_FLOAT="1", OP_EXPR="max(x, 0.0)")
            b.dispatch("unary_op", d, outputs=[out], inputs=[x], params=[out.meta],
                       global_size=(out.max_numel,))
"""


@requires_vulkan
def test_injected_table_imports_no_torch_and_no_backend():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import vkdelegate.runtime
        from vkdelegate.runtime import DelegateGraph, OpTable
        from vkdelegate.serialization import vkgraph as g
    """) + textwrap.dedent(_RELU) + textwrap.dedent("""
        def lookup(name):
            assert name == "test.relu", name
            return Relu
        checked = []
        def check_nodes(graph, lookup):
            checked.append(len(graph.chain))
            return [lookup(c.name) for c in graph.chain]
        table = OpTable(lookup=lookup, check_nodes=check_nodes)
        vals = [g.VkTensor(g.VkDataType.FLOAT32, [4]), g.VkTensor(g.VkDataType.FLOAT32, [4])]
        graph = g.VkGraph(chain=[g.OperatorCall(0, "test.relu", [0, 1])],
                          values=vals, input_ids=[0], output_ids=[1])
        x = np.array([-1.5, 2, -3, 4], np.float32)
        with DelegateGraph(graph, lambda i: b"", ops=table) as dg:
            out = dg.execute([x])[0]
        assert out.tolist() == np.maximum(x, 0).tolist(), out
        assert checked == [1], checked
        bad = [m for m in sys.modules if m == "torch" or m.startswith("torch.")
               or m.startswith("vkdelegate.backend")]
        assert not bad, bad
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


@requires_vulkan
def test_injected_checks_refuse_before_anything_is_built():
    def check_nodes(graph, lookup):
        raise VkDelegateError("node 0 (test.relu): refused by the table")

    def lookup(name):
        raise AssertionError("impl must not be reached")

    vals = [g.VkTensor(g.VkDataType.FLOAT32, [4]), g.VkTensor(g.VkDataType.FLOAT32, [4])]
    graph = g.VkGraph(chain=[g.OperatorCall(0, "test.relu", [0, 1])],
                      values=vals, input_ids=[0], output_ids=[1])
    with pytest.raises(VkDelegateError, match=r"node 0 \(test.relu\): refused by the table"):
        DelegateGraph(graph, lambda i: b"", ops=OpTable(lookup, check_nodes))


def test_default_table_is_the_registry():
    from vkdelegate.ops.registry import lookup
    from vkdelegate.ops.default_table import default_op_table

    assert default_op_table().lookup is lookup
