"""The program file side of the load budget (vkdelegate.limits.LoadLimits): crafted
manifests and segment tables that once escaped as OverflowError, RecursionError,
TypeError or a bare ValueError are refused at load with a VkDelegateError naming the
problem, and limits over the budget raise ResourceLimitError before anything is made."""
import json

import pytest
import torch

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from vkdelegate.errors import ResourceLimitError
from vkdelegate.limits import LoadLimits

from . import crafted
from tests.vulkan_skip import requires_vulkan


def _load(tmp_path, text, data=None, limits=None):
    path = crafted.write_raw(tmp_path / "crafted.vkp", text, data)
    return vkdelegate.load(path, limits=limits)


def _refused(tmp_path, text, match, data=None, error=VkDelegateError, limits=None):
    with pytest.raises(error, match=match):
        _load(tmp_path, text, data, limits)


def test_the_crafting_helper_writes_a_program_that_runs(tmp_path):
    program = _load(tmp_path, crafted.manifest())
    x = crafted.example()
    torch.manual_seed(0)
    eager = crafted.Glue()
    torch.testing.assert_close(program(x), eager(x))


@pytest.mark.parametrize("text", ['[' * 100_000 + ']' * 100_000,
                                  '{"a":' * 100_000 + '1' + '}' * 100_000])
def test_deep_json_is_refused_before_parsing(tmp_path, text):
    _refused(tmp_path, text, r"manifest JSON nesting depth is 100,000, over the "
                             r"load limit max_json_depth=64", error=ResourceLimitError)


def test_json_depth_limit_counts_brackets_outside_strings(tmp_path):
    m = crafted.manifest()
    # Deepest: the manifest, methods, forward, plan, in_spec, its children list,
    # the args tuple spec, its children list and the leaf spec.
    depth = 9
    m["note"] = "[{" * 1000 + '\\"'  # brackets inside a string are not nesting
    _load(tmp_path, m, limits=LoadLimits(max_json_depth=depth))
    m["note"] = [[[[[[[[[1]]]]]]]]]  # 9 lists inside the manifest object
    _refused(tmp_path, m, "manifest JSON nesting depth is 10,", error=ResourceLimitError,
             limits=LoadLimits(max_json_depth=depth))
    _load(tmp_path, m, limits=LoadLimits(max_json_depth=depth + 1))


def test_huge_integer_literal_is_refused(tmp_path):
    text = '{"format": "vkdelegate-program", "version": 1, "x": ' + "9" * 5000 + "}"
    with pytest.raises(VkDelegateError, match="manifest is not valid JSON: Exceeds"):
        _load(tmp_path, text)


@pytest.mark.parametrize("field", ["offset", "size"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1.5, True, "64", None])
def test_segment_offset_and_size_must_be_ints(tmp_path, field, value):
    m = crafted.manifest()
    m["segments"][1][field] = value
    _refused(tmp_path, m, rf"segment 1 entry is malformed: {field} must be an int")


@pytest.mark.parametrize("segments", [5, "abc", {"a": 1}, None])
def test_segments_must_be_a_list(tmp_path, segments):
    m = crafted.manifest()
    m["segments"] = segments
    _refused(tmp_path, m, "manifest segments must be a list, got")


def test_segment_count_is_limited(tmp_path):
    m = crafted.manifest()
    _refused(tmp_path, m, r"segment count is 4, over the load limit max_segments=3",
             error=ResourceLimitError, limits=LoadLimits(max_segments=3))


@pytest.mark.parametrize("offset, size", [(-64, 16), (0, -1), (10**6, 16), (64, 10**6)])
def test_segment_outside_the_data_section(tmp_path, offset, size):
    m = crafted.manifest()
    m["segments"][0].update(offset=offset, size=size)
    _refused(tmp_path, m, "segment 0 .* lies outside the data section")


def test_overlapping_segments_are_refused(tmp_path):
    m = crafted.manifest()
    first = m["segments"][1]
    # Same bytes as segment 1 but 8 bytes shorter: a prefix of it.
    m["segments"].append(dict(first, size=first["size"] - 8))
    start, end = first["offset"], first["offset"] + first["size"]
    _refused(tmp_path, m, rf"segments 1 \(bytes {start}\.\.{end}\) and 4 \(bytes "
                          rf"{start}\.\.{end - 8}\) overlap")


def test_identical_duplicate_segments_are_allowed(tmp_path):
    m = crafted.manifest()
    m["segments"].append(dict(m["segments"][1]))
    _load(tmp_path, m)(crafted.example())


def _first_ref(m, kind):
    refs = m["methods"]["forward"][kind]
    return refs[next(iter(refs))]


