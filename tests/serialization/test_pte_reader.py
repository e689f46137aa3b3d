"""Our reader of ExecuTorch programs, on the committed .pte seeds (no ExecuTorch needed)."""
import random
import struct
from pathlib import Path

import pytest

import vkdelegate
from vkdelegate import VkDelegateError
from vkdelegate.limits import DEFAULT_LIMITS
from vkdelegate.serialization.pte_reader import read_pte

PTE_DIR = Path(__file__).resolve().parents[1] / "data" / "pte"


def test_reads_the_structure():
    program = read_pte((PTE_DIR / "cpu_kernel.pte").read_bytes())
    (plan,) = program.plans
    assert plan.name == "forward"
    assert [d.backend for d in plan.delegates] == ["VulkanBackend", "VulkanBackend"]
    assert plan.operators == ["aten::cumsum.out"]
    assert [i.kind for i in plan.instructions] == ["DelegateCall", "KernelCall",
                                                   "DelegateCall"]
    assert plan.values[plan.inputs[0]].value.sizes == [3, 5]
    assert all(d.data[4:8] == b"VH00" for d in plan.delegates)  # ET-VK blob headers


def test_dynamic_inputs_keep_their_bounds():
    (plan,) = read_pte((PTE_DIR / "dynamic_batch.pte").read_bytes()).plans
    x = plan.values[plan.inputs[0]].value
    assert x.dynamic and x.sizes == [16, 8]


def test_bad_extended_header(tmp_path):
    data = bytearray((PTE_DIR / "mlp.pte").read_bytes())
    assert data[8:12] == b"eh00"
    struct.pack_into("<Q", data, 16, len(data) + 1)  # program size past the file
    with pytest.raises(VkDelegateError, match=r"extended header says the program is "
                                              rf"{len(data) + 1} bytes"):
        read_pte(bytes(data), "m.pte")


def test_segment_count_is_limited():
    with pytest.raises(VkDelegateError, match="segment count"):
        read_pte((PTE_DIR / "mlp.pte").read_bytes(),
                 limits=DEFAULT_LIMITS.replace(max_segments=0))


@pytest.mark.parametrize("name", ["mlp.pte", "multi_output.pte"])
def test_mutations_give_vkdelegate_errors_only(tmp_path, name):
    data = (PTE_DIR / name).read_bytes()
    rng = random.Random(name)
    path = tmp_path / "m.pte"
    loaded = 0
    for _ in range(150):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(8, len(mutated))] = rng.randrange(256)
        path.write_bytes(bytes(mutated))
        try:
            vkdelegate.load(path)
            loaded += 1
        except VkDelegateError:
            pass
    assert loaded < 150  # some mutations must have been refused
