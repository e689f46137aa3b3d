"""DelegateGraph behaviour: replay, resize without re-recording, barriers, aliasing,
staging, profiling, blob loading and error messages."""
import json

import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import load_delegate
from vkdelegate.runtime.host_calls import count_calls
from vkdelegate.serialization import vkgraph as g
from vkdelegate.serialization.blob import write_blob


def _mixed_graph(m: GraphMaker, rows: int):
    """x[rows,29] @ w[29,11] -> + bias[11] -> relu -> sum over dim 1 (keepdim)
    and -> sub y[rows,1] (alpha 0.5): both outputs. Returns the input ids."""
    ix = m.input((rows, 29))
    iy = m.input((rows, 1))
    w = rand(np.random.default_rng(10), (29, 11))
    bias = rand(np.random.default_rng(11), (11,))
    mm = m.op("aten.mm.default", [ix, m.constant(w)], (rows, 11))
    add = m.op("aten.add.Tensor", [mm, m.constant(bias), m.scalar(1)], (rows, 11))
    relu = m.op("aten.relu.default", [add], (rows, 11))
    total = m.op("aten.sum.dim_IntList", [relu, m.scalar([1]), m.scalar(True),
                                          m.scalar(None)], (rows, 1))
    diff = m.op("aten.sub.Tensor", [relu, iy, m.scalar(0.5)], (rows, 11))
    m.output(total)
    m.output(diff)
    return w, bias


def _reference(x, y, w, bias):
    relu = np.maximum(x.astype(np.float64) @ w + bias, 0)
    return relu.sum(axis=1, keepdims=True), relu - 0.5 * y


