"""vkdelegate.choose_qparams_per_token: torchao's per-token asymmetric int8 activation
qparams (8da4w) in one dispatch. A module calling torchao's own
``choose_qparams_affine`` exports as the decomposed chain; lowered, the chain becomes
the op (backend/passes/quantized_linear.fuse_choose_qparams) and its scale and zero
point equal torchao's eager ones bit for bit: the same float operations (a division by
a uniform 255, round half to even), whatever the row holds; for an fp16 x each in fp16
as eager rounds it (the difference and both quotients rounded to fp16)."""
import math

import numpy as np

import pytest
import torch

from tests.ops.harness import check_op, delegated_nodes
from tests.vulkan_skip import vulkan_unavailable

CHOOSE = "vkdelegate.choose_qparams_per_token.default"


@pytest.fixture(params=["default", "gpu", "gpu_tree"])
def form(request, monkeypatch):
    """This device's own workgroups (a CPU driver's: WG invocations, a shared-memory
    tree), or the GPUs' forced: 256 invocations a row with subgroup reductions, or
    with the tree (a GPU without subgroup arithmetic)."""
    from vkdelegate.ops.families import choose_qparams as family

    if request.param != "default":
        monkeypatch.setattr(family, "workgroup", lambda info, k: 256)
    if request.param == "gpu_tree":
        monkeypatch.setattr(family, "has_subgroup_arithmetic", lambda info: False)
    return request.param


class _Qparams(torch.nn.Module):
    """torchao 0.18's 8da4w activation qparams (intx_unpacked_to_int8_tensor's
    _apply_int8_act_asym_per_token_quant_dequant), returned."""

    def forward(self, x):
        from torchao.quantization.quant_primitives import (_DTYPE_TO_QVALUE_BOUNDS,
                                                           MappingType,
                                                           choose_qparams_affine)
        from torchao.quantization.utils import _get_per_token_block_size

        qmin, qmax = _DTYPE_TO_QVALUE_BOUNDS[torch.int8]
        return choose_qparams_affine(x, MappingType.ASYMMETRIC,
                                     _get_per_token_block_size(x), target_dtype=torch.int8,
                                     quant_min=qmin, quant_max=qmax,
                                     zero_point_dtype=torch.int8)


def _rows(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-30, 30, shape[-1])[
        torch.randperm(shape[-1], generator=g)]
    flat = x.reshape(-1, shape[-1])
    # Rows that reach every branch: all positive (lo = 0), all negative (hi = 0),
    # zeros (scale clamped to FLT_MIN), denormals, ties of lo / scale at .5, an inf, a
    # NaN, -0.0, a -inf, both infs.
    special = [torch.rand(shape[-1], generator=g) + 1, -torch.rand(shape[-1], generator=g),
               torch.zeros(shape[-1]), torch.full((shape[-1],), 1e-40),
               torch.full((shape[-1],), -2.5) * torch.arange(shape[-1]) / shape[-1],
               torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g),
               torch.full((shape[-1],), -0.0), torch.randn(shape[-1], generator=g),
               torch.randn(shape[-1], generator=g)]
    special[5][0] = math.inf
    special[6][-1] = math.nan
    special[8][-1] = -math.inf  # scale inf, -inf / inf = NaN: zero point 0 (a trial's find)
    special[9][0], special[9][-1] = math.inf, -math.inf
    for i, row in enumerate(special[:flat.shape[0]]):
        flat[i] = row
    return x


