"""Fuzzing the program file reader: any damage is VkDelegateError or harmless."""
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.sort(torch.relu(x + self.w))[0] - self.w


@functools.lru_cache(maxsize=1)
def _file_bytes() -> bytes:
    import tempfile

    torch.manual_seed(0)
    ep = torch.export.export(Small(), (torch.randn(3, 4),))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    with tempfile.TemporaryDirectory() as d:
        program.save(f"{d}/p.vkp")
        with open(f"{d}/p.vkp", "rb") as f:
            return f.read()


def _load(tmp_path, data: bytes):
    """Every byte is checked (checksums, the header's fields, zero padding): any
    change is refused."""
    if data == _file_bytes():
        return  # flips that undid each other
    with pytest.raises(VkDelegateError):
        _load_strict(tmp_path, data)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)),
                      min_size=1, max_size=4))
def test_flipped_bytes(tmp_path, flips):
    data = bytearray(_file_bytes())
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    _load(tmp_path, bytes(data))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**9))
def test_truncated(tmp_path, cut):
    data = _file_bytes()
    cut %= len(data)
    with pytest.raises(VkDelegateError):
        _load_strict(tmp_path, data[:cut])


def _load_strict(tmp_path, data: bytes):
    path = tmp_path / "fuzz.vkp"
    path.write_bytes(data)
    vkdelegate.load(path)