def _check(outs, x, y, w, bias):
    for got, want in zip(outs, _reference(x, y, w, bias)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_hundred_runs_bit_identical(vk_device):
    m = GraphMaker()
    w, bias = _mixed_graph(m, 37)
    rng = np.random.default_rng(12)
    x, y = rand(rng, (37, 29)), rand(rng, (37, 1))
    with m.build(vk_device) as graph:
        first = graph.execute([x, y])
        _check(first, x, y, w, bias)
        for _ in range(99):
            again = graph.execute([x, y])
            for a, b in zip(first, again):
                assert a.tobytes() == b.tobytes()
        assert graph.recordings == 1


@pytest.mark.parametrize("staging", [False, True])
def test_resize_without_rerecording(vk_device, staging):
    m = GraphMaker()
    w, bias = _mixed_graph(m, 37)
    rng = np.random.default_rng(13)
    with m.build(vk_device, staging=staging) as graph:
        for rows in (37, 5, 1, 0, 29, 37):
            x, y = rand(rng, (rows, 29)), rand(rng, (rows, 1))
            _check(graph.execute([x, y]), x, y, w, bias)
        assert graph.recordings == 1


def test_resize_broadcast_and_reduction(vk_device):
    m = GraphMaker()
    ia, ib = m.input((7, 1, 11)), m.input((5, 1))
    add = m.op("aten.add.Tensor", [ia, ib, m.scalar(2.0)], (7, 5, 11))
    m.output(m.op("aten.sum.dim_IntList", [add, m.scalar([0, 2]), m.scalar(False),
                                           m.scalar(None)], (5,)))
    rng = np.random.default_rng(14)
    with m.build(vk_device) as graph:
        for sa, sb in (((7, 1, 11), (5, 1)), ((3, 1, 4), (2, 1)), ((1, 1, 1), (5, 1))):
            a, b = rand(rng, sa), rand(rng, sb)
            want = (a.astype(np.float64) + 2 * b).sum(axis=(0, 2))
            np.testing.assert_allclose(graph.execute([a, b])[0], want, rtol=1e-4, atol=1e-4)
        assert graph.recordings == 1


def test_resize_beyond_bound_is_an_error(vk_device):
    m = GraphMaker()
    ix = m.input((5, 3))
    m.output(m.op("aten.relu.default", [ix], (5, 3)))
    with m.build(vk_device) as graph:
        with pytest.raises(VkDelegateError, match=r"tensor 0: sizes \[6, 3\] exceed the "
                                                  r"upper bounds \[5, 3\]"):
            graph.execute([np.zeros((6, 3), np.float32)])


def test_barriers_only_between_dependent_dispatches(vk_device):
    m = GraphMaker()
    ix = m.input((13,))
    a = m.op("aten.relu.default", [ix], (13,))
    b = m.op("aten.neg.default", [ix], (13,))       # independent of a
    c = m.op("aten.add.Tensor", [a, b, m.scalar(1)], (13,))  # needs both
    for v in (a, b, c):
        m.output(v)
    with m.build(vk_device) as graph:
        assert graph.barriers == 1
        x = rand(np.random.default_rng(15), (13,))
        got = graph.execute([x])
        np.testing.assert_allclose(got[2], np.maximum(x, 0) - x, rtol=1e-6)


def test_shared_mem_obj_id_aliases_memory(vk_device):
    # t1 and t3 share memory object 0; their lifetimes do not overlap.
    m = GraphMaker()
    ix = m.input((29,))
    t1 = m.op("aten.relu.default", [ix], (29,), mem_obj_id=0)
    t2 = m.op("aten.neg.default", [t1], (29,), mem_obj_id=1)
    t3 = m.op("aten.exp.default", [t2], (29,), mem_obj_id=0)
    m.output(m.op("aten.add.Tensor", [t3, ix, m.scalar(1)], (29,)))
    with m.build(vk_device) as graph:
        assert graph.resolve(t1).buffer.region == graph.resolve(t3).buffer.region
        assert graph.resolve(t1).buffer.region != graph.resolve(t2).buffer.region
        x = rand(np.random.default_rng(16), (29,))
        np.testing.assert_allclose(graph.execute([x])[0], np.exp(-np.maximum(x, 0)) + x,
                                   rtol=1e-5)
        # Every step depends on the previous one (neg reads t1, exp reads t2 and
        # rewrites t1's memory, add reads t3): one barrier before each of the three.
        assert graph.barriers == 3


def test_int64_and_float64_converted_at_the_boundary(vk_device):
    m = GraphMaker()
    i64, f64 = m.input((3,), "int64"), m.input((2,), "float64")
    m.output(i64)
    m.output(f64)
    with m.build(vk_device) as graph:
        a, b = np.array([-5, 0, 2**31 - 1]), np.array([0.25, -1.5])
        out = graph.execute([a, b])
        assert out[0].dtype == np.int64 and out[0].tolist() == a.tolist()
        assert out[1].dtype == np.float64 and out[1].tolist() == b.tolist()
        with pytest.raises(VkDelegateError, match="input 0: int64 value 2147483648 does "
                                                  "not fit in int32"):
            graph.execute([np.array([0, 1, 2**31]), b])


@pytest.mark.parametrize("staging", [None, True], ids=["default", "staged"])
def test_profile(vk_device, tmp_path, staging):
    # staged: inputs uploaded by copies (a discrete GPU's path), which the profile's
    # first timestamp follows (runtime/commands.py): the validation layer checks it.
    m = GraphMaker()
    _mixed_graph(m, 37)
    rng = np.random.default_rng(17)
    with m.build(vk_device, staging=staging) as graph:
        x = [rand(rng, (37, 29)), rand(rng, (37, 1))]
        graph.execute(x, profile=True)
        prof = graph.last_profile
        assert [d.op for d in prof.dispatches] == [
            "aten.mm.default", "aten.add.Tensor", "aten.relu.default",
            "aten.sum.dim_IntList", "aten.sub.Tensor"]
        assert all(d.duration_ns >= 0 for d in prof.dispatches)
        assert "aten.sum.dim_IntList" in prof.table()
        path = tmp_path / "trace.json"
        prof.write_chrome_trace(path)
        events = json.loads(path.read_text())["traceEvents"]
        assert [e["args"]["node_id"] for e in events] == [0, 1, 2, 3, 4]
        assert graph.recordings == 1
        np.testing.assert_allclose(graph.execute(x, profile=True)[0],
                                   graph.execute(x)[0], rtol=0, atol=0)


def test_load_delegate_from_blob(vk_device):
    m = GraphMaker()
    ix = m.input((5, 7))
    w = rand(np.random.default_rng(18), (7,))
    data = w.tobytes()
    section = data + bytes(-len(data) % 16)
    m.graph.constants.append(g.VkBytes(0, len(data)))
    m.graph.values.append(g.VkTensor(g.VkDataType.FLOAT32, [7], constant_id=0))
    wid = len(m.graph.values) - 1
    m.output(m.op("aten.add.Tensor", [ix, wid, m.scalar(1)], (5, 7)))
    blob = write_blob(m.graph, section)
    with load_delegate(blob, device=vk_device) as graph:
        x = rand(np.random.default_rng(19), (5, 7))
        np.testing.assert_allclose(graph.execute([x])[0], x + w, rtol=1e-6)


def test_input_errors(vk_device):
    m = GraphMaker()
    ix = m.input((5, 3))
    m.output(m.op("aten.relu.default", [ix], (5, 3)))
    with m.build(vk_device) as graph:
        with pytest.raises(VkDelegateError, match="graph takes 1 inputs, got 2"):
            graph.execute([np.zeros((5, 3), np.float32)] * 2)
        with pytest.raises(VkDelegateError, match="input 0 has dtype float64, the graph "
                                                  "expects float32"):
            graph.execute([np.zeros((5, 3))])
        with pytest.raises(VkDelegateError, match="input 0 has rank 1"):
            graph.execute([np.zeros(15, np.float32)])
        # A byte-swapped float32 is float32 (the dtype's name decides): converted in.
        x = np.random.default_rng(3).standard_normal((5, 3)).astype(">f4")
        np.testing.assert_array_equal(graph.execute([x])[0], np.maximum(x, 0))
    with pytest.raises(VkDelegateError, match="closed"):
        graph.execute([np.zeros((5, 3), np.float32)])


def test_load_errors(vk_device):
    m = GraphMaker()
    ix = m.input((3,))
    m.output(m.op("aten.frobnicate.default", [ix], (3,)))
    with pytest.raises(VkDelegateError, match="aten.frobnicate.default is not supported"):
        m.build(vk_device)

    m = GraphMaker()
    ix = m.input((3,), "int32")
    m.output(m.op("aten.sigmoid.default", [ix], (3,), "int32"))
    with pytest.raises(VkDelegateError, match=r"node 0 \(aten.sigmoid.default\): "
                                              r"argument 0 has dtype int32"):
        m.build(vk_device)

    m = GraphMaker()
    ix = m.input((3,))
    w = m.constant(np.zeros(2, np.float32))
    m.graph.values[w].dims = [3]  # 8 bytes of data for 3 floats
    m.output(m.op("aten.add.Tensor", [ix, w, m.scalar(1)], (3,)))
    with pytest.raises(VkDelegateError, match=r"tensor 1: constant 0 has 8 bytes, "
                                              r"float32 \[3\] needs 12"):
        m.build(vk_device)


def test_host_work_per_execute_does_not_grow_with_nodes(vk_device):
    # Not a timing test: the host thread makes exactly the same calls per execute for a
    # 2-node and a 60-node graph (one submit, one fence wait, whatever the node count).
    x = rand(np.random.default_rng(20), (17,))
    counts = []
    for nodes in (2, 60):
        m = GraphMaker()
        prev = m.input((17,))
        for _ in range(nodes):
            prev = m.op("aten.relu.default", [prev], (17,))
        m.output(prev)
        with m.build(vk_device) as graph:
            graph.execute([x])
            counts.append(count_calls(lambda: graph.execute([x])))
            np.testing.assert_array_equal(graph.execute([x])[0], np.maximum(x, 0))
    assert counts[0] == counts[1]


def test_malformed_node_is_reported(vk_device):
    m = GraphMaker()
    ix = m.input((3, 3))
    m.output(m.op("aten.mm.default", [ix, ix, ix], (3, 3)))  # one argument too many
    with pytest.raises(VkDelegateError, match=r"node 0 \(aten.mm.default\): malformed "
                                              r"arguments \[0, 0, 0, 1\]"):
        m.build(vk_device)


def test_large_grid_folds_into_rows(vk_device, monkeypatch):
    # More workgroups than maxComputeWorkGroupCount[0] allows: the dispatch folds the
    # 1-D grid into x * y and shaders recover the index with linear_id(). The limit is
    # lowered for the test (it is 65535 on lavapipe but 2^31 - 1 on NVIDIA GPUs).
    counts = vk_device.info.max_workgroup_count
    monkeypatch.setattr(vk_device.info, "max_workgroup_count", (97,) + tuple(counts[1:]))
    n = 97 * 256 + 4099  # > 97 workgroups of 64 or of 256 invocations
    m = GraphMaker()
    ix = m.input((n,))
    m.output(m.op("aten.neg.default", [ix], (n,)))
    x = rand(np.random.default_rng(23), (n,))
    with m.build(vk_device) as graph:
        assert graph.dispatches[0].groups[1] > 1
        np.testing.assert_array_equal(graph.execute([x])[0], -x)


def test_non_contiguous_and_bool_inputs(vk_device):
    m = GraphMaker()
    ia, ib = m.input((5, 7)), m.input((5, 7), "bool")
    m.output(m.op("aten.relu.default", [ia], (5, 7)))
    m.output(ib)
    base = rand(np.random.default_rng(24), (7, 5))
    flags = rand(np.random.default_rng(25), (5, 7), "bool")
    with m.build(vk_device) as graph:
        out, same = graph.execute([base.T, flags])  # a transposed view
        np.testing.assert_array_equal(out, np.maximum(base.T, 0))
        assert same.dtype == np.bool_ and (same == flags).all()


def test_failed_resize_leaves_no_stale_metadata(vk_device):
    m = GraphMaker()
    ia, ib = m.input((5, 7)), m.input((5, 7))
    m.output(m.op("aten.add.Tensor", [ia, ib, m.scalar(1)], (5, 7)))
    rng = np.random.default_rng(26)
    a, b = rand(rng, (5, 7)), rand(rng, (5, 7))
    with m.build(vk_device) as graph:
        with pytest.raises(VkDelegateError, match=r"node 0 \(aten.add.Tensor\): sizes "
                                                  r"\[2, 7\] and \[3, 7\] do not broadcast"):
            graph.execute([a[:2], b[:3]])
        with pytest.raises(VkDelegateError, match="exceed the upper bounds"):
            graph.execute([a[:2], np.zeros((6, 7), np.float32)])
        np.testing.assert_allclose(graph.execute([a, b])[0], a + b, rtol=1e-6)


def test_graphs_run_from_several_threads(vk_device):
    from concurrent.futures import ThreadPoolExecutor
    graphs = []
    for k in range(3):
        m = GraphMaker()
        ix = m.input((97,))
        m.output(m.op("aten.add.Tensor", [ix, ix, m.scalar(float(k))], (97,)))
        graphs.append(m.build(vk_device))
    x = rand(np.random.default_rng(27), (97,))

    def run(k):  # two threads per graph, three graphs
        k %= 3
        return all(np.allclose(graphs[k].execute([x])[0], x * (1 + k)) for _ in range(20))
    try:
        with ThreadPoolExecutor(6) as pool:
            assert all(pool.map(run, range(6)))
    finally:
        for graph in graphs:
            graph.close()


def test_tensor_without_dtype_is_reported(vk_device):
    m = GraphMaker()
    ix = m.input((3,))
    m.output(m.op("aten.relu.default", [ix], (3,)))
    m.graph.values[1].datatype = g.VkDataType.UNSET
    with pytest.raises(VkDelegateError, match=r"tensor 1 has no dtype \(datatype 127\)"):
        m.build(vk_device)


def test_small_graph_holds_little_memory(vk_device):
    m = GraphMaker()
    ix = m.input((64,))
    m.output(m.op("aten.relu.default", [ix], (64,)))
    with m.build(vk_device) as graph:
        # One 1 MiB block per memory type in use (tensors, uniforms, and on discrete
        # GPUs host-cached staging), not 64 MiB.
        assert graph.allocator.allocated_bytes <= 4 << 20
        assert "1 nodes" in repr(graph) and "1 dispatches" in repr(graph)
