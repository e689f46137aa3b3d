"""Crafted delegate blobs: value cycles and nesting, node and value counts, the tensor
memory budget and declared output sizes are refused at load, before any allocation."""
import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.backend.reference import load_reference
from vkdelegate.errors import DeviceLimitError, ResourceLimitError, VkDelegateError
from vkdelegate.limits import DEFAULT_LIMITS, LoadLimits
from vkdelegate.runtime import load_delegate
from vkdelegate.serialization import vkgraph as g
from vkdelegate.serialization.blob import read_blob
from vkdelegate.serialization.describe import describe_blob

MiB = 1 << 20


def _relu_graph(shape=(3, 4)) -> GraphMaker:
    m = GraphMaker()
    ix = m.input(shape)
    m.output(m.op("aten.relu.default", [ix], shape))
    return m


def _refused_everywhere(blob: bytes, match: str, limits=None, error=VkDelegateError,
                        decode=True):
    """load_delegate refuses ``blob`` with ``error`` matching ``match``; with
    ``decode`` the reference executor, the reader and inspect's description too (the
    memory budget of all tensors is the Vulkan loader's check: inspecting a huge blob
    works, and the reference executor budgets only the constants it materialises)."""
    loads = [lambda: load_delegate(blob, limits=limits)]
    if decode:
        loads.append(lambda: load_reference(blob, limits=limits))
        loads.append(lambda: read_blob(blob, limits))
        if limits is None:
            loads.append(lambda: describe_blob(blob))
    for load in loads:
        with pytest.raises(error, match=match):
            load()


@pytest.mark.parametrize("cycle", [1, 3])
def test_value_list_containing_itself_is_refused(vk_device, cycle):
    m = _relu_graph()
    first = len(m.graph.values)
    for k in range(cycle):  # ValueList first+k holds a tensor and the next list
        m.graph.values.append(g.ValueList([0, first + (k + 1) % cycle]))
    m.graph.chain.append(g.OperatorCall(1, "aten.cat.default", [first, m.scalar(0), 1]))
    last = first + cycle - 1
    _refused_everywhere(m.blob(), rf"value {last} \(ValueList\) item 1 is value {first}, "
                                  rf"which contains value {last}: a ValueList may not "
                                  rf"contain itself")


def test_value_list_nesting_over_the_limit(vk_device):
    def nested(depth):
        m = _relu_graph()
        inner = 0
        for _ in range(depth):
            m.graph.values.append(g.ValueList([inner]))
            inner = len(m.graph.values) - 1
        return m.blob(), inner

    blob, top = nested(3)
    limits = LoadLimits(max_value_depth=2)
    _refused_everywhere(blob, rf"delegate blob: the nesting depth of ValueList value "
                              rf"{top} is 3, over the load limit max_value_depth=2",
                        limits, ResourceLimitError)
    read_blob(blob, LoadLimits(max_value_depth=3))
    # The default (32) refuses a deep chain without a RecursionError anywhere.
    blob, _ = nested(5000)
    _refused_everywhere(blob, "over the load limit max_value_depth=32",
                        error=ResourceLimitError)


def test_node_and_value_counts_over_the_limit(vk_device):
    blob = _relu_graph().blob()
    _refused_everywhere(blob, "the operator call count of the graph is 1, over the load "
                              "limit max_nodes=0", LoadLimits(max_nodes=0), ResourceLimitError)
    _refused_everywhere(blob, "the value count of the graph is 2, over the load limit "
                              "max_values=1", LoadLimits(max_values=1), ResourceLimitError)


def test_tensor_budget_with_tight_limits(vk_device):
    # relu of [512, 1024] float32: 2 MiB in, 2 MiB out.
    blob = _relu_graph((512, 1024)).blob()
    tight = LoadLimits(max_device_bytes=3 * MiB)
    _refused_everywhere(blob, r"delegate blob: the memory of all tensors in bytes \(shared "
                              r"mem_obj_ids counted once\) is 4,194,304, over the load "
                              r"limit max_device_bytes=3,145,728", tight, ResourceLimitError,
                        decode=False)
    _refused_everywhere(blob, r"value 0: tensor float32 \[512, 1024\] in bytes is "
                              r"2,097,152, over the load limit max_tensor_bytes=1,048,576",
                        LoadLimits(max_tensor_bytes=MiB), ResourceLimitError, decode=False)
    # Sharing one mem_obj_id, both count once: the same budget then fits.
    m = _relu_graph((512, 1024))
    for v in m.graph.values:
        v.mem_obj_id = 0
    with load_delegate(m.blob(), limits=tight) as graph:
        x = rand(np.random.default_rng(1), (512, 1024))
        np.testing.assert_array_equal(graph.execute([x])[0], np.maximum(x, 0))


