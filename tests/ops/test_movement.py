"""View-like ops (view, squeeze, unsqueeze, permute, expand, repeat, slice, select,
flip) against eager: ranks 1 to 6, prime and size-0/1 dims, every dtype, resizes."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.export import Dim

from tests.ops.harness import check_op
from tests.ops.movement_data import rand

MOVE_DTYPES = ["float32", "float16", "int32", "int64", "int8", "uint8", "bool"]
VIEW = "aten.view.default"
PERMUTE = "aten.permute.default"


@pytest.mark.parametrize("shape, sizes", [
    ((3, 5, 7), (35, 3)),
    ((3, 5, 7), (-1,)),
    ((2, 3, 1, 5, 1, 7), (5, -1, 7)),
    ((11,), (1, 11, 1, 1, 1, 1)),
    ((3, 0, 5), (0, 5, 7)),
])
def test_view(shape, sizes):
    check_op(lambda x: x.view(sizes), (rand(*shape),), ops=[VIEW])


def test_reshape_of_a_permuted_tensor_and_flatten():
    check_op(lambda x: x.transpose(0, 2).reshape(7, -1).flatten(), (rand(3, 5, 7),),
             ops=[VIEW, PERMUTE])


@pytest.mark.parametrize("shape, perm", [
    ((3, 5), (1, 0)),
    ((3, 5, 7), (2, 0, 1)),
    ((2, 3, 5, 7), (0, 3, 1, 2)),
    ((2, 3, 1, 5, 7), (4, 2, 0, 3, 1)),
    ((2, 3, 1, 5, 1, 7), (5, 4, 3, 2, 1, 0)),
    ((3, 0, 5), (-1, 0, 1)),
])
def test_permute(shape, perm):
    check_op(lambda x: x.permute(perm), (rand(*shape),), ops=[PERMUTE])


def test_zero_dim_tensors():
    """A 0-d input through view, unsqueeze, expand, repeat and flip, and back to 0-d."""
    check_op(lambda x: (x.view(1, 1), x.unsqueeze(0), x.expand(3, 2), x.repeat(2, 1),
                        x.flip(0), x.view(1).view(())),
             (torch.tensor(3.5),),
             ops=[VIEW, "aten.unsqueeze.default", "aten.expand.default",
                  "aten.repeat.default", "aten.flip.default"])


def test_transpose_and_t():
    check_op(lambda x, y: (x.transpose(-1, 1), y.t()), (rand(2, 3, 5, 7), rand(3, 11)),
             ops=[PERMUTE])


@pytest.mark.parametrize("fn, op", [
    (lambda x: x.squeeze(2), "aten.squeeze.dims"),
    (lambda x: x.squeeze(), "aten.squeeze.dims"),
    (lambda x: x.squeeze((0, -1)), "aten.squeeze.dims"),
    (lambda x: x.unsqueeze(-1), "aten.unsqueeze.default"),
    (lambda x: x.unsqueeze(0), "aten.unsqueeze.default"),
])
def test_squeeze_unsqueeze_ops(fn, op):
    check_op(fn, (rand(1, 3, 1, 5, 1),), ops=[op])


@pytest.mark.parametrize("shape, sizes", [
    ((3, 1), (4, 3, 7)),          # new leading dim and the last axis
    ((1, 5), (3, 5)),             # first axis
    ((1, 1, 1), (2, 3, 5)),       # every axis
    ((3, 1, 5, 1), (3, 7, 5, 2)),
    ((1, 2, 1, 3, 1, 5), (2, 2, 3, 3, 7, 5)),
    ((1, 5), (0, 5)),
    ((7,), (1, 1, 1, 1, 1, 7)),
])
def test_expand(shape, sizes):
    check_op(lambda x: x.expand(sizes), (rand(*shape),), ops=["aten.expand.default"])


@pytest.mark.parametrize("shape, repeats", [
    ((3, 7), (2, 3)),
    ((3, 7), (2, 1, 3)),
    ((5,), (3, 1, 1, 2, 1, 2)),
    ((2, 1, 3), (1, 5, 1)),
    ((3, 7), (0, 2)),
])
def test_repeat(shape, repeats):
    check_op(lambda x: x.repeat(repeats), (rand(*shape),), ops=["aten.repeat.default"])


@pytest.mark.parametrize("fn", [
    lambda x: x[:, 1:100:2],        # step, end beyond the size (clamped)
    lambda x: x[:, -5:-1],          # negative bounds
    lambda x: x[-100:2],            # start before the beginning (clamped)
    lambda x: x[:, 5:3],            # empty: end before start
    lambda x: x[..., ::3],          # last dim, step 3
    lambda x: x[:, 2:, 1:6:4],      # two slices in a row
    lambda x: x.narrow(1, 2, 3),
    lambda x: x.narrow(-1, 0, 1),
], ids=["step", "negative", "clamped_start", "empty", "last_dim", "twice", "narrow",
        "narrow_last"])
def test_slice(fn):
    check_op(fn, (rand(3, 7, 11),), ops=["aten.slice.Tensor"])


def test_slice_rank6():
    check_op(lambda x: x[:, :, 1:, :, ::2, 3:], (rand(2, 3, 3, 1, 5, 7),),
             ops=["aten.slice.Tensor"])


@pytest.mark.parametrize("fn", [
    lambda x: x[:, 2], lambda x: x[-1], lambda x: x[..., -3], lambda x: x[1, :, 0],
], ids=["middle", "first_negative", "last_negative", "two"])
def test_select(fn):
    check_op(fn, (rand(3, 7, 5),), ops=["aten.select.int"])


def test_unbind():
    # unbind exports as one slice + squeeze per output
    check_op(lambda x: x.unbind(1), (rand(3, 4, 5),),
             ops=["aten.slice.Tensor", "aten.squeeze.dims"])


@pytest.mark.parametrize("shape, dims", [
    ((7,), (0,)), ((3, 7), (0, 1)), ((3, 5, 7), (1,)), ((3, 5, 7), (-1, 0)),
    ((2, 3, 1, 5, 3, 7), (0, 2, 4, 5)), ((3, 0, 2), (1,)),
])
def test_flip(shape, dims):
    check_op(lambda x: x.flip(dims), (rand(*shape),), ops=["aten.flip.default"])


@pytest.mark.parametrize("fn, shape", [
    (lambda x: torch.nn.functional.pixel_shuffle(x, 2), (2, 12, 3, 5)),
    (lambda x: torch.nn.functional.pixel_shuffle(x, 3), (1, 9, 1, 7)),
    (lambda x: torch.nn.functional.pixel_unshuffle(x, 2), (2, 3, 6, 10)),
], ids=["shuffle2", "shuffle3", "unshuffle2"])
def test_pixel_shuffle(fn, shape):
    # pixel_shuffle exports as view + permute (+ clone, removed at lowering) + view
    check_op(fn, (rand(*shape),), ops=[VIEW, PERMUTE])


def test_non_contiguous_inputs():
    """Inputs that are views in eager (transposed, sliced, expanded) give the same
    values as their contiguous copies."""
    x = rand(7, 5, 3).transpose(0, 2)
    y = rand(11, 6)[:, ::2]
    z = rand(5, 1).expand(5, 4)
    check_op(lambda x, y, z: (x.permute(1, 0, 2), y.flip(0), z.view(-1)), (x, y, z),
             ops=[PERMUTE, "aten.flip.default", VIEW])


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_every_dtype(dtype):
    """Every movement op on every dtype in one chain (values must be bit-exact: a copy
    never changes a value)."""
    def fn(x):
        y = x.view(3, 5, 7).permute(2, 0, 1)          # view, permute
        y = y.unsqueeze(0).expand(2, 7, 3, 5)           # unsqueeze, expand
        y = y[:, 1:6:2].flip(-1)                         # slice, flip
        z = x.view(1, 105).squeeze(0)[4]                 # squeeze, select
        return y.repeat(1, 1, 2, 1), z                   # repeat
    ops = [VIEW, PERMUTE, "aten.unsqueeze.default", "aten.expand.default",
           "aten.slice.Tensor", "aten.flip.default", "aten.squeeze.dims",
           "aten.select.int", "aten.repeat.default"]
    check_op(fn, (rand(105, dtype=dtype),), ops=ops, rtol=0, atol=0)


def test_resize():
    """Every movement op with a dynamic batch dim, run again at a smaller batch."""
    def fn(x):
        y = x.permute(0, 2, 1).unsqueeze(1).expand(-1, 2, -1, -1)
        y = y[:, :, 1:, ::2].flip(0).repeat(1, 1, 2, 1)
        return y, x[:, 2].view(-1, 5), x[:, :, 3].unsqueeze(2).squeeze(2)
    batch = Dim("batch", min=1, max=11)
    ops = [VIEW, PERMUTE, "aten.unsqueeze.default", "aten.expand.default",
           "aten.slice.Tensor", "aten.flip.default", "aten.repeat.default",
           "aten.select.int", "aten.squeeze.dims"]
    check_op(fn, (rand(11, 3, 5),), ops=ops, dynamic_shapes=({0: batch},),
             resize_inputs=[(rand(4, 3, 5, seed=1),), (rand(1, 3, 5, seed=2),)])


def test_resize_slices_of_the_dynamic_dim():
    """Slice bounds, flip and a negative select index are re-planned from the new size
    of the dynamic dim."""
    batch = Dim("batch", min=4, max=11)
    check_op(lambda x: (x[1::2], x[-3:].flip(0), x[2:], x[-2]), (rand(11, 3),),
             ops=["aten.slice.Tensor", "aten.flip.default", "aten.select.int"],
             dynamic_shapes=({0: batch},),
             resize_inputs=[(rand(4, 3, seed=1),), (rand(7, 3, seed=2),)])


def test_flatten_of_a_dynamic_batch():
    """flatten(1) exports as view(x, [sym_size(x, 0), 15]); the symbolic_view_sizes
    pass makes that -1, so the view runs on Vulkan and follows resizes."""
    batch = Dim("batch", min=1, max=9)
    check_op(lambda x: x.flatten(1), (rand(9, 3, 5),), ops=[VIEW],
             dynamic_shapes=({0: batch},), resize_inputs=[(rand(4, 3, 5, seed=1),)])


def test_view_with_a_product_of_symbolic_sizes():
    dims = {0: Dim("a", min=1, max=9), 1: Dim("b", min=1, max=9)}
    check_op(lambda x: x.reshape(x.shape[0] * x.shape[1], 5), (rand(7, 3, 5),), ops=[VIEW],
             dynamic_shapes=(dims,), resize_inputs=[(rand(2, 5, 5, seed=1),)])


#: ExecuTorch's names for the copying view ops (found in ET-VK blobs), run as a chain
#: (op name, arguments after the input tensor) in a hand-built VkGraph.
ET_CHAIN = [
    ("aten.view_copy.default", [[5, 21]]),
    ("aten.permute_copy.default", [[1, 0]]),
    ("aten.unsqueeze_copy.default", [1]),
    ("aten.expand_copy.default", [[21, 3, 5], False]),
    ("aten.slice_copy.Tensor", [2, 1, None, 2]),
    ("aten.select_copy.int", [1, -1]),
    ("aten.unsqueeze_copy.default", [0]),
    ("aten.squeeze_copy.dims", [[0]]),
    ("aten.split_with_sizes_copy.default", [[4, 17], 0]),
]


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_executorch_copy_op_names(vk_device, dtype):
    """ET-VK blobs name the view ops view_copy, permute_copy, ...: the same ops run
    under those names, compared exactly with ATen's own *_copy ops."""
    from tests.ops import coverage
    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    x = rand(105, dtype=dtype)
    gm = GraphMaker()
    vid = gm.input(x.shape, dtype)
    ref = x
    for name, args in ET_CHAIN:
        _, packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        schema = op._schema.arguments[1:]   # args are in schema order, kwargs included
        ref = op(ref, *[a for a, s in zip(args, schema) if not s.kwarg_only],
                 **{s.name: a for a, s in zip(args, schema) if s.kwarg_only})
        arg_ids = [vid] + [gm.scalar(a) for a in args]
        if isinstance(ref, (list, tuple)):
            outs = [gm.tensor(r.shape, dtype) for r in ref]
            out = gm._add(g.ValueList(outs))
            gm.graph.chain.append(g.OperatorCall(len(gm.graph.chain), name, arg_ids + [out]))
            for o in outs:
                gm.output(o)
        else:
            vid = gm.op(name, arg_ids, ref.shape, dtype)
    graph = gm.build(vk_device)
    try:
        got = graph.execute([x.numpy()])
    finally:
        graph.close()
    for out, expected in zip(got, ref):
        assert out.dtype == expected.numpy().dtype and out.shape == tuple(expected.shape)
        assert (out == expected.numpy()).all()
    for name, _ in ET_CHAIN:
        coverage.record(name, (dtype, dtype))


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_executorch_t_copy(vk_device, dtype):
    from tests.ops.et_graphs import run_et_node
    for shape in ((3, 7), (5,), ()):
        x = rand(*shape, dtype=dtype)
        run_et_node(vk_device, "aten.t_copy.default", [x], x.t().contiguous())


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 20), start=st.one_of(st.none(), st.integers(-30, 30)),
       end=st.one_of(st.none(), st.integers(-30, 30)), step=st.integers(1, 5))