def _rows16(shape, seed):
    """fp16 rows over fp16's range (6e-8 .. 65504): subnormals, a difference hi - lo
    that overflows to inf (scale inf, zero point -128), a scale clamped to fp16's eps,
    quotients lo / scale that round to fp16 at .5 ties, an inf, a NaN, a -inf."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * torch.logspace(-7, 4.5, shape[-1])[
        torch.randperm(shape[-1], generator=g)]).half()
    flat = x.reshape(-1, shape[-1])
    k = shape[-1]
    special = [torch.rand(k, generator=g) + 1, -torch.rand(k, generator=g) * 3e4,
               torch.zeros(k), torch.full((k,), 3e-7),
               torch.full((k,), -2.5) * torch.arange(k) / k,
               torch.randn(k, generator=g), torch.randn(k, generator=g),
               torch.linspace(-60000, 60000, k), torch.randn(k, generator=g) * 1e-4,
               torch.randn(k, generator=g)]
    special[5][0] = math.inf
    special[6][-1] = math.nan
    special[9][-1] = -math.inf
    for i, row in enumerate(special[:flat.shape[0]]):
        flat[i] = row.half()
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(10, 64), (1, 1, 7), (3, 5, 200), (9, 4097)])
def test_equals_torchao(form, shape, dtype):
    pytest.importorskip("torchao")
    x = (_rows if dtype == torch.float32 else _rows16)(shape, sum(shape))
    program = check_op(_Qparams().eval(), (x,), ops=[CHOOSE], atol=0, rtol=0)
    ops = [name for name, _ in delegated_nodes(program)]
    assert ops.count(CHOOSE) == 1, ops
    assert not {"aten.amin.default", "aten.amax.default", "aten.full_like.default",
                "aten.minimum.default", "vkdelegate.fused_elementwise.default"} & set(ops), ops


class _Decomposed(torch.nn.Module):
    """The op's definition (custom_ops._choose_qparams_per_token) as plain ATen calls:
    the chain torchao's function exports as, which also exports with a dynamic dim
    (torchao 0.18's own function does not)."""

    def forward(self, x):
        from vkdelegate.backend.custom_ops import _choose_qparams_per_token

        return _choose_qparams_per_token(x)


def test_rows_that_change_at_run_time():
    """Prefill's T is dynamic: the grid is sized for the most rows, the current count
    is a parameter (workgroups past it write nothing)."""
    t = torch.export.Dim("t", min=1, max=40)
    check_op(_Decomposed().eval(), (_rows((1, 17, 96), 1),), ops=[CHOOSE], atol=0, rtol=0,
             dynamic_shapes={"x": {1: t}},
             resize_inputs=[(_rows((1, 40, 96), 2),), (_rows((1, 1, 96), 3),)])


def test_the_custom_op_kernel_is_torchao():
    """The op's CPU kernel (its definition: what the reference executor and the
    tests compare with) is torchao's computation."""
    pytest.importorskip("torchao")
    from vkdelegate.backend.custom_ops import CHOOSE_QPARAMS_PER_TOKEN

    from vkdelegate.backend.custom_ops import QPARAMS_EPS
    from vkdelegate.ops.families.choose_qparams import EPS

    assert EPS == QPARAMS_EPS == {"float32": torch.finfo(torch.float32).tiny,
                                  "float16": torch.finfo(torch.float16).tiny}
    for x in (_rows((10, 33), 3), _rows16((10, 33), 3)):
        scale, zp = CHOOSE_QPARAMS_PER_TOKEN.overload()(x)
        want_scale, want_zp = _Qparams()(x)
        assert scale.dtype == want_scale.dtype == x.dtype
        assert torch.equal(scale.nan_to_num(7.0), want_scale.reshape(-1).nan_to_num(7.0))
        assert torch.equal(zp, want_zp.reshape(-1))


@pytest.mark.parametrize("rows", [1, 6])
def test_8da4w_linears_share_one_per_input(rows):
    """Two 8da4w linears reading one x (q and k): one qparams node for both, and one
    merged product (passes/merge_linears: their qparams are a function of x alone);
    the outputs as eager's (tolerance: test_quantized_linear's for 8da4w)."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("torchao")
    from vkdelegate.backend.quantize import quantize_for_vulkan

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = torch.nn.Linear(64, 32), torch.nn.Linear(64, 64)
            self.o = torch.nn.Linear(96, 16)

        def forward(self, x):
            return self.o(torch.cat([self.q(x), self.k(x)], -1).relu())

    torch.manual_seed(0)
    model = quantize_for_vulkan(Two().eval(), "8da4w", group_size=32)
    x = torch.randn(rows, 64)
    program = check_op(model, (x,), ops=["et_vk.linear_dq8ca_q4gsw.default"],
                       rtol=2e-5, atol=2e-4)
    ops = [name for name, _ in delegated_nodes(program)]
    assert ops.count(CHOOSE) == 2, sorted(ops)  # x, and o's input
    assert ops.count("et_vk.linear_dq8ca_q4gsw.default") == 2, sorted(ops)  # q/k, o
    assert ops.count("vkdelegate.narrow_last.default") == 2, sorted(ops)
    assert "aten.amin.default" not in ops, ops


def _blob(x=(6, 40), x_dtype="float32", outs=None):
    """A blob of one choose_qparams_per_token node on x of these sizes with outputs
    declared ``outs`` ((shape, dtype) pairs; default: what the op gives)."""
    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    m = GraphMaker()
    xid = m.input(x, x_dtype)
    outs = outs or [(x[:-1], "float32"), (x[:-1], "int8")]
    ids = [m.tensor(shape, dtype) for shape, dtype in outs]
    out = m._add(g.ValueList(ids))
    m.graph.chain.append(g.OperatorCall(0, CHOOSE, [xid, out]))
    for i in ids:
        m.output(i)
    return m


def test_matching_blob_runs(vk_device):
    from vkdelegate.backend.custom_ops import CHOOSE_QPARAMS_PER_TOKEN
    from vkdelegate.runtime import load_delegate

    x = _rows((6, 40), 9)
    with load_delegate(_blob().blob()) as graph:
        scale, zp = graph.execute([x.numpy()])
    want_scale, want_zp = CHOOSE_QPARAMS_PER_TOKEN.overload()(x)
    assert np.array_equal(scale, want_scale.numpy(), equal_nan=True)
    assert np.array_equal(zp, want_zp.numpy())


@pytest.mark.parametrize("kwargs,match", [
    (dict(outs=[((2,), "float32"), ((6,), "int8")]), r"output"),
    (dict(outs=[((6,), "float32"), ((60,), "int8")]), r"output"),
    (dict(outs=[((6,), "float32"), ((6,), "int32")]), r"dtype"),
    (dict(x_dtype="float16"), r"outputs other than \(float16 scale"),
    (dict(x_dtype="int32", outs=[((6,), "int32"), ((6,), "int8")]), r"dtype int32"),
])
def test_crafted_blob_is_refused_at_load(vk_device, kwargs, match):
    """A blob whose node the kernel could not run as the op defines it (a scale or
    zero point smaller than the rows would be written past) is refused before anything
    is built, by the Vulkan loader and the reference executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    blob = _blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=r"node 0 \(vkdelegate.choose_qparams_per"
                                                  r"_token.default\): .*" + match):
            load(blob)


