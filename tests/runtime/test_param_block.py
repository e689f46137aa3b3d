"""ParamBlock: std140 offsets and packing, refusals naming the block and member, and
the binding declarations dispatches are checked against."""
import numpy as np
import pytest

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.runtime.params import META_BYTES, meta_record
from vkdelegate.shaders.bindings import Bindings, binding_defines, bindings_of


def test_offsets_follow_std140():
    block = ParamBlock("b", [("n", "int"), ("x", "float"), ("row", "ivec4"),
                             ("rows", "vec4[3]"), ("last", "int")])
    # Scalars pack at 4-byte steps, a vec4 starts on 16, arrays have a 16-byte stride.
    assert block.offsets == {"n": 0, "x": 4, "row": 16, "rows": 32, "last": 80}
    assert block.size == 96
    assert block.glsl() == ("  int n;\n  float x;\n  ivec4 row;\n  vec4 rows[3];\n"
                            "  int last;")


def test_pack_places_every_member():
    block = ParamBlock("pool_block", [("k", "ivec4"), ("scale", "vec4"), ("n", "int"),
                                      ("plan", "ivec4[2]")])
    raw = block.pack(k=[3, 3, 2], scale=[0.5], n=-7, plan=range(1, 7))
    ints, floats = np.frombuffer(raw, np.int32), np.frombuffer(raw, np.float32)
    assert len(raw) == block.size == 80  # plan starts on 48
    assert ints[0:4].tolist() == [3, 3, 2, 0]
    assert floats[4:8].tolist() == [0.5, 0.0, 0.0, 0.0]
    assert ints[8] == -7
    assert ints[12:20].tolist() == [1, 2, 3, 4, 5, 6, 0, 0]


def test_tensor_meta_block_matches_meta_record():
    block = tensor_meta_block("out_meta")
    assert block.size == META_BYTES
    rec = meta_record((2, 3, 4))
    packed = block.pack(out_meta=dict(sizes=rec[0:8], strides=rec[8:16], info=rec[16:20]))
    assert packed == rec.tobytes()


@pytest.mark.parametrize("values, message", [
    (dict(k=[1 << 31]), r"pool_block\.k\[0\] is 2147483648, outside the int32 range"),
    (dict(k=[1.5]), r"pool_block\.k\[0\] is 1.5, not an integer"),
    (dict(k=[1, 2, 3, 4, 5]), r"pool_block: member k \(ivec4\) given 5 values"),
    (dict(), r"pool_block: members \['k'\] not given"),
    (dict(k=[1], kk=[2]), r"pool_block: unknown members \['kk'\]"),
])
def test_pack_refusals_name_the_member(values, message):
    with pytest.raises(VkDelegateError, match=message):
        ParamBlock("pool_block", [("k", "ivec4")]).pack(**values)


@pytest.mark.parametrize("type_, message", [
    ("int[4]", r"b: member type 'int\[4\]' \(only arrays of ivec4/vec4"),
    ("mat4", r"b: unknown member type 'mat4'"),
])
def test_types_without_a_common_std140_std430_layout_are_refused(type_, message):
    with pytest.raises(VkDelegateError, match=message):
        ParamBlock("b", [("m", type_)])


def test_binding_defines_number_outputs_inputs_then_params():
    from vkdelegate.ops.registry import load_all
    load_all()
    pool = bindings_of("pool2d", {"MAX_POOL": "1", "IDX_T": "int"})
    assert pool.names() == ["out_data", "idx_data", "in_data", "out_meta", "in_meta",
                            "pool_block"]
    defines = binding_defines("pool2d", {"AVG_POOL": "1"})
    assert {k: v for k, v in defines.items() if k.startswith("BINDING_")} == {
        "BINDING_out_data": "0", "BINDING_in_data": "1", "BINDING_out_meta": "2",
        "BINDING_in_meta": "3", "BINDING_pool_block": "4"}
    with pytest.raises(VkDelegateError, match="shader nope has no declared bindings"):
        bindings_of("nope", {})
    with pytest.raises(VkDelegateError, match=r"binding names repeat: \['x', 'x'\]"):
        Bindings(outputs=("x",), inputs=("x",)).defines()


