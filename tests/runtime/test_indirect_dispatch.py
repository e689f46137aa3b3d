"""Dispatch grids that follow the current sizes (NodeBuilder.dispatch's ``grid``,
vkCmdDispatchIndirect; ``Device.indirect_dispatch``, on by default on CPU drivers): a
graph resized below its upper bounds runs only the workgroups its sizes need, with
outputs bit-identical to the fixed grids'; the counts are rewritten at every resize;
a grid past its bound is refused naming the node."""
import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import Device


def _graph(m, rows: int = 64):
    """x [rows, 96] -> linear 96 -> 40 (+ bias) -> relu -> transpose: linear.glsl on CPU
    drivers, an elementwise dispatch, an affine copy."""
    rng = np.random.default_rng(3)
    ix = m.input((rows, 96))
    lin = m.op("aten.linear.default", [ix, m.constant(rand(rng, (40, 96))),
                                       m.constant(rand(rng, (40,)))], (rows, 40))
    act = m.op("aten.relu.default", [lin], (rows, 40))
    m.output(m.op("aten.permute.default", [act, m.scalar([1, 0])], (40, rows)))


def _run(device, sizes):
    m = GraphMaker()
    _graph(m)
    rng = np.random.default_rng(9)
    outs, counts = [], []
    with m.build(device) as graph:
        for n in sizes:
            outs.append(graph.execute([rand(rng, (n, 96))])[0])
            view = graph._indirect_view
            counts.append(None if view is None else view[:, :3].copy())
    return outs, counts


def test_resized_grids_shrink_and_outputs_equal_the_fixed_grids(vk_device):
    if not vk_device.indirect_dispatch:
        pytest.skip("this device keeps fixed grids (a GPU)")
    sizes = [64, 5, 17, 1, 64]
    indirect, counts = _run(vk_device, sizes)
    fixed_device = Device(indirect_dispatch=False)
    try:
        fixed, none = _run(fixed_device, sizes)
    finally:
        fixed_device.close()
    assert all(c is None for c in none)
    for a, b in zip(indirect, fixed):
        assert a.tobytes() == b.tobytes()
    # linear (linear.glsl, CPU drivers; a GPU's GEMM forms keep fixed grids), relu,
    # permute: every one follows the sizes
    assert len(counts[0]) == (3 if vk_device.info.type == "cpu" else len(counts[0])) >= 2
    total = [int(np.prod(c, axis=1).sum()) for c in counts]
    assert total[1] < total[2] < total[0] == total[4] and total[3] <= total[1]


@pytest.mark.parametrize("node", ["linear", "permute"])
def test_a_grid_past_its_bound_is_refused(vk_device, monkeypatch, node):
    if not vk_device.indirect_dispatch:
        pytest.skip("this device keeps fixed grids (a GPU)")
    from vkdelegate.kernels import affine_copy, gemm

    m = GraphMaker()
    _graph(m)
    with m.build(vk_device) as graph:
        if node == "linear":
            if len(graph._indirect_fns) < 3:
                pytest.skip("this device's linear kernel keeps a fixed grid")
            monkeypatch.setattr(gemm, "linear_grid", lambda shape, tile: (10 ** 6, 10 ** 4, 1))
            pattern = r"node \d+ \(aten\.linear\.default\): grid .* of linear past its bound"
        else:
            monkeypatch.setattr(affine_copy, "invocations", lambda plan, chunk: (10 ** 9, 0))
            pattern = (r"node \d+ \(aten\.permute\.default\): grid .* of affine_copy past "
                       r"its bound")
        with pytest.raises(VkDelegateError, match=pattern):
            graph.execute([np.zeros((5, 96), np.float32)])
        monkeypatch.undo()
        out = graph.execute([np.ones((5, 96), np.float32)])[0]  # resized from scratch
        assert out.shape == (40, 5)


def test_the_environment_overrides_the_default(vk_device, monkeypatch):
    for value, want in (("1", True), ("0", False)):
        monkeypatch.setenv("VKDELEGATE_INDIRECT_DISPATCH", value)
        device = Device()
        try:
            assert device.indirect_dispatch is want
        finally:
            device.close()
    monkeypatch.setenv("VKDELEGATE_INDIRECT_DISPATCH", "1")
    device = Device(indirect_dispatch=False)  # an argument wins
    try:
        assert device.indirect_dispatch is False
    finally:
        device.close()
