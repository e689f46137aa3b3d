"""Inputs read as uniform texel buffers (runtime/texel.py, issue 12).

On CPU drivers the pointwise convolution (conv2d.glsl PW_TEXEL), the column
convolution (conv2d_col.glsl COL_TEXEL: depthwise and small dense kernels), the
prepacked linear (linear.glsl B_TEXEL, A_TEXEL) and the few-query attention (sdpa.glsl
KV_TEXEL: keys and values) read their weights and inputs through VkBufferViews. Their outputs are bit-identical to the storage-buffer forms' (same
values, same order of the sums); a tensor the device cannot view (over
maxTexelBufferElements, forced here with a small limit) keeps the storage form; the
views are destroyed with the graph. On GPUs nothing changes: no texel form is taken.
"""
import os

import numpy as np
import pytest

from tests.ops.harness import spy_dispatches
from tests.runtime.graphs import GraphMaker, rand
from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime import Device
from vkdelegate.shaders.bindings import Bindings

#: Texel flags of the variants and the views each binds (PW_TEXEL: weights, input;
#: KV_TEXEL: the keys and the values).
VIEWS = {"PW_TEXEL": 2, "COL_TEXEL": 2, "A_TEXEL": 1, "B_TEXEL": 1, "KV_TEXEL": 2}


def test_bindings_declare_texel_inputs():
    b = Bindings(outputs=("o",), inputs=("x", "w"), texels=(("w", "rgba32f"),))
    assert b.texel_format("w") == "rgba32f" and b.texel_format("x") is None
    assert b.defines() == {"BINDING_o": "0", "BINDING_x": "1", "BINDING_w": "2"}
    with pytest.raises(VkDelegateError, match=r"texel binding y \(rgba32f\)"):
        Bindings(outputs=("o",), inputs=("x",), texels=(("y", "rgba32f"),)).defines()
    with pytest.raises(VkDelegateError, match=r"texel binding x \(rgb8\)"):
        Bindings(outputs=("o",), inputs=("x",), texels=(("x", "rgb8"),)).defines()