@pytest.mark.parametrize("kind", ["constants", "state"])
@pytest.mark.parametrize("shape", [[2**64, 0], [2**63, 0], [float("inf")], [True, 4],
                                   [-1], "4", [[4]]])
def test_bad_tensor_ref_shapes_are_refused(tmp_path, kind, shape):
    m = crafted.manifest()
    _first_ref(m, kind)["shape"] = shape
    _refused(tmp_path, m, r"method 'forward', (constant|state) '\w+': shape .* not allowed")


@pytest.mark.parametrize("kind", ["constants", "state"])
def test_one_tensor_over_max_tensor_bytes(tmp_path, kind):
    m = crafted.manifest()
    _first_ref(m, kind)["shape"] = [2**40, 2**20]  # 4 EiB of float32
    name = "constant 'p_w'" if kind == "constants" else "state 'b_count'"
    _refused(tmp_path, m, rf"method 'forward', {name}: bytes of float32\[1099511627776, "
                          rf"1048576\] is 4,611,686,018,427,387,904, over the load limit "
                          rf"max_tensor_bytes=8,589,934,592", error=ResourceLimitError)


def test_glue_host_bytes_are_summed_over_the_program(tmp_path):
    m = crafted.manifest()
    # p_w and b_count are 16 bytes each; a second method holds both again.
    m["methods"]["again"] = json.loads(json.dumps(m["methods"]["forward"]))
    _load(tmp_path, m, limits=LoadLimits(max_host_bytes=64))
    _refused(tmp_path, m, r"host bytes of the CPU glue's constants and state is 64, "
                          r"over the load limit max_host_bytes=63",
             error=ResourceLimitError, limits=LoadLimits(max_host_bytes=63))
    _refused(tmp_path, m, r"bytes of float32\[4\] is 16, over the load limit "
                          r"max_tensor_bytes=15",
             error=ResourceLimitError, limits=LoadLimits(max_tensor_bytes=15))


def test_glue_node_count_is_limited(tmp_path):
    m = crafted.manifest()
    n = len(m["methods"]["forward"]["plan"]["nodes"])
    _load(tmp_path, m, limits=LoadLimits(max_nodes=n))
    _refused(tmp_path, m, rf"method 'forward': CPU glue node count is {n}, over the load "
                          rf"limit max_nodes={n - 1}",
             error=ResourceLimitError, limits=LoadLimits(max_nodes=n - 1))


@pytest.mark.parametrize("value", ["1", None, -1, 1.5, True])
def test_a_limit_that_is_not_a_count_is_refused(value):
    with pytest.raises(VkDelegateError, match=r"LoadLimits.max_device_bytes must be an "
                                              r"int >= 0, got"):
        LoadLimits(max_device_bytes=value)


class Repeat(torch.nn.Module):
    def forward(self, x):
        return x.repeat(600, 1).sum(0)


@requires_vulkan
def test_over_the_load_limits_there_is_no_cpu_fallback(tmp_path):
    """A delegate whose tensors are over the load limits is refused: the reference
    executor (the device-limit fallback) is not a way around them."""
    x = torch.randn(2, 512)
    path = tmp_path / "repeat.vkdp"
    to_backend(torch.export.export(Repeat(), (x,)), VulkanPartitioner()).save(path)
    tight = LoadLimits(max_tensor_bytes=1 << 20)
    for executor in ("vulkan", "reference"):
        with pytest.raises(ResourceLimitError, match=r"value \d+: tensor float32 "
                                                     r"\[1200, 512\] in bytes is 2,457,600"):
            vkdelegate.load(path, executor=executor, limits=tight)(x)
    # A sum of 1,200 values: the device adds them in another order (1e-4 of |sum|).
    torch.testing.assert_close(vkdelegate.load(path)(x), Repeat()(x), rtol=1e-4, atol=1e-3)


def test_a_limit_message_survives_a_huge_crafted_size():
    """A crafted file's product of sizes can have thousands of digits (Python refuses to
    print an int past 4300 of them): still the one ResourceLimitError, one line (fuzz
    finding program-928da33f3d: a glue tensor of such a size)."""
    from vkdelegate.errors import ResourceLimitError
    from vkdelegate.limits import check_limit

    with pytest.raises(ResourceLimitError) as info:
        check_limit("the tensor it makes, in bytes,", 7 ** 6000, 1 << 30, "max_host_bytes",
                    "method 'forward'")
    message = str(info.value)
    assert "is about 2^16844," in message and len(message.splitlines()) == 1, message
    with pytest.raises(ResourceLimitError, match="is 2,000,000,000, over"):
        check_limit("bytes", 2_000_000_000, 1 << 30, "max_host_bytes")
