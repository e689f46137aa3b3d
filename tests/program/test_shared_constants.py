"""The methods of one program hold each weight once on the device
(runtime/constant_pool.py): a named constant read by the delegates of several methods
is one pooled buffer, its packed copies are pooled per layout, and a constant that
every op reads packed takes no device memory as stored. Values against eager; a
crafted program naming one key for two different byte strings is refused."""
import functools

import numpy as np
import pytest
import torch

from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VkDelegateError, VulkanPartitioner, load, to_backend
from vkdelegate.backend.program import Delegate, LoweredProgram, Method

pytestmark = pytest.mark.skipif(bool(vulkan_unavailable()),
                                reason=vulkan_unavailable() or "")

N, K = 96, 256


class Mlp(torch.nn.Module):
    """Two linears the methods share; ``forward`` adds a GELU between them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(K, N)
        self.b = torch.nn.Linear(N, K)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


class Plain(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp.b(self.mlp.a(x))


def _program():
    mlp = Mlp().eval()
    rows = torch.randn(5, K)
    one = torch.randn(1, K)
    program = to_backend({"gelu": torch.export.export(mlp, (rows,)),
                          "plain": torch.export.export(Plain(mlp), (one,))},
                         VulkanPartitioner())
    return mlp, program, rows, one


def _weight_bytes(mlp) -> int:
    return sum(p.numel() * 4 for p in mlp.parameters())


def test_methods_share_each_weight_once_on_the_device():
    mlp, program, rows, one = _program()
    with torch.no_grad():
        torch.testing.assert_close(program.gelu(rows), mlp(rows), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(program.plain(one), mlp.b(mlp.a(one)), rtol=1e-4,
                                   atol=1e-4)
    memory = program.device_memory()
    weights = _weight_bytes(mlp)
    # Every layout of every weight once: as stored (the GEMM core reads [N, K] in
    # place) or packed, one copy per layout, never one per method. Two methods with
    # their own copies would hold at least 2x; packed copies are padded up to 4 rows.
    assert weights * 0.99 <= memory["constants"] < 1.6 * weights, memory
    assert set(memory) == {"constants", "state", "gelu/0", "plain/0"}
    assert memory["state"] == 0  # no mutable buffers
    program.close()
    assert program.device_memory() == {"constants": 0, "state": 0}
    with torch.no_grad():  # rebuilt after close, from a fresh pool
        torch.testing.assert_close(program.plain(one), mlp.b(mlp.a(one)), rtol=1e-4,
                                   atol=1e-4)
    program.close()


def test_loaded_program_shares_the_pool(tmp_path):
    mlp, program, rows, one = _program()
    path = tmp_path / "mlp.vkd"
    program.save(path)
    program.close()
    loaded = load(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded.gelu(rows), mlp(rows), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(loaded.plain(one), mlp.b(mlp.a(one)), rtol=1e-4,
                                   atol=1e-4)
    assert loaded.device_memory()["constants"] < 1.6 * _weight_bytes(mlp)
    loaded.close()


class MatTimesConstant(torch.nn.Module):
    """``aten.mm`` with a constant mat2: read only transposed (matmul.py packs it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.register_buffer("w", torch.randn(K, N))

    def forward(self, x):
        return torch.mm(x, self.w)


def test_a_constant_read_only_packed_holds_no_stored_copy():
    model = MatTimesConstant().eval()
    x = torch.randn(3, K)
    program = to_backend(torch.export.export(model, (x,)), VulkanPartitioner())
    assert program.num_delegates() == 1
    torch.testing.assert_close(program(x), model(x), rtol=1e-4, atol=1e-4)
    # The transposed copy only, not the stored [K, N] beside it.
    assert program.device_memory()["constants"] == K * N * 4
    program.close()


def _one_linear_method(seed: int):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N).eval()
    x = torch.randn(2, K)
    return lin, x, to_backend(torch.export.export(lin, (x,)), VulkanPartitioner())


def test_one_key_for_two_byte_strings_is_refused():
    """A crafted program whose delegates name one key for different bytes (the file
    format maps keys to segments per delegate) must not read one method's weights
    for another's."""
    lin_a, x, prog_a = _one_linear_method(0)
    lin_b, _, prog_b = _one_linear_method(1)
    ma, mb = prog_a.methods["forward"], prog_b.methods["forward"]
    da, db = ma.delegates[0], mb.delegates[0]
    # b's blob names b's weight by a's keys: same keys, other bytes.
    key_of = {len(v): k for k, v in da.named_data.items()}
    renamed = {key_of[len(v)]: v for v in db.named_data.values()}
    blob_b = db.blob
    for kb, vb in db.named_data.items():
        blob_b = blob_b.replace(kb.encode(), key_of[len(vb)].encode())
    crafted = LoweredProgram({
        "a": Method(ma.plan, ma.constants, ma.state, [Delegate(da.blob, da.named_data)]),
        "b": Method(mb.plan, mb.constants, mb.state, [Delegate(blob_b, renamed)])})
    with torch.no_grad():
        torch.testing.assert_close(crafted.a(x), lin_a(x), rtol=1e-4, atol=1e-4)
        with pytest.raises(VkDelegateError, match="other bytes") as info:
            crafted.b(x)
    assert any(repr(k) in str(info.value) for k in da.named_data), info.value
    crafted.close()
    prog_a.close()
    prog_b.close()


def test_a_file_naming_one_key_for_two_segments_is_refused_at_load(tmp_path):
    """The same crafted program as a file: refused by ``load``, before any method runs
    (the file format maps keys to segments per delegate)."""
    from vkdelegate.serialization import program_file

    mlp, program, rows, one = _program()
    path = tmp_path / "p.vkd"
    program.save(path)
    program.close()
    manifest, segments = program_file.read_program(path)
    segments = [bytes(s) for s in segments]
    b = manifest["methods"]["plain"]["delegates"][0]["named_data"]
    key = max(b, key=lambda k: len(segments[b[k]]))  # the larger weight
    changed = bytearray(segments[b[key]])
    changed[100] ^= 0x40
    segments.append(bytes(changed))
    b[key] = len(segments) - 1
    program_file.write_program(path, manifest, segments)
    with pytest.raises(VkDelegateError, match="as segment .* another delegate as segment"):
        load(path)


def _add_one(array: np.ndarray, value: int) -> np.ndarray:
    return array + value


def test_pack_key_names_the_layout_or_refuses():
    from vkdelegate.runtime.values import pack_key

    assert pack_key(functools.partial(_add_one, value=1)) != \
        pack_key(functools.partial(_add_one, value=2))
    assert pack_key(np.ascontiguousarray)[0].endswith("ascontiguousarray")
    with pytest.raises(TypeError, match="module-level function"):
        pack_key(lambda a: a)
    with pytest.raises(TypeError, match="not an int"):
        pack_key(functools.partial(_add_one, value=np.zeros(2)))
