"""Both executors state the Executor interface (backend/executor.py) instead of being
probed with hasattr: the Vulkan DelegateGraph keeps state on the device, the
reference executor does not, and both run and close the same graph alike."""
import numpy as np

from vkdelegate.backend.executor import Executor, StateExecutor
from vkdelegate.backend.reference import ReferenceGraph
from vkdelegate.runtime import DelegateGraph
from vkdelegate.serialization import vkgraph as g


def _relu_graph():
    vals = [g.VkTensor(g.VkDataType.FLOAT32, [4]), g.VkTensor(g.VkDataType.FLOAT32, [4])]
    return g.VkGraph(chain=[g.OperatorCall(0, "aten.relu.default", [0, 1])],
                     values=vals, input_ids=[0], output_ids=[1])


X = np.array([-1.5, 2, -3, 4], np.float32)


def test_the_reference_executor_states_the_interface():
    ref = ReferenceGraph.from_graph(_relu_graph(), lambda i: b"")
    assert isinstance(ref, Executor) and ref.keeps_state is False
    assert ref.execute([X])[0].tolist() == np.maximum(X, 0).tolist()
    ref.close()


def test_the_vulkan_executor_states_the_interface(vk_device):
    x = X
    with DelegateGraph(_relu_graph(), lambda i: b"", device=vk_device) as dg:
        assert isinstance(dg, StateExecutor) and dg.keeps_state is True
        assert dg.execute([x])[0].tolist() == np.maximum(x, 0).tolist()
