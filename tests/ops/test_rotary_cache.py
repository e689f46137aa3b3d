"""A decode layer's input RMS norm, merged q/k/v linear, rotary embedding and K/V cache
writes fuse into ``vkdelegate.rms_norm_linear_rotary_cache``
(passes/fuse_linear_rotary_cache.py; ops/families/cache_update.py), against eager
PyTorch and bit for bit against the unfused pair (compile option
fuse_linear_rotary_cache off: vkdelegate.rms_norm_linear, its parts and
vkdelegate.rotary_index_put_pair), fp32 and fp16, bias and none, int64 and int32
positions, negative positions (wrapped as ATen's index_put wraps them):

- the GPU forms forced on any device (as tests/ops/test_rms_norm_linear.py does: a CPU
  driver has no GEMV path): ONE gemv.glsl dispatch with the ROTARY epilogue (and the
  norm folded in; with rms_norm_prologue off the norm's dispatch first), K of the
  scalar (37), vec4 (52) and fp16 vec8 (64) loads, a head dim whose half is odd and
  a last workgroup half full, with and without subgroup arithmetic;
- this device's own forms (on lavapipe linear.glsl): the unfused pair's dispatches;
- a position ATen rejects sets the node's error flag and writes nothing (the caches
  as program state keep their bits);
- what the pass must leave alone, the CPU kernel, crafted blobs refused at load.

Tolerances against eager: as tests/ops/test_rms_norm_linear.py (the fused norm is not
rounded to x's dtype; the rotary's fp32 math rounds once): fp32 1e-4, fp16 1e-2.
"""
import dataclasses

import pytest
import torch
from torch import nn

from tests.ops.harness import check_op, delegated_nodes, spy_dispatches
from tests.ops.test_rms_norm_linear import LlamaRMSNorm
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.errors import VkDelegateError

FUSED = custom_ops.RMS_NORM_LINEAR_ROTARY_CACHE.name
UNFUSED = ("vkdelegate.rms_norm_linear.default", "vkdelegate.rotary_index_put_pair.default")
OFF = {"fuse_linear_rotary_cache": False}
F16 = dict(rtol=1e-2, atol=1e-2)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """The start of an HF Llama decoder layer in a decode step: the input norm, q/k/v
    projections of one token viewed to heads [1, H, 1, D], HF's rotary embedding and
    the K/V cache writes at ``pos`` (functional index_puts of the caches given as
    inputs; with ``state`` the module's cache buffers updated with index_copy_, as
    HF's static cache does). ``v_first``: v_proj runs before k_proj (the merged
    product's parts are then q | v | k); ``keep_v``: v is also an output; ``t``
    tokens (a prefill's rows)."""

    def __init__(self, k=64, hq=4, hkv=2, d=8, s=10, bias=False, dtype=torch.float32,
                 state=False, v_first=False, keep_v=False, t=1):
        super().__init__()
        self.hq, self.hkv, self.d, self.t = hq, hkv, d, t
        self.state, self.v_first, self.keep_v = state, v_first, keep_v
        self.norm = LlamaRMSNorm(k)
        self.q_proj = nn.Linear(k, hq * d, bias=bias)
        self.k_proj = nn.Linear(k, hkv * d, bias=bias)
        self.v_proj = nn.Linear(k, hkv * d, bias=bias)
        if state:
            self.register_buffer("kc", torch.zeros(1, hkv, s, d))
            self.register_buffer("vc", torch.zeros(1, hkv, s, d))
        self.to(dtype)

    def _heads(self, y, h):
        return y.view(1, self.t, h, self.d).transpose(1, 2)

    def forward(self, x, cos, sin, pos, kc=None, vc=None):
        h = self.norm(x)
        q = self._heads(self.q_proj(h), self.hq)
        if self.v_first:
            v = self._heads(self.v_proj(h), self.hkv)
            k = self._heads(self.k_proj(h), self.hkv)
        else:
            k = self._heads(self.k_proj(h), self.hkv)
            v = self._heads(self.v_proj(h), self.hkv)
        qr = q * cos + _rotate_half(q) * sin
        kr = k * cos + _rotate_half(k) * sin
        if self.state:
            self.kc.index_copy_(2, pos, kr)
            self.vc.index_copy_(2, pos, v)
            return qr
        put = torch.ops.aten.index_put
        out = (qr, put(kc, [None, None, pos], kr), put(vc, [None, None, pos], v))
        return out + ((v,) if self.keep_v else ())