def _conv(m, rng, x_shape, oc, dtype="float32", k=1, stride=1, groups=1):
    """A convolution with a constant weight and bias, padding k // 2 (1x1: the
    pointwise path; else conv2d_col.glsl)."""
    ic, pad = x_shape[1], k // 2
    out = [(s + 2 * pad - k) // stride + 1 for s in x_shape[2:]]
    ix = m.input(x_shape, dtype)
    args = [ix, m.constant(rand(rng, (oc, ic // groups, k, k), dtype)),
            m.constant(rand(rng, (oc,), dtype)), m.scalar([stride] * 2),
            m.scalar([pad] * 2), m.scalar([1, 1]), m.scalar(False), m.scalar([0, 0]),
            m.scalar(groups)]
    m.output(m.op("aten.convolution.default", args, [x_shape[0], oc] + out, dtype))
    return [rand(rng, x_shape, dtype)]


def _depthwise(m, rng, x_shape, k, dtype="float32"):
    return _conv(m, rng, x_shape, x_shape[1], dtype, k=k, stride=2, groups=x_shape[1])


def _dense3x3(m, rng, x_shape, oc, dtype="float32"):
    return _conv(m, rng, x_shape, oc, dtype, k=3)


def _linear(m, rng, x_shape, n, dtype="float32"):
    ix = m.input(x_shape, dtype)
    args = [ix, m.constant(rand(rng, (n, x_shape[-1]), dtype)),
            m.constant(rand(rng, (n,), dtype))]
    m.output(m.op("aten.linear.default", args, x_shape[:-1] + (n,), dtype))
    return [rand(rng, x_shape, dtype)]


def _sdpa(m, rng, q_shape, kv_len, dtype="float32", mask=None, causal=True):
    """Attention (ATen's SDPA, enable_gqa) of q [B, Hq, L, E] over keys and values
    [B, Hq / 2, kv_len, E] (constants), causal (bottom-right rows here: L < S), or a
    mask ("bool" / "float", [L, S])."""
    b, hq, l, e = q_shape
    iq = m.input(q_shape, dtype)
    k = m.constant(rand(rng, (b, hq // 2, kv_len, e), dtype))
    v = m.constant(rand(rng, (b, hq // 2, kv_len, e), dtype))
    mk = m.scalar(None)
    if mask == "bool":
        mk = m.constant(rng.random((l, kv_len)) < 0.7)
    elif mask == "float":
        mk = m.constant(rand(rng, (l, kv_len), dtype))
    args = [iq, k, v, mk, m.scalar(0.0), m.scalar(causal and mask is None),
            m.scalar(None), m.scalar(True)]
    m.output(m.op("aten.scaled_dot_product_attention.default", args, q_shape, dtype))
    return [rand(rng, q_shape, dtype)]


# (graph maker, input shape, output channels / features, dtype, texel flags expected)
CASES = {
    "pw_shifted_7x7": (_conv, (2, 16, 7, 7), 12, "float32", {"PW_TEXEL"}),
    "pw_aligned_8x8": (_conv, (1, 6, 8, 8), 8, "float32", {"PW_TEXEL"}),
    "pw_tile1_fp16": (_conv, (1, 8, 5, 5), 6, "float16", {"PW_TEXEL"}),
    "pw_rows": (_conv, (1, 5, 3, 3), 4, "float32", set()),  # input not whole texels
    "depthwise_3x3_s2": (_depthwise, (2, 6, 11, 9), 3, "float32", {"COL_TEXEL"}),
    "depthwise_5x5_fp16": (_depthwise, (1, 4, 9, 9), 5, "float16", {"COL_TEXEL"}),
    "dense_3x3_tile4": (_dense3x3, (1, 3, 13, 11), 8, "float32", {"COL_TEXEL"}),
    "linear_vec4": (_linear, (6, 32), 9, "float32", {"A_TEXEL", "B_TEXEL"}),
    "linear_k13": (_linear, (5, 13), 7, "float32", {"B_TEXEL"}),
    "linear_fp16": (_linear, (2, 3, 16), 5, "float16", {"A_TEXEL", "B_TEXEL"}),
    "linear_small_weight": (_linear, (16, 8), 4, "float32", {"A_TEXEL", "B_TEXEL"}),
    # sdpa.glsl (few queries: decode), K and V read as texel buffers: split-K over 160
    # keys (5 tiles, 2 splits), fp16, head dim 40 (a partial vec4 of the 48-wide bucket),
    # an additive and a boolean mask (its block map, TILE_MAP).
    "sdpa_decode_split": (_sdpa, (1, 8, 1, 64), 160, "float32", {"KV_TEXEL"}),
    "sdpa_fp16_d40": (_sdpa, (2, 4, 3, 40), 37, "float16", {"KV_TEXEL"}),
    "sdpa_float_mask": (lambda *a: _sdpa(*a, mask="float"), (1, 4, 2, 16), 20, "float32",
                        {"KV_TEXEL"}),
    "sdpa_bool_mask": (lambda *a: _sdpa(*a, mask="bool"), (1, 4, 2, 16), 70, "float32",
                       {"KV_TEXEL"}),
}


def _run(device, monkeypatch, case):
    """(output, texel flags of its dispatches, texel views while open, after close)."""
    make, shape, n, dtype, _ = case
    seen = spy_dispatches(monkeypatch, lambda shader, d: {f for f in VIEWS if f in d})
    m = GraphMaker()
    inputs = make(m, np.random.default_rng(5), shape, n, dtype)
    graph = m.build(device)
    try:
        out = graph.execute(inputs)[0]
        views = graph.allocator.texel_views
    finally:
        graph.close()
    return out, set().union(*seen), views, graph.allocator.texel_views


def _cpu_driver(device):
    if not device.texel_inputs:
        pytest.skip("this device reads inputs from storage buffers (a GPU)")


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_texel_forms_match_the_storage_forms_bit_for_bit(vk_device, monkeypatch, case):
    _cpu_driver(vk_device)
    out, flags, views, left = _run(vk_device, monkeypatch, case)
    assert flags == case[-1]
    assert views == sum(VIEWS[f] for f in flags) and left == 0
    monkeypatch.setattr(vk_device, "texel_inputs", False)
    storage, flags, views, _ = _run(vk_device, monkeypatch, case)
    assert flags == set() and views == 0
    np.testing.assert_array_equal(out, storage)


def test_tensors_over_the_texel_limit_keep_storage_buffers(vk_device, monkeypatch):
    """A limit of 16 texels: a conv whose input is larger falls back whole (weights
    too); a linear whose weight fits (8 vec4s) keeps B_TEXEL and reads its larger a
    (32 vec4s) from a storage buffer. Same outputs as without the limit."""
    _cpu_driver(vk_device)
    conv, linear = CASES["pw_shifted_7x7"], CASES["linear_small_weight"]
    want = [_run(vk_device, monkeypatch, c)[0] for c in (conv, linear)]
    monkeypatch.setattr(vk_device.info, "max_texel_buffer_elements", 16)
    got = [_run(vk_device, monkeypatch, c) for c in (conv, linear)]
    assert [g[1] for g in got] == [set(), {"B_TEXEL"}]
    for (out, *_), expected in zip(got, want):
        np.testing.assert_array_equal(out, expected)


def test_a_format_the_device_lacks_keeps_storage_buffers(vk_device, monkeypatch):
    _cpu_driver(vk_device)
    monkeypatch.setattr(vk_device.info, "texel_formats", frozenset({"r32f"}))
    assert _run(vk_device, monkeypatch, CASES["linear_vec4"])[1] == set()


def test_views_are_destroyed_with_the_graph():
    """A device of its own, closed at the end: the validation layer reports any Vulkan
    object still alive at vkDestroyDevice (a leaked VkBufferView among them)."""
    validation = os.environ.get("VKDELEGATE_VALIDATION") == "1"
    try:
        device = Device(validation=validation)
    except VkDelegateError as exc:
        pytest.skip(f"no Vulkan device: {exc}")
    try:
        if not device.texel_inputs:
            pytest.skip("this device reads inputs from storage buffers (a GPU)")
        m = GraphMaker()
        inputs = _conv(m, np.random.default_rng(3), (1, 8, 7, 7), 4)
        with m.build(device) as graph:
            graph.execute(inputs)
            assert graph.allocator.texel_views == 2
        assert graph.allocator.texel_views == 0
        dropped = m.build(device)  # never closed: Device.close releases it
        dropped.execute(inputs)
    finally:
        device.close()
    assert device.validation_messages == []
