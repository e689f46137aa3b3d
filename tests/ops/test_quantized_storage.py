"""Where the quantized weights live: bytes per weight in the program file and in
device memory, and the shader paths of other devices (no 8-bit storage, no integer
dot product) against eager."""
import dataclasses

import numpy as np
import pytest
import torch

from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend.quantize import quantize_for_vulkan
from vkdelegate.runtime import Device, load_delegate
from vkdelegate.serialization import vkgraph as g
from vkdelegate.serialization.blob import read_blob

pytest.importorskip("torchao")
pytestmark = pytest.mark.skipif(vulkan_unavailable() is not None,
                                reason=vulkan_unavailable() or "")

Q4GSW, INT8PACK, DQ8CA = ("et_vk.linear_q4gsw.default", "aten._weight_int8pack_mm.default",
                          "et_vk.linear_dq8ca_q4gsw.default")


def _mlp(k, hidden, n, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(k, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, n)).to(dtype).eval()


def _lower(model, x):
    return to_backend(torch.export.export(model, (x,)), VulkanPartitioner())


def _delegate(program):
    (delegate,) = program.methods["forward"].delegates
    return delegate


def _constant_tensors(graph):
    return [(vid, v) for vid, v in enumerate(graph.values)
            if isinstance(v, g.VkTensor) and v.constant_id >= 0]


@pytest.mark.parametrize("scheme,group,dtype,limit", [
    ("int4", 128, torch.float32, 0.6), ("int4", 64, torch.float32, 0.6),
    ("int4", 32, torch.float16, 0.6), ("8da4w", 128, torch.float32, 0.6),
    ("int8", 0, torch.float32, 1.1), ("int8", 0, torch.float16, 1.1)])
def test_bytes_per_weight(tmp_path, scheme, group, dtype, limit):
    # Two 512 x 512 layers: 524288 weights; biases and scales count too.
    model = quantize_for_vulkan(_mlp(512, 512, 512, dtype), scheme, group_size=group or None)
    x = torch.randn(1, 512).to(dtype)
    program = _lower(model, x)
    weights = 2 * 512 * 512
    path = tmp_path / "q.vkdp"
    program.save(str(path))
    assert path.stat().st_size / weights <= limit
    delegate = _delegate(program)
    graph = read_blob(delegate.blob).graph
    # Every constant the delegate holds, with its graph dtype: the int4 weights are
    # uint8 [N, K / 2], the int8 ones int8 [N, K]; nothing else weight-sized.
    sizes = {g.DTYPE_NAMES[v.datatype]: 0 for _, v in _constant_tensors(graph)}
    total = 0
    for _, v in _constant_tensors(graph):
        nbytes = int(np.prod(v.dims)) * np.dtype(g.DTYPE_NAMES[v.datatype]).itemsize
        sizes[g.DTYPE_NAMES[v.datatype]] += nbytes
        total += nbytes
    assert total / weights <= limit, sizes
    assert sizes["uint8" if scheme != "int8" else "int8"] == weights // (2 if scheme != "int8" else 1)
    # Device memory: the shader reads the program's constant buffer itself (no
    # prepacked copy; a CPU driver's texel form repacks the weights and scales over
    # their own buffers, NodeBuilder.repacked), and the device holds the constants at
    # their stored size.
    loaded = load_delegate(delegate.blob, delegate.named_data)
    try:
        op = {"int4": Q4GSW, "int8": INT8PACK, "8da4w": DQ8CA}[scheme]
        constant_buffers = {id(b): b for b in (loaded.resolve(vid).buffer
                                               for vid, _ in _constant_tensors(graph))}
        quantized = [d for d in loaded.dispatches if d.op == op]
        assert len(quantized) == 2
        assert all(id(d.buffers[2]) in constant_buffers for d in quantized)
        device_bytes = sum(b.size for b in constant_buffers.values())
        if loaded.device.info.capabilities.has("storageBuffer8BitAccess"):
            assert device_bytes / weights <= limit
        out = loaded.execute([x.numpy()])[0]
    finally:
        loaded.close()
    tol = 1e-2 if dtype == torch.float16 else 2e-5  # as in test_quantized_linear
    torch.testing.assert_close(torch.from_numpy(out), model(x).detach(), rtol=tol, atol=tol)


@pytest.fixture
def forms_by_rows(monkeypatch):
    """The GEMV form for up to GEMV_ROWS rows on every device, linear_qw.glsl's GEMM
    form past them (a CPU driver's texel form refused; see test_quantized_linear)."""
    from vkdelegate.ops.families import quantized_linear as family

    monkeypatch.setattr(family, "use_gemv", lambda info, m: m <= family.GEMV_ROWS)
    monkeypatch.setattr(family, "texel_form", lambda *args: False)


def _device(vk_device, small_storage=True, without=()):
    dev = Device(vk_device.info.name, validation=True, small_storage=small_storage)
    if without:
        dev.info = dataclasses.replace(dev.info, capabilities=dev.info.capabilities.without(
            *without))
    return dev


@pytest.mark.parametrize("scheme,rows", [("int4", 1), ("int4", 6), ("int8", 1),
                                         ("int8", 6), ("8da4w", 1), ("8da4w", 6)])
@pytest.mark.parametrize("device", ["wide", "no_int_dot"])
def test_other_device_paths(vk_device, forms_by_rows, scheme, rows, device):
    # wide: no 8/16-bit storage, so each weight byte is an int32 and the shader
    # assembles words; no_int_dot: 8da4w's portable integer loop. fp32 sums in
    # another order: 2e-5; 8da4w plus one activation quantum (test_quantized_linear).
    model = quantize_for_vulkan(_mlp(64, 64, 24), scheme,
                                group_size=None if scheme == "int8" else 32)
    torch.manual_seed(1)
    x = torch.randn(rows, 64)
    delegate = _delegate(_lower(model, x))
    dev = _device(vk_device, small_storage=device != "wide",
                  without=("shaderIntegerDotProduct",) if device == "no_int_dot" else ())
    try:
        with load_delegate(delegate.blob, delegate.named_data, device=dev) as loaded:
            out = torch.from_numpy(loaded.execute([x.numpy()])[0])
            forms = [(d.pipeline.name, dict(d.pipeline.defines)) for d in loaded.dispatches
                     if d.pipeline.name in ("linear_qw", "linear_qw_gemv")]
        assert not dev.validation_messages
    finally:
        dev.close()
    assert len(forms) == 2
    # One row of weights stored as bytes: the vectorized GEMV (linear_qw_gemv); the
    # rest linear_qw's word / byte-assembling forms.
    vector = rows == 1 and device != "wide"
    assert all((name == "linear_qw_gemv") == vector for name, _ in forms), forms
    defines = [d for name, d in forms if name == "linear_qw"]
    assert all(("W_WORDS" in d) == (device != "wide") for d in defines)
    assert all(("GEMV" in d) == (rows == 1) for d in defines)
    assert not any("INT_DOT" in d for _, d in forms if device == "no_int_dot")
    atol = 2e-5
    if scheme == "8da4w":
        scale = (x.amax(-1).clamp(min=0) - x.amin(-1).clamp(max=0)) / 255
        atol += float(scale.max() * model[0].weight.dequantize().abs().max())
    torch.testing.assert_close(out, model(x).detach(), rtol=2e-5, atol=atol)