def _inputs(module, dtype, pos=3, index_dtype=torch.int64, s=10, seed=0):
    """x, cos, sin, the positions (``pos`` and the next t - 1), the two caches."""
    g = torch.Generator().manual_seed(seed)
    k, t = module.norm.weight.shape[0], module.t
    ang = torch.rand(1, 1, t, module.d, generator=g) * 6
    caches = tuple(torch.randn(1, module.hkv, s, module.d, generator=g).to(dtype)
                   for _ in range(2))
    return (torch.randn(1, t, k, generator=g).to(dtype), ang.cos().to(dtype),
            ang.sin().to(dtype), torch.arange(pos, pos + t, dtype=index_dtype)) + caches


def _tol(dtype):
    return F16 if dtype == torch.float16 else {}


def _lower(module, inputs, options=None):
    return to_backend(torch.export.export(module, inputs), VulkanPartitioner(options))


def _ops(program) -> list:
    return [name for name, _ in delegated_nodes(program)]


def _bitwise_unfused(module, inputs, options=None):
    """The fused program's outputs equal the unfused pair's bit for bit."""
    fused = _lower(module, inputs, options)
    unfused = _lower(module, inputs, dict(options or {}, **OFF))
    assert FUSED in _ops(fused) and not set(UNFUSED) & set(_ops(fused)), _ops(fused)
    assert FUSED not in _ops(unfused) and set(UNFUSED) <= set(_ops(unfused))
    for got, want in zip(fused(*inputs), unfused(*inputs)):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.fixture
def dispatched(monkeypatch):
    """The shaders each node dispatched, in order (gemv.glsl's ROTARY form marked)."""
    return spy_dispatches(monkeypatch, lambda shader, defines: (shader, "ROTARY" in defines))


@pytest.fixture
def gpu_forms(monkeypatch, dispatched):
    """Every device type gets the tile table's GPU row (the GEMV path for one row)
    without its cooperative-matrix form, as on the H200."""
    from vkdelegate.kernels import gemm, gemm_tiles

    portable = dataclasses.replace(gemm_tiles.DEFAULT, coopmat=False)
    monkeypatch.setattr(gemm, "tiles_for", lambda _type: portable)
    return dispatched


def _gemv_dispatches(seen) -> list:
    return [d for d in seen if d[0] in ("gemv", "norm", "rotary_scatter_pair", "linear")]