# ---- the RMS norm folded in (vkdelegate.rms_norm_choose_qparams) ----------------------
NORM_QPARAMS = "vkdelegate.rms_norm_choose_qparams.default"


class _NormedLinears(torch.nn.Module):
    """An HF-style RMS norm read by two linears (q and k of a layer), and ``float_too``:
    also by a third that stays float (its norm then keeps its own node)."""

    def __init__(self, k=96, float_too=False):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.norm = LlamaRMSNorm(k, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(k) + 0.5)
        self.q, self.k = torch.nn.Linear(k, 32), torch.nn.Linear(k, 64)
        self.extra = torch.nn.Linear(k, 8) if float_too else None

    def forward(self, x):
        h = self.norm(x)
        out = torch.cat([self.q(h), self.k(h)], -1)
        return out if self.extra is None else (out, self.extra(h))


def _normed(dtype, float_too=False):
    from vkdelegate.backend.quantize import quantize_for_vulkan

    torch.manual_seed(0)
    model = _NormedLinears(float_too=float_too).to(dtype).eval()
    quantize_for_vulkan(model.q, "8da4w", group_size=32)
    quantize_for_vulkan(model.k, "8da4w", group_size=32)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rows", [1, 5])
def test_norm_read_by_8da4w_products_folds_in(dtype, rows):
    """A norm only 8da4w products read: the norm and their activation's qparams in one
    dispatch, the products (merged) as eager's within test_quantized_linear's 8da4w
    tolerance (the fp16 one for fp16)."""
    pytest.importorskip("torchao")
    pytest.importorskip("transformers")
    from tests.ops.test_quantized_linear import _one_quantum

    model = _normed(dtype)
    torch.manual_seed(1)
    x = torch.randn(1, rows, 96).to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    quantum = _one_quantum(torch.nn.Sequential(model.k), x.float() * 2)
    program = check_op(model, (x,), ops=[NORM_QPARAMS], rtol=tol, atol=tol + quantum)
    ops = [name for name, _ in delegated_nodes(program)]
    assert ops.count(NORM_QPARAMS) == 1, ops
    assert not {CHOOSE, "et_vk.rms_norm.default"} & set(ops), ops