def test_slice_bounds_match_python_slicing(size, start, end, step):
    """ATen clamps slice bounds like Python slicing (for positive steps): the plan's
    first index and length must match range(size)[start:end:step]."""
    from vkdelegate.ops.families.movement import slice_bounds
    picked = range(size)[start:end:step]
    first, length = slice_bounds(size, start, end, step)
    assert length == len(picked)
    if length:
        assert first == picked[0]


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=4), data=st.data())
def test_expand_and_repeat_sizes_match_torch(shape, data):
    """expand (with -1 and new leading dims) and repeat sizes equal torch's; what torch
    refuses raises VkDelegateError."""
    from vkdelegate.ops.families.movement import expand_shape, repeat_shape
    from vkdelegate.errors import VkDelegateError
    x = torch.empty(shape, device="meta")
    lead = data.draw(st.integers(0, 2))
    sizes = [data.draw(st.integers(0, 3)) for _ in range(lead)] + \
        [data.draw(st.sampled_from([-1, s, 1, 3])) for s in shape]
    repeats = [data.draw(st.integers(0, 3)) for _ in range(lead + len(shape))]
    for fn, ours, arg in ((x.expand, expand_shape, sizes), (x.repeat, repeat_shape, repeats)):
        try:
            expected = tuple(fn(arg).shape)
        except RuntimeError:
            with pytest.raises(VkDelegateError):
                ours(tuple(shape), arg)
            continue
        assert ours(tuple(shape), arg) == expected


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64", "int8", "uint8",
                                   "bool"])
