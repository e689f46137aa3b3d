"""The dtype table (vkdelegate/dtypes.py) against schema.fbs, numpy, torch and its readers."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from vkdelegate import dtypes
from vkdelegate.backend import creation_ops, host_budget, node_specs, pte_kernels
from vkdelegate.ops import registry
from vkdelegate.runtime import dtypes as rdt
from vkdelegate.serialization import fx_values, memory_planning
from vkdelegate.serialization import vkgraph as vk

SCHEMA = Path(vk.__file__).resolve().parents[1] / "schema" / "schema.fbs"


def _schema_enum(name: str) -> dict:
    body = re.search(rf"enum {name} : \w+ \{{(.*?)\}}", SCHEMA.read_text(), re.S).group(1)
    return {m[0]: int(m[1]) for m in re.findall(r"(\w+) = (\d+)", body)}


def test_wire_enum_is_the_schemas():
    fbs = _schema_enum("VkDataType")
    assert len(fbs) == 9 and fbs["UNSET"] == dtypes.WIRE_UNSET
    assert {d.name.upper(): d.wire for d in dtypes.TABLE.values()
            if d.wire is not None} == {k: v for k, v in fbs.items() if k != "UNSET"}
    assert {e.name: e.value for e in vk.VkDataType} == fbs
    assert {e.value: n for e, n in vk.DTYPE_NAMES.items()} == dtypes.WIRE_NAMES


def test_itemsizes_are_numpys_and_torchs():
    for name, row in dtypes.TABLE.items():
        assert row.itemsize == getattr(torch, name).itemsize, name
        if name != "bfloat16":  # numpy has no bfloat16
            assert row.itemsize == np.dtype(name).itemsize, name


def test_consumers_read_the_table():
    assert registry.ALL_DTYPES == dtypes.GRAPH_DTYPES
    assert registry.FLOAT_DTYPES == {"float32", "float16"}
    assert host_budget.FILE_DTYPES == dtypes.ITEMSIZE
    assert {n: creation_ops._ITEMSIZE[n] for n in dtypes.TABLE} == dtypes.ITEMSIZE
    assert {vk.VkDataType(w): b for w, b in memory_planning._ITEM_BYTES.items()} == {
        vk.VkDataType[n.upper()]: np.dtype(n).itemsize for n in dtypes.GRAPH_DTYPES}
    assert pte_kernels._DTYPES == dtypes.SCALAR_TYPE_NAMES
    for t, wire in fx_values.TORCH_TO_VK.items():
        assert str(t) == f"torch.{vk.DTYPE_NAMES[wire]}"
    assert set(fx_values.TORCH_TO_VK) == {getattr(torch, n) for n in dtypes.GRAPH_DTYPES}
    for t, name in node_specs.TORCH_TO_NAME.items():
        assert str(t) == f"torch.{name}"
        assert node_specs.dtype_name(t) == name


def test_scalar_type_codes_follow_c10_numbering():
    # c10::ScalarType order (c10/core/ScalarType.h), which ExecuTorch's ScalarType keeps.
    c10 = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
           "complex32", "complex64", "complex128", "bool", "qint8", "quint8", "qint32",
           "bfloat16"]
    for name, row in dtypes.TABLE.items():
        assert c10.index(name) == row.scalar_type, name


@pytest.mark.parametrize("profile", rdt.STORAGE_PROFILES)
def test_device_storage_follows_the_table(profile):
    narrow = {"float16": profile.storage_16bit, "int8": profile.storage_8bit,
              "uint8": profile.storage_8bit, "bool": profile.storage_8bit}
    for name in dtypes.GRAPH_DTYPES:
        dev = rdt.device_dtype(name, profile)
        if name in ("int64", "float64"):
            assert dev == name.replace("64", "32")
        elif name in narrow:
            assert dev == (name if narrow[name] else {"float16": "float32"}.get(name, "int32"))
        else:
            assert dev == name
        d = rdt.storage_defines(X=(name, dev))
        assert d["X_T"] == {"float32": "float", "float16": "float16_t", "int32": "int",
                            "int8": "int8_t", "uint8": "uint8_t", "bool": "uint8_t"}[dev]
        assert ("STORAGE_16BIT" in d) == (dev == "float16")
        assert ("STORAGE_8BIT" in d) == (dev in ("int8", "uint8", "bool"))
        assert rdt.acc_type(name) == ("float" if "float" in name else "int")
    for bad in ("int16", "bfloat16", "complex64"):
        with pytest.raises(Exception, match=f"dtype {bad} cannot be stored"):
            rdt.device_dtype(bad, profile)


def test_narrow_stores_round_or_wrap_in_the_fallback():
    assert rdt.storage_defines(X=("float16", "float32"))["X_STORE(v)"] == \
        "round_to_half(float(v))"
    assert rdt.storage_defines(X=("int8", "int32"))["X_STORE(v)"] == \
        "bitfieldExtract(int(v), 0, 8)"
    assert rdt.storage_defines(X="float16")["X_STORE(v)"] == "float16_t(v)"