def test_norm_a_float_linear_reads_is_not_folded():
    pytest.importorskip("torchao")
    pytest.importorskip("transformers")
    model = _normed(torch.float32, float_too=True)
    program = check_op(model, (torch.randn(1, 1, 96),), ops=[CHOOSE], rtol=1e-3, atol=1e-2)
    ops = [name for name, _ in delegated_nodes(program)]
    assert NORM_QPARAMS not in ops and ops.count(CHOOSE) == 1, ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_norm_qparams_are_those_of_the_y_written(form, dtype):
    """The op's y is the norm's within its rounding (another summation order), and its
    scale and zero point are choose_qparams_per_token of that y bit for bit: rows of
    4097 values (past a workgroup's sweep), large and tiny rows, a NaN row; rows
    changing at run time."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    from vkdelegate import VulkanPartitioner, to_backend
    from vkdelegate.backend.custom_ops import (CHOOSE_QPARAMS_PER_TOKEN,
                                               RMS_NORM_CHOOSE_QPARAMS, _rms_norm)

    def fn(x, w):
        return RMS_NORM_CHOOSE_QPARAMS.overload()(x, w, 1e-5)

    class Fn(torch.nn.Module):
        def forward(self, x, w):
            return fn(x, w)

    t = torch.export.Dim("t", min=1, max=12)
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(1, 7, 4097, generator=g) * torch.logspace(-3, 3, 7).reshape(1, 7, 1))
    x[0, 3, 5] = math.nan
    x = x.to(dtype)
    w = (torch.rand(4097, generator=g) + 0.5).to(dtype)
    program = to_backend(torch.export.export(Fn(), (x, w), dynamic_shapes=({1: t}, None)),
                         VulkanPartitioner())
    try:
        for xi in (x, x[:, :2], torch.cat([x, x[:, :4]], 1)):
            y, scale, zp = program(xi, w)
            torch.testing.assert_close(y, _rms_norm(xi, w, 1e-5), equal_nan=True,
                                       rtol=1e-5 if dtype == torch.float32 else 2e-3,
                                       atol=0)
            want_scale, want_zp = CHOOSE_QPARAMS_PER_TOKEN.overload()(y)
            assert torch.equal(scale.nan_to_num(7.0), want_scale.nan_to_num(7.0))
            assert torch.equal(zp, want_zp)
    finally:
        program.close()


def _norm_blob(x=(3, 40), w=(40,), x_dtype="float32", w_dtype="float32", outs=None):
    """A blob of one rms_norm_choose_qparams node (x, norm weight, eps 1e-5)."""
    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    m = GraphMaker()
    xid, wid = m.input(x, x_dtype), m.input(w, w_dtype)
    outs = outs or [(x, x_dtype), (x[:-1], x_dtype), (x[:-1], "int8")]
    ids = [m.tensor(shape, dtype) for shape, dtype in outs]
    out = m._add(g.ValueList(ids))
    m.graph.chain.append(g.OperatorCall(0, NORM_QPARAMS, [xid, wid, m.scalar(1e-5), out]))
    for i in ids:
        m.output(i)
    return m


def test_norm_matching_blob_runs(vk_device):
    from vkdelegate.backend.custom_ops import CHOOSE_QPARAMS_PER_TOKEN, _rms_norm
    from vkdelegate.runtime import load_delegate

    x, w = _rows((3, 40), 5), torch.rand(40) + 0.5
    x[2] = 0.0  # an all-zero row: y 0, scale eps
    with load_delegate(_norm_blob().blob()) as graph:
        y, scale, zp = graph.execute([x.numpy(), w.numpy()])
    torch.testing.assert_close(torch.from_numpy(y), _rms_norm(x, w, 1e-5), rtol=1e-5,
                               atol=0, equal_nan=True)
    want_scale, want_zp = CHOOSE_QPARAMS_PER_TOKEN.overload()(torch.from_numpy(y))
    assert np.array_equal(scale, want_scale.numpy(), equal_nan=True)
    assert np.array_equal(zp, want_zp.numpy())


@pytest.mark.parametrize("kwargs,match", [
    (dict(w=(41,)), r"norm weight \[41\]"),
    (dict(w_dtype="float16"), r"dtype float16|norm weight \[40\] float16"),
    (dict(outs=[((3, 40), "float32"), ((3,), "float32"), ((3,), "int32")]), r"dtype"),
    (dict(outs=[((3, 40), "float32"), ((2,), "float32"), ((3,), "int8")]), r"output"),
    (dict(outs=[((3, 39), "float32"), ((3,), "float32"), ((3,), "int8")]), r"output"),
])
def test_norm_crafted_blob_is_refused_at_load(vk_device, kwargs, match):
    """A norm weight other than [K] of x's dtype, or outputs other than the op's, are
    refused before anything is built (the kernel indexes the weight by k and writes
    y, scale and zero point by row), by the Vulkan loader and the reference executor."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.runtime import load_delegate

    blob = _norm_blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=r"node 0 \(vkdelegate.rms_norm_choose_"
                                                  r"qparams.default\): .*" + match):
            load(blob)


