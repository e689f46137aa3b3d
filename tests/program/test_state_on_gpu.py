"""Mutable buffers stay on the GPU between calls of a lowered program.

Each module is run eagerly and lowered, call after call, on fresh seeded inputs; the
outputs must match eager every call, and the delegate's transfer counters must show
that the state is not uploaded (nor downloaded, unless it is also returned) after the
first call. The validation layer fixture (tests/conftest.py) checks every test.
"""
import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

from vkdelegate import VulkanPartitioner, load, to_backend

from tests.program.conftest import _vulkan_available
from tests.program.helpers import assert_same
# Counter returns its state too: the new value is downloaded, never uploaded.
from tests.program.modules import Counter


@pytest.fixture(autouse=True)
def _needs_vulkan():
    reason = _vulkan_available()
    if reason:
        pytest.skip(reason)


class RunningSum(nn.Module):
    """State read and updated, not returned: neither uploaded nor downloaded."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(2, 8))

    def forward(self, x):
        self.total.add_(x)
        return torch.tanh(self.total) * 2.0


class KVCache(nn.Module):
    """A sliding window written with copy_: drop the oldest column, append x."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 6))

    def forward(self, x):
        self.cache.copy_(torch.cat([self.cache[:, 1:], x], dim=1))
        return self.cache * 0.5 + x


class TwoStates(nn.Module):
    """Two buffers, one of them int32 (a step counter)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(5))
        self.register_buffer("steps", torch.zeros(5, dtype=torch.int32))

    def forward(self, x):
        self.acc.mul_(0.5).add_(x)
        self.steps.add_(1)
        return self.acc * self.steps


class BatchSum(nn.Module):
    """State of fixed size updated from an input with a dynamic batch."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(6))

    def forward(self, x):
        self.total.add_(x.sum(0))
        return x - self.total


class SortNewState(nn.Module):
    """A CPU op (sort) reads the state's new value: kept on the device, downloaded."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(7))

    def forward(self, x):
        self.total.add_(x)
        return torch.sort(self.total)[0] + torch.relu(self.total)


class SortOldState(nn.Module):
    """A CPU op reads the state before the update: it stays on the host path."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(7))

    def forward(self, x):
        before = torch.sort(self.total)[0]
        self.total.add_(x)
        return before + torch.relu(self.total)


