"""Constants shared by the methods of one lowering are converted and stored once
(serialization.fx_values.ConstantCache, program_file.SegmentTable): the same weight
in every method of a program is one bytes object in every delegate's named_data, the
cache never hands out stale bytes (in-place updates, views), and the program still
computes what eager does; loading the saved program copies each segment once."""
import hashlib

import pytest
import torch

from vkdelegate.serialization.fx_values import ConstantCache, tensor_bytes
from vkdelegate.serialization.program_file import SegmentTable


def test_cache_returns_the_bytes_and_key_of_the_tensor_now():
    cache = ConstantCache()
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    key, data = cache.bytes_of(w, "w")
    assert data == tensor_bytes(w, "w") and key == hashlib.sha256(data).hexdigest()
    assert cache.bytes_of(w, "w")[1] is data  # converted once
    with torch.no_grad():
        w[0, 0] = 100.0  # in place: the version counter moves, new bytes
    key2, data2 = cache.bytes_of(w, "w")
    assert data2 == tensor_bytes(w, "w") and key2 != key
    # views of one storage at other offsets / strides are other constants
    assert cache.bytes_of(w[1], "row")[1] == tensor_bytes(w[1], "row")
    assert cache.bytes_of(w.t(), "t")[1] == tensor_bytes(w.t(), "t")
    # equal contents of different tensors: one bytes object
    a, b = torch.ones(5), torch.ones(5)
    assert cache.bytes_of(a, "a")[1] is cache.bytes_of(b, "b")[1]
    with torch.inference_mode():  # no version counter: converted each time, still right
        c = torch.full((4,), 2.0)
    assert cache.bytes_of(c, "c")[1] == tensor_bytes(c, "c")


def test_segment_table_stores_repeats_once():
    table = SegmentTable()
    data = bytes(range(50))
    assert table.add(data) == table.add(data) == table.add(bytes(range(50))) == 0
    assert table.add(b"other") == 1
    assert table.segments == [data, b"other"]


def test_methods_share_one_copy_of_a_weight(tmp_path):
    from tests.vulkan_skip import vulkan_unavailable
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    from vkdelegate.backend.partitioner import VulkanPartitioner
    from vkdelegate.backend.program import load
    from vkdelegate.backend.to_backend import to_backend

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)

    class Relu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return torch.relu(self.lin(x))

    class Tanh(Relu):
        def forward(self, x):
            return torch.tanh(self.lin(x))

    x = torch.randn(5, 64)
    program = to_backend({"relu": torch.export.export(Relu(), (x,)),
                          "tanh": torch.export.export(Tanh(), (x,))}, VulkanPartitioner())
    weight = tensor_bytes(lin.weight, "weight")
    held = [v for m in program.methods.values() for d in m.delegates
            for v in d.named_data.values() if v == weight]
    assert len(held) == 2 and held[0] is held[1]
    torch.testing.assert_close(program.run("relu", x), torch.relu(lin(x)),
                               rtol=1e-4, atol=1e-4)
    path = tmp_path / "p.vkp"
    program.save(path)
    loaded = load(path)
    held = [v for m in loaded.methods.values() for d in m.delegates
            for v in d.named_data.values() if v == weight]
    assert len(held) == 2 and held[0] is held[1]  # one copy on loading too
    torch.testing.assert_close(loaded.run("tanh", x), torch.tanh(lin(x)),
                               rtol=1e-4, atol=1e-4)
    program.close()
    loaded.close()