# ---- the GEMV path: one dispatch ---------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("k", [37, 52, 64], ids=["scalar", "vec4", "vec8"])
def test_gemv_epilogue(gpu_forms, dtype, bias, k):
    torch.manual_seed(0)
    module = Attention(k=k, bias=bias, dtype=dtype)
    inputs = _inputs(module, dtype)
    check_op(module, inputs, ops=[FUSED], **_tol(dtype))
    assert _gemv_dispatches(gpu_forms) == [("gemv", True)]
    _bitwise_unfused(module, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("pos", [0, 9, -1, -10])
def test_positions(gpu_forms, dtype, index_dtype, pos):
    """Every position the cache accepts, negative ones wrapped, both index dtypes."""
    torch.manual_seed(1)
    module = Attention(dtype=dtype)
    inputs = _inputs(module, dtype, pos, index_dtype)
    check_op(module, inputs, ops=[FUSED], **_tol(dtype))
    _bitwise_unfused(module, inputs)


def test_odd_half_and_partial_workgroup(gpu_forms, monkeypatch):
    """D = 6 (D/2 = 3: a head's pairs cross units unevenly), 3 q heads and 1 kv head:
    N = 30 rows in 15 units, the last workgroup's second unit past the end; without
    subgroup arithmetic (the tree sum)."""
    from vkdelegate.kernels import gemm_core

    torch.manual_seed(2)
    for subgroups in (True, False):
        monkeypatch.setattr(gemm_core, "has_subgroup_arithmetic", lambda info: subgroups)
        module = Attention(k=40, hq=3, hkv=1, d=6, bias=True)
        inputs = _inputs(module, torch.float32, 5)
        check_op(module, inputs, ops=[FUSED])
        _bitwise_unfused(module, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_norm_prologue_off(gpu_forms, dtype):
    """rms_norm_prologue off: the norm's dispatch, then the GEMV with the epilogue."""
    torch.manual_seed(3)
    module = Attention(dtype=dtype)
    inputs = _inputs(module, dtype)
    options = {"rms_norm_prologue": False}
    check_op(module, inputs, ops=[FUSED], options=options, **_tol(dtype))
    assert _gemv_dispatches(gpu_forms) == [("norm", False), ("gemv", True)]
    _bitwise_unfused(module, inputs, options)


# ---- this device's forms (lavapipe: no GEMV path) -----------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
def test_default_forms(dispatched, dtype, index_dtype):
    """Whatever this device's form: eager's values and the unfused pair's bits; on a
    CPU driver the unfused pair's dispatches (norm, linear.glsl, rotary_scatter_pair)."""
    from vkdelegate.kernels.gemm_tiles import tiles_for
    from vkdelegate.runtime import default_device

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(4)
    module = Attention(bias=True, dtype=dtype)
    inputs = _inputs(module, dtype, -2, index_dtype)
    check_op(module, inputs, ops=[FUSED], **_tol(dtype))
    tiles = tiles_for(default_device().info.type)
    if tiles is not None and tiles.gemv:
        assert _gemv_dispatches(dispatched) == [("gemv", True)]
    else:
        assert _gemv_dispatches(dispatched) == [("norm", False), ("linear", False),
                                                ("rotary_scatter_pair", False)]
    _bitwise_unfused(module, inputs)


# ---- positions ATen rejects ---------------------------------------------------------
@pytest.mark.parametrize("gpu", [True, False], ids=["gemv", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_bad_position_flags_and_writes_nothing(request, gpu, dtype):
    """The caches as program state (index_copy_ into buffers): a position past the
    cache (10 or -11 for 10 rows) raises after the run naming the node, and the caches
    keep every bit (no element written); a good step after it writes its row."""
    if gpu:
        request.getfixturevalue("gpu_forms")
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(5)
    module = Attention(state=True, dtype=dtype)
    x, cos, sin, pos = _inputs(module, dtype)[:4]
    program = _lower(module, (x, cos, sin, pos))
    assert FUSED in _ops(program), _ops(program)
    program(x, cos, sin, torch.tensor([4]))
    before = program.state_dict()
    for bad in (10, -11):
        with pytest.raises(VkDelegateError, match=r"rms_norm_linear_rotary_cache.*out of "
                                                  r"range"):
            program(x, cos, sin, torch.tensor([bad]))
        after = program.state_dict()
        for name in ("kc", "vc"):
            assert torch.equal(after[name], before[name]), (bad, name)
    program(x, cos, sin, torch.tensor([7]))
    eager = Attention(state=True, dtype=dtype)
    eager.load_state_dict(module.state_dict())
    with torch.no_grad():
        eager(x, cos, sin, torch.tensor([4]))
        want = eager(x, cos, sin, torch.tensor([7]))
    after = program.state_dict()
    assert torch.count_nonzero(after["kc"][:, :, [0, 1, 2, 3, 5, 6, 8, 9]]) == 0
    for name in ("kc", "vc"):
        torch.testing.assert_close(after[name], getattr(eager, name), **_tol(dtype))
    torch.testing.assert_close(program(x, cos, sin, torch.tensor([7])), want,
                               **_tol(dtype))


# ---- what the pass leaves alone -----------------------------------------------------
@pytest.mark.parametrize("case", ["v_first", "keep_v", "off", "rows"])
def test_not_fused(case):
    """q | v | k parts (v_proj first), v read elsewhere, the compile option off, several
    rows (prefill: no merged linear): no fused op, eager's values."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    torch.manual_seed(6)
    module = Attention(v_first=case == "v_first", keep_v=case == "keep_v",
                       t=3 if case == "rows" else 1)
    inputs = _inputs(module, torch.float32)
    program = _lower(module, inputs, OFF if case == "off" else None)
    assert FUSED not in _ops(program), _ops(program)
    with torch.no_grad():
        want = module(*inputs)
    for got, w in zip(program(*inputs), want):
        torch.testing.assert_close(got, w)


# ---- the CPU kernel -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_cpu_kernel_is_the_two_ops(dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 1, 16, generator=g).to(dtype)
    nw = (torch.rand(16, generator=g) + 0.5).to(dtype)
    w = torch.randn(8 * 4, 16, generator=g).to(dtype)  # q: 2 heads, k, v: 1 head of 8
    bias = torch.randn(32, generator=g).to(dtype)
    ang = torch.rand(1, 1, 1, 8, generator=g) * 6
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    kc, vc = (torch.randn(1, 1, 5, 8, generator=g).to(dtype) for _ in range(2))
    pos = torch.tensor([-2])
    got = custom_ops.RMS_NORM_LINEAR_ROTARY_CACHE.overload()(
        x, nw, 1e-6, w, bias, cos, sin, kc, vc, [None, None, pos], [1, 2, 1, 8],
        [1, 1, 1, 8])
    y = custom_ops.RMS_NORM_LINEAR.overload()(x, nw, 1e-6, w, bias).reshape(-1)
    want = custom_ops.custom_ops_llm.ROTARY_INDEX_PUT_PAIR.overload()(
        y[:16].view(1, 2, 1, 8), y[16:24].view(1, 1, 1, 8), cos, sin, kc, vc,
        [None, None, pos], y[24:].view(1, 1, 1, 8))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


# ---- crafted blobs ------------------------------------------------------------------
def _blob(x_shape=(1, 1, 8), weight_rows=32, q_sizes=(1, 2, 1, 8), kv_sizes=(1, 1, 1, 8),
          cache=(1, 1, 5, 8), freqs=(1, 1, 1, 8), q_out=None, w_dtype="float32",
          indices=None):
    """A blob of one rms_norm_linear_rotary_cache node: x, constant norm weight [8] and
    weight [weight_rows, 8], no bias, cos/sin, two caches and an int64 position as
    inputs; its three outputs (q' of ``q_out``, default q_sizes)."""
    import numpy as np

    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    rng = np.random.default_rng(0)
    m = GraphMaker()
    x = m.input(x_shape)
    nw = m.constant((rng.random(8) + 0.5).astype(np.float32))
    w = m.constant(rng.standard_normal((weight_rows, 8)).astype(w_dtype))
    c, s = m.input(freqs), m.input(freqs)
    kc, vc = m.input(cache), m.input(cache)
    pos = m.input((1,), "int64")
    none = m.scalar(None)
    lst = m._add(g.ValueList(indices(none, pos) if indices else [none, none, pos]))
    outs = [m.tensor(shape) for shape in (q_out or q_sizes, cache, cache)]
    out = m._add(g.ValueList(outs))
    m.graph.chain.append(g.OperatorCall(0, FUSED, [
        x, nw, m.scalar(1e-6), w, none, c, s, kc, vc, lst, m.scalar(list(q_sizes)),
        m.scalar(list(kv_sizes)), out]))
    for o in outs:
        m.output(o)
    return m


@pytest.mark.parametrize("gpu", [True, False], ids=["gemv", "default"])
def test_matching_blob_runs(request, vk_device, gpu):
    """The blob's outputs are the CPU kernel's (fp32 tolerance: the fused norm)."""
    import numpy as np

    from vkdelegate.runtime import load_delegate

    if gpu:
        request.getfixturevalue("gpu_forms")
    m = _blob()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, 8), np.float32)
    ang = rng.random((1, 1, 1, 8), np.float32) * 6
    kc, vc = (rng.standard_normal((1, 1, 5, 8), np.float32) for _ in range(2))
    inputs = [x, np.cos(ang), np.sin(ang), kc, vc, np.array([3])]
    nw = np.frombuffer(m.constants[0], np.float32).copy()
    w = np.frombuffer(m.constants[1], np.float32).reshape(32, 8).copy()
    t = [torch.from_numpy(a) for a in inputs]
    want = custom_ops.RMS_NORM_LINEAR_ROTARY_CACHE.overload()(
        t[0], torch.from_numpy(nw), 1e-6, torch.from_numpy(w), None, t[1], t[2], t[3], t[4],
        [None, None, t[5]], [1, 2, 1, 8], [1, 1, 1, 8])
    with load_delegate(m.blob()) as graph:
        got = graph.execute(inputs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(weight_rows=30), r"do not split the 30 rows of the weight"),
    (dict(x_shape=(1, 2, 8)), r"one row \[1, \.\., 1, K\] expected"),
    (dict(q_sizes=(1, 2, 1, 7), kv_sizes=(1, 1, 1, 9), q_out=(1, 2, 1, 7)),
     r"even last dim"),
    (dict(q_sizes=(1, 2, 1, 0)), r"must be sizes of rank 1-4"),
    (dict(q_sizes=(1, 1, 1, 1, 2, 8)), r"must be sizes of rank 1-4"),
    (dict(kv_sizes=(1, 1, 2, 4)), r"need one dtype and last dim"),
    (dict(kv_sizes=(8,)), r"cos and sin must have one dtype and sizes of at most"),
    (dict(cache=(1, 2, 5, 8)), r"values"),
    (dict(freqs=(1, 1, 2, 8)), r"do not broadcast"),
    (dict(q_out=(1, 4, 1, 4)), r"output|sizes"),
    (dict(w_dtype="float16"), r"one dtype"),
    (dict(indices=lambda n, i: [n, i, i]), r"index tensors"),
])
def test_crafted_blob_is_refused_at_load(vk_device, kwargs, match):
    """Sizes the kernels would index past, a weight the sizes do not split, a mixed
    dtype, several index tensors: refused before anything is built, by the Vulkan
    loader and the reference executor alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=r"^node 0 \(" + FUSED + r"\): .*" + match):
            load(blob)