def test_workgroup_sizes():
    """WG on CPU drivers; on GPUs about one group of 8 values an invocation, from WG up
    to GPU_WG and the device's limits."""
    from types import SimpleNamespace

    from vkdelegate.ops.families.choose_qparams import GPU_WG, WG, workgroup

    def gpu(limit=1024):
        return SimpleNamespace(type="discrete", max_workgroup_size=(limit, limit, 64),
                               max_workgroup_invocations=limit)

    assert workgroup(SimpleNamespace(type="cpu"), 8192) == WG
    sizes = [workgroup(gpu(), k) for k in (7, 128, 129, 2048, 8192)]
    assert sizes == [WG, WG, WG, 256, GPU_WG]
    assert workgroup(gpu(), 16384) == GPU_WG
    assert workgroup(gpu(256), 8192) == 256


def test_layout():
    """Each invocation holds GPI groups of 8 values (QX's 4 a block of 32, rounded up to
    a power of two), at most MAX_GPI: more invocations past that, up to the device's
    limit, then a DeviceLimitError naming the row length."""
    from types import SimpleNamespace

    from vkdelegate.errors import DeviceLimitError
    from vkdelegate.ops.families.choose_qparams import MAX_GPI, WG, layout

    def builder(kind, limit=1024):
        info = SimpleNamespace(type=kind, max_workgroup_size=(limit, limit, 64),
                               max_workgroup_invocations=limit)
        return SimpleNamespace(device=SimpleNamespace(info=info),
                               error=lambda message, limit=False: DeviceLimitError(message))

    assert layout(builder("cpu"), 40) == (WG, 1)  # 8 groups (2 blocks)
    assert layout(builder("cpu"), 4097) == (WG, 16)  # 516 groups: 9 -> 16
    assert layout(builder("cpu"), 8 * WG * MAX_GPI) == (WG, MAX_GPI)
    assert layout(builder("cpu"), 8 * WG * MAX_GPI + 1) == (2 * WG, 32)
    assert layout(builder("discrete"), 2048) == (256, 1)
    assert layout(builder("discrete"), 14336) == (1024, 2)
    with pytest.raises(DeviceLimitError, match="rows of 262145 values"):
        layout(builder("discrete"), 8 * 1024 * MAX_GPI + 1)