def test_unsafe_view_every_dtype(dtype):
    # aten._unsafe_view (a view of a fresh result, as matmul decompositions emit it).
    check_op(lambda x: torch.ops.aten._unsafe_view.default(x * 1 if dtype != "bool" else x,
                                                            [3, 4]),
             (rand(2, 6, dtype=dtype),), ops=["aten._unsafe_view.default"], rtol=0, atol=0)


def _copy_spec_constants(monkeypatch) -> dict:
    """node name -> the specialization constants (NDIM, MODULO_DIMS, PAD_DIMS, CHUNK)
    of each affine_copy dispatch recorded from now on."""
    from vkdelegate.runtime.builder import NodeBuilder

    seen: dict = {}
    original = NodeBuilder.dispatch

    def spy(self, shader, defines, *args, **kwargs):
        if shader == "affine_copy":
            seen.setdefault(self.node.name, set()).add(tuple(kwargs["spec_constants"]))
        return original(self, shader, defines, *args, **kwargs)
    monkeypatch.setattr(NodeBuilder, "dispatch", spy)
    return seen


def _on_cpu_driver() -> bool:
    from vkdelegate.runtime.device import default_device
    return default_device().info.type == "cpu"


def test_copy_modes_are_specialization_constants(monkeypatch):
    """affine_copy.glsl takes the plan's rank and which dims are MODULO (repeat) or
    PAD (constant_pad_nd) as specialization constants (NDIM, MODULO_DIMS, PAD_DIMS,
    bit d for plan dim d counted from the innermost): llvmpipe runs every branch, so
    a mode read from the plan cost each dim a modulo. Values against eager at the
    export sizes and after a resize (the modes stay)."""
    seen = _copy_spec_constants(monkeypatch)

    def fn(x):
        return (x.permute(0, 2, 1), x.repeat(1, 2, 3),
                torch.nn.functional.pad(x, (1, 2, 0, 0, 0, 0), value=-1.5))
    batch = Dim("batch", min=1, max=11)
    check_op(fn, (rand(11, 3, 5),), ops=[PERMUTE, "aten.repeat.default",
                                         "aten.constant_pad_nd.default"],
             dynamic_shapes=({0: batch},), resize_inputs=[(rand(4, 3, 5, seed=1),)])
    # permute: 3 affine dims; repeat: every dim MODULO; pad: the last dim PAD, the
    # unpadded outer two merged into one affine dim.
    modes = {name: {c[:3] for c in consts} for name, consts in seen.items()}
    assert modes["aten.permute.default"] == {(3, 0, 0)}, seen
    assert modes["aten.repeat.default"] == {(3, 0b111, 0)}, seen
    assert modes["aten.constant_pad_nd.default"] == {(2, 0, 0b1)}, seen