class TwoDelegatesReadState(nn.Module):
    """Two delegates (split by a CPU sort) read the state: host path."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.ones(7))

    def forward(self, x):
        b = torch.sort(torch.relu(self.total) + x)[0]
        self.total.mul_(0.5).add_(b)
        return self.total * 2.0


def _lower(module, example, executor="vulkan", dynamic=None, **options):
    ep = torch.export.export(copy.deepcopy(module), (example,), dynamic_shapes=dynamic)
    return to_backend(ep, VulkanPartitioner(dict(options, executor=executor)))


def _inputs(shape, n, seed=0, batches=None):
    gen = torch.Generator().manual_seed(seed)
    sizes = batches or [shape[0]] * n
    return [torch.randn((b,) + tuple(shape[1:]), generator=gen) for b in sizes]


def _run_both(module, program, inputs, tol=1e-5):
    for x in inputs:
        assert_same(program(x), module(x), tol)


def _graph(program, index=0):
    """The DelegateGraph behind delegate ``index`` of the default method."""
    return program.runner(program.default_method()).delegates[index].loaded


@pytest.mark.parametrize("cls,shape,returned", [(Counter, (3,), True),
                                                (RunningSum, (2, 8), False),
                                                (KVCache, (4, 1), False)])
def test_state_not_uploaded_after_first_call(cls, shape, returned):
    torch.manual_seed(0)
    module = cls().eval()
    xs = _inputs(shape, 5)
    program = _lower(module, xs[0])
    assert program.num_delegates() == 1
    _run_both(module, program, xs[:1])
    graph = _graph(program)
    state = next(iter(program.methods["forward"].state.values()))
    state_bytes = state.numel() * state.element_size()
    out_bytes = [sum(t.numel * 4 for t in graph.outputs)]
    assert program.runner("forward").states_on_device == list(
        program.methods["forward"].state)
    for x in xs[1:]:
        assert_same(program(x), module(x), 1e-5)
        # Only x crosses to the device: the state is already there.
        assert graph.last_transfer["upload_bytes"] == x.numel() * 4
        downloaded = graph.last_transfer["download_bytes"]
        if returned:
            assert downloaded == out_bytes[0]
        else:
            assert downloaded == out_bytes[0] - state_bytes
    assert graph.recordings == 2  # at load, and once with the state copy


def test_state_dict_reads_the_gpu_value():
    torch.manual_seed(1)
    module = RunningSum().eval()
    xs = _inputs((2, 8), 3, seed=1)
    program = _lower(module, xs[0])
    _run_both(module, program, xs)
    (value,) = program.state_dict().values()
    np.testing.assert_allclose(np.asarray(value), module.total.numpy(), rtol=1e-6)


def test_two_states_with_int32_counter():
    torch.manual_seed(2)
    module = TwoStates().eval()
    xs = _inputs((5,), 4, seed=2)
    program = _lower(module, xs[0])
    _run_both(module, program, xs)
    assert sorted(program.runner("forward").states_on_device) == ["b_acc", "b_steps"]
    state = program.state_dict()  # program-level: keyed by the buffers' FQNs
    assert sorted(state) == ["acc", "steps"]
    assert np.asarray(state["steps"]).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(state["steps"]), module.steps.numpy())
    by_placeholder = program.state_dict("forward")
    np.testing.assert_array_equal(np.asarray(by_placeholder["b_steps"]),
                                  module.steps.numpy())


def test_save_after_calls_continues_the_sequence(tmp_path):
    torch.manual_seed(3)
    module = KVCache().eval()
    xs = _inputs((4, 1), 6, seed=3)
    program = _lower(module, xs[0])
    _run_both(module, program, xs[:3])
    program.save(tmp_path / "kv.vkp")
    loaded = load(tmp_path / "kv.vkp")
    _run_both(module, loaded, xs[3:])
    assert loaded.runner("forward").states_on_device == ["b_cache"]


def test_close_keeps_the_state():
    torch.manual_seed(4)
    module = Counter().eval()
    xs = _inputs((3,), 4, seed=4)
    program = _lower(module, xs[0])
    _run_both(module, program, xs[:2])
    program.close()  # the state is read back before the device memory goes
    _run_both(module, program, xs[2:])


def test_dynamic_batch_with_state():
    torch.manual_seed(5)
    module = BatchSum().eval()
    xs = _inputs((4, 6), 4, seed=5, batches=[4, 9, 2, 16])
    program = _lower(module, xs[0], dynamic=({0: Dim("batch", min=1, max=16)},))
    _run_both(module, program, xs)
    assert program.runner("forward").states_on_device == ["b_total"]
    assert _graph(program).last_transfer["upload_bytes"] == 16 * 6 * 4


def test_force_fp16_state_on_device():
    torch.manual_seed(6)
    module = RunningSum().eval()
    xs = _inputs((2, 8), 4, seed=6)
    program = _lower(module, xs[0], force_fp16=True)
    _run_both(module, program, xs, tol=1e-2)
    assert program.runner("forward").states_on_device == ["b_total"]


def test_new_value_read_on_cpu_is_downloaded():
    torch.manual_seed(7)
    module = SortNewState().eval()
    xs = _inputs((7,), 4, seed=7)
    program = _lower(module, xs[0])
    _run_both(module, program, xs)
    assert program.runner("forward").states_on_device == ["b_total"]
    assert _graph(program).last_transfer["upload_bytes"] == 7 * 4


@pytest.mark.parametrize("cls", [SortOldState, TwoDelegatesReadState])
def test_state_read_elsewhere_stays_on_host(cls):
    torch.manual_seed(9)
    module = cls().eval()
    xs = _inputs((7,), 4, seed=9)
    program = _lower(module, xs[0])
    assert program.num_delegates() >= 1
    _run_both(module, program, xs)
    assert program.runner("forward").states_on_device == []


def test_reference_executor_keeps_the_host_path():
    torch.manual_seed(8)
    module = KVCache().eval()
    xs = _inputs((4, 1), 4, seed=8)
    program = _lower(module, xs[0], executor="reference")
    _run_both(module, program, xs)
    assert program.runner("forward").states_on_device == []


@pytest.mark.parametrize("staging", [False, True])
def test_graph_bind_state_against_numpy(staging):
    """DelegateGraph level, with and without staging buffers (discrete GPUs stage)."""
    from vkdelegate.runtime import load_delegate

    program = _lower(Counter().eval(), torch.zeros(3))
    delegate = program.methods["forward"].delegates[0]
    rng = np.random.default_rng(10)
    with load_delegate(delegate.blob, delegate.named_data, staging=staging) as graph:
        count = rng.standard_normal(3).astype(np.float32)
        graph.bind_state(0, 0, count.copy(), download=False)
        for _ in range(3):
            x = rng.standard_normal(3).astype(np.float32)
            new_count, y = graph.execute([None, x])
            count = count + 1.0
            assert new_count is None  # not asked for: never downloaded
            np.testing.assert_allclose(y, x + count, rtol=1e-6)
            assert graph.last_transfer == {"upload_bytes": 12, "download_bytes": 12}
        np.testing.assert_allclose(graph.read_state(0), count, rtol=1e-6)


def test_graph_bind_state_errors():
    from vkdelegate import VkDelegateError
    from vkdelegate.runtime import load_delegate

    program = _lower(Counter().eval(), torch.zeros(3))
    delegate = program.methods["forward"].delegates[0]
    with load_delegate(delegate.blob, delegate.named_data) as graph:
        with pytest.raises(VkDelegateError, match="initial value is float64"):
            graph.bind_state(0, 0, np.zeros(3))
        with pytest.raises(VkDelegateError, match="out of range"):
            graph.bind_state(0, 5, np.zeros(3, np.float32))
        with pytest.raises(VkDelegateError, match="not state"):
            graph.read_state(0)
        graph.bind_state(0, 0, np.zeros(3, np.float32))
        with pytest.raises(VkDelegateError, match="already state"):
            graph.bind_state(0, 0, np.zeros(3, np.float32))
        with pytest.raises(VkDelegateError, match="pass None"):
            graph.execute([np.zeros(3, np.float32), np.zeros(3, np.float32)])


def test_profiled_calls_keep_the_state():
    torch.manual_seed(11)
    module = RunningSum().eval()
    xs = _inputs((2, 8), 4, seed=11)
    program = _lower(module, xs[0])
    _run_both(module, program, xs[:1])
    program.set_profiling(True)  # another command buffer, with the same state copy
    _run_both(module, program, xs[1:3])
    program.set_profiling(False)
    _run_both(module, program, xs[3:])
    assert program.runner("forward").states_on_device == ["b_total"]


@pytest.mark.parametrize("staging, mapped_bytes", [(False, None), (True, 0), (True, None)])
def test_two_graphs_bind_one_state_buffer(staging, mapped_bytes, monkeypatch):
    """Runtime level: two DelegateGraphs of one Device bind the same StateBuffer and
    each sees the other's updates: without staging buffers, through a staging buffer
    (no state small enough to map: MAPPED_STATE_BYTES 0), and with staging asked for
    but the 12-byte state mapped where the device has device-local, host-visible
    memory (lavapipe's; a discrete GPU's BAR window)."""
    from vkdelegate import VkDelegateError
    from vkdelegate.runtime import load_delegate, state_buffer

    if mapped_bytes is not None:
        monkeypatch.setattr(state_buffer, "MAPPED_STATE_BYTES", mapped_bytes)
    program = _lower(Counter().eval(), torch.zeros(3))
    delegate = program.methods["forward"].delegates[0]
    rng = np.random.default_rng(12)
    count = rng.standard_normal(3).astype(np.float32)
    with load_delegate(delegate.blob, delegate.named_data, staging=staging) as a, \
            load_delegate(delegate.blob, delegate.named_data, staging=staging) as b:
        buffer = a.state_buffer(0, count.copy())
        mapped = buffer.nbytes <= state_buffer.MAPPED_STATE_BYTES \
            and a.device.mappable_device_local
        assert buffer.staged == (staging and not mapped)
        if not buffer.staged:
            assert buffer.buffer.host is not None  # read and written through its mapping
        own = a.inputs[0].buffer, a.inputs[0].staging
        held = a.values.own_bytes
        try:
            a.bind_state(0, 0, None, download=False, shared=buffer)
            b.bind_state(0, 0, None, download=False, shared=buffer)
            # The input's own memory (and staging buffer) is given back once the
            # shared buffer replaces it: a KV cache is not held once per method.
            assert a.inputs[0].buffer is buffer.buffer
            assert not {id(o) for o in own if o is not None} & a.values.owned_ids
            assert a.values.own_bytes < held
            for graph in (a, b, b, a, b):
                x = rng.standard_normal(3).astype(np.float32)
                _, y = graph.execute([None, x])
                count = count + 1.0
                np.testing.assert_allclose(y, x + count, rtol=1e-6)
                assert graph.last_transfer == {"upload_bytes": 12, "download_bytes": 12}
            np.testing.assert_allclose(buffer.read(), count, rtol=1e-6)
            np.testing.assert_allclose(buffer.read(slice(1, 3)), count[1:3], rtol=1e-6)
            assert buffer.read(slice(2, 2)).shape == (0,)
            with pytest.raises(VkDelegateError, match="step 2"):
                buffer.read(slice(0, 3, 2))
            np.testing.assert_allclose(b.read_state(0), count, rtol=1e-6)
            buffer.write(np.zeros(3, np.float32))
            _, y = a.execute([None, np.zeros(3, np.float32)])
            np.testing.assert_allclose(y, np.ones(3), rtol=1e-6)
            with pytest.raises(VkDelegateError, match="float32"):
                buffer.write(np.zeros(4, np.float32))
        finally:
            a.close()
            b.close()
            buffer.close()