def test_dispatch_refuses_buffers_other_than_the_declared_bindings():
    from types import SimpleNamespace

    from vkdelegate.ops.registry import load_all
    from vkdelegate.runtime.builder import NodeBuilder
    load_all()
    b = NodeBuilder(SimpleNamespace(device=None))
    buf = SimpleNamespace(buffer=SimpleNamespace(size=80), what="params of node 3")
    with pytest.raises(VkDelegateError, match=r"dispatch of pool2d binds 1 outputs, 1 "
                                              r"inputs, 2 parameter blocks; the variant "
                                              r"declares \['out_data', 'in_data', "
                                              r"'out_meta', 'in_meta', 'pool_block'\]"):
        b._check_bindings("pool2d", {"AVG_POOL": "1"}, [buf], [buf], [buf, buf])
    small = SimpleNamespace(buffer=SimpleNamespace(size=32), what="params of node 3")
    with pytest.raises(VkDelegateError, match=r"params of node 3 has 32 bytes, block "
                                              r"pool_block needs 48"):
        b._check_bindings("pool2d", {"AVG_POOL": "1"}, [buf], [buf], [buf, buf, small])
    b._check_bindings("pool2d", {"AVG_POOL": "1"}, [buf], [buf], [buf, buf, buf])


@pytest.mark.parametrize("shape", [(0, 100000, 258710), (5, 0, 1 << 20, 1 << 20),
                                   (3, 1 << 31), (1 << 16, 1 << 16)])
def test_meta_record_refuses_sizes_and_strides_past_int32(shape):
    # An empty tensor (a size 0) still has strides: 100000 * 258710 is past int32
    # (fuzz/findings/blob-tensor-meta-int32-overflow-c.bin), and so is the stride of the
    # dims after a zero size, 2^20 * 2^20 (-d.bin).
    from vkdelegate.errors import DeviceLimitError

    with pytest.raises(DeviceLimitError, match="int32 indexing"):
        meta_record(shape)
    rec = meta_record((0, 7, 5))  # an empty tensor within range: its strides kept
    assert rec[8:11].tolist() == [1, 5, 35] and rec[16] == 0


def _reference_pack(block: ParamBlock, values: dict) -> bytes:
    """pack as it was written first (numpy, member by member): the fast path must give
    the same bytes."""
    out = bytearray(block.size)
    for member, type_ in block.fields:
        base, _, count = type_.rstrip("]").partition("[")
        width = 1 if base in ("int", "float") else 4
        room = width * (int(count) if count else 1)
        flat = np.ravel(np.asarray(values[member], dtype=object)).tolist()
        row = np.zeros(room, dtype=np.int32 if base in ("int", "ivec4") else np.float32)
        row[:len(flat)] = [int(v) for v in flat] if row.dtype == np.int32 else flat
        out[block.offsets[member]:block.offsets[member] + row.nbytes] = row.tobytes()
    return bytes(out)


@pytest.mark.parametrize("seed", range(40))
def test_pack_equals_the_numpy_packing(seed):
    rng = np.random.default_rng(seed)
    types = ["int", "float", "ivec4", "vec4", "ivec4[2]", "vec4[3]"]
    fields = [(f"m{i}", types[rng.integers(len(types))]) for i in range(rng.integers(1, 7))]
    block = ParamBlock("b", fields)
    floats = [0.5, -0.0, 1e39, -1e39, float("inf"), float("nan"), np.float64(3.25),
              np.float32(-2.5), 7, np.int64(3), 1e-46, 16777217.0]
    ints = [0, -1, 2 ** 31 - 1, -2 ** 31, np.int64(5), np.int32(-9), True, 3.0,
            np.float64(-4.0)]
    values = {}
    for name, type_ in fields:
        base, _, count = type_.rstrip("]").partition("[")
        room = (1 if base in ("int", "float") else 4) * (int(count) if count else 1)
        pool = ints if base in ("int", "ivec4") else floats
        n = 1 if room == 1 else int(rng.integers(0, room + 1))
        picked = [pool[rng.integers(len(pool))] for _ in range(n)]
        if room == 1:
            values[name] = picked[0]
        elif count and rng.random() < 0.5 and n % 4 == 0:
            values[name] = np.array(picked, dtype=object).reshape(-1, 4).tolist()
        else:
            values[name] = tuple(picked) if rng.random() < 0.5 else picked
    got, want = block.pack(**values), _reference_pack(block, values)
    assert got == want, (fields, values)