def test_reference_executor_budgets_every_tensor(vk_device):
    m = GraphMaker()
    ix = m.input((512, 1024))
    m.output(m.op("aten.add.Tensor", [ix, m.constant(np.ones((512, 1024), np.float32)),
                                      m.scalar(1)], (512, 1024)))
    blob = m.blob()
    with pytest.raises(ResourceLimitError, match=r"value 0: tensor float32 \[512, 1024\] "
                                                 r"in bytes is 2,097,152, over the load "
                                                 r"limit max_tensor_bytes=1,048,576"):
        load_reference(blob, limits=LoadLimits(max_tensor_bytes=MiB))
    # A blob over its load limits runs nowhere: not a device limit, so no CPU fallback.
    assert not issubclass(ResourceLimitError, DeviceLimitError)
    x = rand(np.random.default_rng(2), (512, 1024))
    np.testing.assert_array_equal(load_reference(blob).execute([x])[0], x + 1)
    with pytest.raises(VkDelegateError, match=r"input 0 .* has sizes \[513, 1024\], over "
                                              r"its declared upper bounds \[512, 1024\]"):
        load_reference(blob).execute([rand(np.random.default_rng(2), (513, 1024)), ])


def test_default_budget_refuses_huge_tensors(vk_device):
    # 20 GB in one tensor (over max_tensor_bytes) and 5 x 7 GiB (over max_device_bytes).
    m = _relu_graph((5, 1 << 30))
    _refused_everywhere(m.blob(), "value 0: .* is 21,474,836,480, over the load limit "
                                  "max_tensor_bytes=8,589,934,592", error=ResourceLimitError,
                        decode=False)
    m = GraphMaker()
    x = m.input((7, 1 << 28))
    for _ in range(4):
        x = m.op("aten.relu.default", [x], (7, 1 << 28))
    m.output(x)
    assert 5 * 7 * 2**30 > DEFAULT_LIMITS.max_device_bytes
    _refused_everywhere(m.blob(), "is 37,580,963,840, over the load limit max_device_bytes",
                        error=ResourceLimitError, decode=False)
    # A dim product near 2**64 (uint32 dims in the flatbuffer) is measured, not overflowed.
    m = _relu_graph((0xFFFFFFFF, 0xFFFFFFFF))
    _refused_everywhere(m.blob(), "value 0: tensor float32 "
                                  r"\[4294967295, 4294967295\] in bytes is 73,786,976,260,\d+",
                        error=ResourceLimitError, decode=False)


def test_2_to_the_64_dim_in_a_graph_is_refused(vk_device):
    m = _relu_graph()
    m.graph.values[0].dims = [1 << 64]
    with pytest.raises(ResourceLimitError, match=r"value 0: tensor float32 "
                                                 r"\[18446744073709551616\] in bytes is"):
        m.build(vk_device)
    m.graph.values[0].dims = [-3]
    with pytest.raises(VkDelegateError, match=r"value 0 \(VkTensor\) has size -3"):
        m.build(vk_device)


def test_wrong_declared_output_size_is_refused(vk_device):
    m = GraphMaker()
    ix, iy = m.input((3, 4)), m.input((1, 4))
    m.output(m.op("aten.add.Tensor", [ix, iy, m.scalar(1)], (3, 5)))
    blob = m.blob()
    with pytest.raises(VkDelegateError, match=r"^node 0 \(aten.add.Tensor\): declares "
                                              r"output value 3 as \[3, 5\], the op gives "
                                              r"\[3, 4\] for inputs \[3, 4\], \[1, 4\]$"):
        load_delegate(blob)
    m = GraphMaker()
    ix = m.input((2, 6))
    m.graph.values.append(g.ValueList([]))
    parts = m.op("aten.split_with_sizes.default", [ix, m.scalar([2, 4]), m.scalar(1)],
                 (2, 2))
    second = m.tensor((2, 5))
    m.graph.values[parts] = g.ValueList([m.tensor((2, 2)), second])
    m.output(second)
    with pytest.raises(VkDelegateError, match=r"declares output value \d+ item 1 as "
                                              r"\[2, 5\], the op gives \[2, 4\]"):
        load_delegate(m.blob())


def test_non_tensor_where_a_tensor_belongs(vk_device):
    m = GraphMaker()
    ix = m.input((1, 2, 5, 5))
    w = m.scalar(7)  # an Int as the weight
    m.output(m.op("aten.convolution.default",
                  [ix, w, m.scalar(None), m.scalar([1, 1]), m.scalar([0, 0]),
                   m.scalar([1, 1]), m.scalar(False), m.scalar([0, 0]), m.scalar(1)],
                  (1, 3, 3, 3)))
    with pytest.raises(VkDelegateError, match=rf"^node 0 \(aten.convolution.default\): "
                                              rf"argument 1 \(value {w}\) is Int, where "
                                              rf"the op expects a tensor$"):
        load_delegate(m.blob())
    m = GraphMaker()
    ix = m.input((2, 3))
    m.output(m.op("aten.relu.default", [ix], (2, 3)))
    m.graph.chain[0].args[-1] = m.scalar(1.5)
    with pytest.raises(VkDelegateError, match=r"node 0 \(aten.relu.default\): output "
                                              r"value 2 is Double, expected a tensor"):
        load_delegate(m.blob())


