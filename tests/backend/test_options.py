"""Compile options: validation names the offending key."""
import pytest

from vkdelegate.backend.options import CompileOptions, parse_options
from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization.vkgraph import VkMemoryLayout, VkStorageType


def test_defaults():
    opts = parse_options(None)
    assert opts == CompileOptions()
    assert opts.storage_type == VkStorageType.DEFAULT_STORAGE
    assert opts.memory_layout == VkMemoryLayout.DEFAULT_LAYOUT


def test_valid_values_round_trip():
    opts = parse_options({"force_fp16": True, "storage_type_override": "BUFFER",
                          "memory_layout_override": "TENSOR_CHANNELS_PACKED",
                          "device": 1, "executor": "reference"})
    assert opts.storage_type == VkStorageType.BUFFER
    assert opts.memory_layout == VkMemoryLayout.TENSOR_CHANNELS_PACKED
    assert parse_options(opts.to_dict()) == opts


def test_unknown_key_is_named():
    with pytest.raises(VkDelegateError, match="unknown compile option 'force_fp61'"):
        parse_options({"force_fp61": True})


@pytest.mark.parametrize("key,value,text", [
    ("force_fp16", 1, "'force_fp16' must be bool, got int 1"),
    ("device", True, "'device' must be int or None, got bool True"),
    ("device", -1, "'device' must be >= 0"),
    ("storage_type_override", "TEXTURE_4D", "'storage_type_override' must be one of"),
    ("executor", None, "'executor' must be str, got NoneType"),
])
def test_bad_value_names_key(key, value, text):
    with pytest.raises(VkDelegateError, match=text):
        parse_options({key: value})


def test_not_a_dict():
    with pytest.raises(VkDelegateError, match="must be a dict"):
        parse_options(["force_fp16"])