def test_copies_on_cpu_drivers_take_chunks_of_the_innermost_dim(monkeypatch):
    """On CPU drivers an affine_copy invocation copies CHUNK consecutive elements of
    the innermost dim (kernels/affine_copy.chunk_for: 8, or the power of two that
    covers a shorter dim; 1 for a MODULO innermost dim and on GPUs), walking the outer
    dims once. Values against eager (bit-exact: copies) for innermost dims that are
    not multiples of the chunk, strided (slice step 3, flip), padded on both sides,
    cat into the middle of a row, and a resize of the innermost dim itself."""
    seen = _copy_spec_constants(monkeypatch)

    def fn(x, y, z):
        return (x.permute(0, 2, 1), z[..., 1::3], x.flip(-1),
                torch.nn.functional.pad(x, (3, 2), value=2.5), torch.cat([x, y], -1),
                x.repeat(1, 1, 2))
    s = Dim("s", min=2, max=19)
    y, z = rand(3, 5, 4, seed=3), rand(3, 23, seed=4)  # z[..., 1::3]: 8 of 23
    check_op(fn, (rand(3, 5, 19), y, z), rtol=0, atol=0,
             ops=[PERMUTE, "aten.slice.Tensor", "aten.flip.default",
                  "aten.constant_pad_nd.default", "aten.cat.default",
                  "aten.repeat.default"],
             dynamic_shapes=({2: s}, None, None),
             resize_inputs=[(rand(3, 5, 6, seed=1), y, z), (rand(3, 5, 2, seed=2), y, z)])
    chunk = {name: {c[3] for c in consts} for name, consts in seen.items()}
    cpu = _on_cpu_driver()
    assert chunk["aten.permute.default"] == {8 if cpu else 1}, seen  # innermost: 5
    assert chunk["aten.slice.Tensor"] == {8 if cpu else 1}, seen
    assert chunk["aten.flip.default"] == {8 if cpu else 1}, seen
    assert chunk["aten.constant_pad_nd.default"] == {8 if cpu else 1}, seen
    assert chunk["aten.cat.default"] == ({8, 4} if cpu else {1}), seen  # 19, 4 wide
    assert chunk["aten.repeat.default"] == {1}, seen                 # MODULO innermost