def _conv_blob(x_shape, w_shape, stride, padding, dilation, transposed=False,
               out_shape=None):
    from vkdelegate.ops.families.convolution import conv_shape

    m = GraphMaker()
    ix = m.input(x_shape)
    w = m.constant(rand(np.random.default_rng(3), w_shape))
    n = len(stride)
    out = out_shape or conv_shape(x_shape, w_shape, stride, padding, dilation, transposed,
                                  [0] * n, 1)
    m.output(m.op("aten.convolution.default",
                  [ix, w, m.scalar(None), m.scalar(stride), m.scalar(padding),
                   m.scalar(dilation), m.scalar(transposed), m.scalar([0] * n),
                   m.scalar(1)], out))
    return m


@pytest.mark.parametrize("stride, padding, dilation, match", [
    # These hung pipeline creation for minutes or grew past 20 GB (an array sized by
    # the stride's specialization constant); now refused or made harmless at once.
    ([1 << 28, 1 << 28], [1 << 28, 1 << 28], [1, 1], "a row segment of 1879048195 "
     "input columns per invocation .* the shader holds at most 4096"),
    ([1, 1], [0, 0], [65537, 1], r"kernel extent 131075 \(kernel 3, dilation 65537\) is "
     r"larger than the padded input size 8"),
    ([1, 1], [1 << 30, 0], [1, 1], "stride 1, padding 1073741824 and dilation 1 over an "
     "input of 8 exceed the shader's int32 index range"),
])
def test_crafted_convolution_geometry_is_refused_quickly(vk_device, stride, padding,
                                                         dilation, match):
    m = _conv_blob((1, 1, 8, 8), (1, 1, 3, 3), stride, padding, dilation,
                   out_shape=(1, 1, 3, 3))
    with pytest.raises(VkDelegateError, match=r"^node 0 \(aten.convolution.default\): "
                                              + match):
        load_delegate(m.blob())


def test_unused_huge_stride_runs_like_eager(vk_device):
    # One output column: ATen never uses the stride, and neither does the shader now.
    torch = pytest.importorskip("torch")
    m = _conv_blob((1, 1, 8, 8), (1, 1, 3, 3), [65537, 65537], [0, 0], [1, 1])
    x = rand(np.random.default_rng(4), (1, 1, 8, 8))
    w = np.frombuffer(m.constants[0], np.float32).reshape(1, 1, 3, 3)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w.copy()),
                                      stride=65537).numpy()
    with load_delegate(m.blob()) as graph:
        got = graph.execute([x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_crafted_pooling_window_is_refused(vk_device):
    m = GraphMaker()
    ix = m.input((1, 2, 6, 6))
    m.output(m.op("aten.avg_pool2d.default",
                  [ix, m.scalar([2, 2]), m.scalar([2, 2]), m.scalar([3, 0]), m.scalar(False),
                   m.scalar(True), m.scalar(None)], (1, 2, 6, 3)))
    with pytest.raises(VkDelegateError, match=r"node 0 \(aten.avg_pool2d.default\): "
                                              r"padding 3 is more than half the kernel"):
        load_delegate(m.blob())


def test_values_past_int32_name_the_node_and_field(vk_device):
    # An integer alpha past int32 for an int32 add goes into a parameter block's ivec4.
    m = GraphMaker()
    ix, iy = m.input((4,), "int32"), m.input((4,), "int32")
    m.output(m.op("aten.add.Tensor", [ix, iy, m.scalar(1 << 40)], (4,), "int32"))
    with pytest.raises(VkDelegateError, match=r"^node 0 \(aten.add.Tensor\): parameter "
                                              r"scalars_block.iscalars\[0\] is "
                                              r"1099511627776, outside the int32 range"):
        load_delegate(m.blob())
    # A float alpha that large is fine for a float add (only the float row is read).
    m = GraphMaker()
    ix, iy = m.input((4,)), m.input((4,))
    m.output(m.op("aten.add.Tensor", [ix, iy, m.scalar(1e12)], (4,)))
    x, y = np.ones(4, np.float32), np.full(4, 2.0, np.float32)
    with load_delegate(m.blob()) as graph:
        np.testing.assert_array_equal(graph.execute([x, y])[0], x + np.float32(1e12) * y)


def test_specialization_constant_range_is_checked(vk_device):
    from vkdelegate.runtime.pipeline import Pipeline

    with pytest.raises(VkDelegateError, match=r"specialization constant 3 of shader "
                                              r"conv2d is 4294967296, outside the int32"):
        Pipeline(vk_device, "conv2d", {}, (), (1, 1, 1, 1 << 32))
