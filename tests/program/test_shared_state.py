"""State shared across the methods of one program: a buffer named by one FQN is ONE
value (on Vulkan one device allocation) that every method reads and updates.

The methods are built the documented way: modules that hold the same buffer under the
same FQN, exported one by one and lowered with ONE ``to_backend`` call taking a dict
of method name -> ExportedProgram. Every call is compared with the same modules run
eagerly in the same order (they share the buffer object, as the program must).
"""
import numpy as np
import pytest
import torch
from torch import nn

from vkdelegate import VkDelegateError, VulkanPartitioner, load, to_backend

from tests.program.conftest import _vulkan_available
from tests.program.helpers import assert_same


class Store(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(4, 6))


class Write(nn.Module):
    """acc <- 0.5 * acc + x; returns tanh(acc)."""

    def __init__(self, store):
        super().__init__()
        self.store = store

    def forward(self, x):
        self.store.acc.mul_(0.5).add_(x)
        return torch.tanh(self.store.acc)


class Bump(nn.Module):
    """acc <- acc + y * 2 (y of another shape, broadcast); returns acc * y."""

    def __init__(self, store):
        super().__init__()
        self.store = store

    def forward(self, y):
        self.store.acc.add_(y * 2.0)
        return self.store.acc * y


def _program(executor):
    store = Store()
    modules = {"write": Write(store), "bump": Bump(store)}
    examples = {"write": torch.zeros(4, 6), "bump": torch.zeros(1, 6)}
    eps = {name: torch.export.export(m, (examples[name],)) for name, m in modules.items()}
    store.acc.zero_()
    return modules, to_backend(eps, VulkanPartitioner({"executor": executor}))


def _calls(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [("write", torch.randn(4, 6, generator=gen)) if i % 3 != 2 else
            ("bump", torch.randn(1, 6, generator=gen)) for i in range(n)]


@pytest.fixture(params=["reference", "vulkan"])
def executor(request):
    if request.param == "vulkan" and _vulkan_available():
        pytest.skip(_vulkan_available())
    return request.param


def test_methods_share_one_state(executor):
    modules, program = _program(executor)
    assert program.store.names == ["store.acc"]
    for name, x in _calls(8, 0):
        assert_same(program.run(name, x), modules[name](x), 1e-5)
    np.testing.assert_allclose(np.asarray(program.state_dict()["store.acc"]),
                               modules["write"].store.acc.numpy(), rtol=1e-5, atol=1e-6)


def test_one_device_buffer_and_no_state_transfer():
    if _vulkan_available():
        pytest.skip(_vulkan_available())
    modules, program = _program("vulkan")
    calls = _calls(7, 1)
    for name, x in calls:
        assert_same(program.run(name, x), modules[name](x), 1e-5)
    for name in ("write", "bump"):
        assert program.runner(name).states_on_device == ["b_store_acc"]
    graphs = [program.runner(n).delegates[0].loaded for n in ("write", "bump")]
    assert graphs[0].device is graphs[1].device
    shared = [next(iter(g.shared_states.values())) for g in graphs]
    assert shared[0] is shared[1] is program.store.device_buffer("store.acc")
    for name, x in calls[-3:]:
        assert_same(program.run(name, x), modules[name](x), 1e-5)
        moved = program.last_transfer(name)
        # Only x goes up and the output comes down; the 96-byte state never moves.
        assert moved == {"upload_bytes": x.numel() * 4, "download_bytes": 96,
                         "state_upload_bytes": 0, "state_download_bytes": 0}


def test_reset_state_and_save_current_state(executor, tmp_path):
    modules, program = _program(executor)
    calls = _calls(6, 2)
    for name, x in calls[:4]:
        program.run(name, x)
        modules[name](x)
    program.save(tmp_path / "two.vkp")  # stores the current state (and the initial)
    loaded = load(tmp_path / "two.vkp")
    for name, x in calls[4:]:
        expected = modules[name](x)
        assert_same(loaded.run(name, x), expected, 1e-5)
        assert_same(program.run(name, x), expected, 1e-5)
    for p in (program, loaded):
        p.reset_state()
        np.testing.assert_array_equal(np.asarray(p.state_dict()["store.acc"]),
                                      np.zeros((4, 6), np.float32))
    store = modules["write"].store
    store.acc.zero_()
    for name, x in calls[:3]:
        assert_same(loaded.run(name, x), modules[name](x), 1e-5)


def test_close_keeps_shared_state():
    if _vulkan_available():
        pytest.skip(_vulkan_available())
    modules, program = _program("vulkan")
    calls = _calls(6, 3)
    for name, x in calls[:3]:
        program.run(name, x)
        modules[name](x)
    program.close()
    assert not program.store.on_device("store.acc")
    for name, x in calls[3:]:
        assert_same(program.run(name, x), modules[name](x), 1e-5)


def test_conflicting_state_shapes_are_refused():
    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.store = nn.Module()
            self.store.register_buffer("acc", torch.zeros(3))

        def forward(self, x):
            self.store.acc.add_(x)
            return self.store.acc + 0.0

    store = Store()
    eps = {"write": torch.export.export(Write(store), (torch.zeros(4, 6),)),
           "other": torch.export.export(Other(), (torch.zeros(3),))}
    with pytest.raises(VkDelegateError, match="state 'store.acc' is"):
        to_backend(eps, VulkanPartitioner({"executor": "reference"}))


def test_force_fp16_shares_one_float16_buffer():
    """Under force_fp16 the device buffer is float16; state_dict gives float32."""
    if _vulkan_available():
        pytest.skip(_vulkan_available())
    store = Store()
    modules = {"write": Write(store), "bump": Bump(store)}
    eps = {"write": torch.export.export(modules["write"], (torch.zeros(4, 6),)),
           "bump": torch.export.export(modules["bump"], (torch.zeros(1, 6),))}
    store.acc.zero_()
    program = to_backend(eps, VulkanPartitioner({"force_fp16": True}))
    for name, x in _calls(7, 4):
        assert_same(program.run(name, x), modules[name](x), 2e-2)
    buffer = program.store.device_buffer("store.acc")
    assert buffer is not None and buffer.dtype == "float16"
    value = program.state_dict()["store.acc"]
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, store.acc, rtol=2e-2, atol=2e-2)


class Read(nn.Module):
    """Only reads acc (another method writes it): returns acc * 2 + y."""

    def __init__(self, store):
        super().__init__()
        self.store = store

    def forward(self, y):
        return self.store.acc * 2.0 + y


def test_a_method_that_only_reads_sees_the_writes(executor, tmp_path):
    """A buffer that one method mutates is state in a method that only reads it, not a
    constant frozen at export (to_backend.mutated_buffers)."""
    store = Store()
    modules = {"write": Write(store), "read": Read(store)}
    examples = {"write": torch.zeros(4, 6), "read": torch.zeros(4, 6)}
    eps = {name: torch.export.export(m, (examples[name],)) for name, m in modules.items()}
    store.acc.zero_()
    program = to_backend(eps, VulkanPartitioner({"executor": executor}))
    gen = torch.Generator().manual_seed(3)
    for name in ("read", "write", "read", "write", "write", "read"):
        x = torch.randn(4, 6, generator=gen)
        assert_same(program.run(name, x), modules[name](x), 1e-5)
    program.save(tmp_path / "rw.vkdp")
    loaded = load(tmp_path / "rw.vkdp", executor=executor)
    x = torch.randn(4, 6, generator=gen)
    assert_same(loaded.run("read", x), modules["read"](x), 1e-5)
    loaded.close()
