"""runtime/host_copy.py: the raw-byte copies of execute's inputs and outputs, by
memmove and through a registered parallel copier (the torch side's, as a program
with torch inputs registers it), checked against numpy and eager PyTorch."""
import numpy as np
import pytest
import torch

from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.backend.interpreter import _torch_copy
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import host_copy


@pytest.fixture
def copier():
    """Restores the process's parallel copier after the test."""
    saved = host_copy._parallel
    yield host_copy
    host_copy.set_parallel_copy(saved)


@pytest.mark.parametrize("parallel", [None, _torch_copy], ids=["memmove", "torch"])
@pytest.mark.parametrize("n", [5, 3 << 18], ids=["small", "3MiB"])
def test_copy_bytes_matches_source(copier, parallel, n):
    copier.set_parallel_copy(parallel)
    src = rand(np.random.default_rng(0), (n,))
    dst = np.full(n + 7, -1.0, np.float32)
    copier.copy_bytes(dst, src)
    assert dst[:n].tobytes() == src.tobytes()
    assert (dst[n:] == -1.0).all()  # nothing written past the source's bytes


def test_parallel_copier_only_for_large_writable_sources(copier):
    seen = []
    copier.set_parallel_copy(lambda d, s: (seen.append(s.nbytes), np.copyto(d, s)))
    big = np.arange(1 << 18, dtype=np.float32)  # exactly PARALLEL_MIN_BYTES
    copier.copy_bytes(np.empty_like(big), big)
    copier.copy_bytes(np.empty(10, np.float32), big[:10])
    frozen = big.copy()
    frozen.flags.writeable = False  # torch.from_numpy would warn: memmove instead
    out = np.empty_like(frozen)
    copier.copy_bytes(out, frozen)
    assert seen == [big.nbytes] and (out == big).all()


def test_copy_bytes_errors():
    with pytest.raises(VkDelegateError, match="do not fit"):
        host_copy.copy_bytes(np.empty(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(VkDelegateError, match="contiguous"):
        host_copy.copy_bytes(np.empty(8, np.float32), np.zeros((4, 4), np.float32)[:, 0])


@pytest.mark.parametrize("parallel", [None, _torch_copy], ids=["memmove", "torch"])
def test_execute_large_input_and_output_through_copier(vk_device, copier, parallel):
    # 2 x 3 x 224 x 224 fp32 in (1.2 MB) and out: both copies take the copier.
    copier.set_parallel_copy(parallel)
    shape = (2, 3, 224, 224)
    m = GraphMaker()
    ix = m.input(shape)
    m.output(m.op("aten.neg.default", [ix], shape))
    x = rand(np.random.default_rng(1), shape)
    with m.build(vk_device) as graph:
        for _ in range(2):
            got = graph.execute([x])[0]
            np.testing.assert_array_equal(got, torch.neg(torch.from_numpy(x)).numpy())
        assert graph.last_timing["upload_s"] > 0 and graph.last_timing["download_s"] > 0
