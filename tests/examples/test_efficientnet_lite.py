"""The product demo as a test: EfficientNet-Lite0 with ImageNet weights on a real photo,
fully delegated, saved, loaded and run on Vulkan, compared with eager PyTorch."""
import numpy as np
import pytest
import torch

import vkdelegate
from tests.vulkan_skip import requires_vulkan

model_zoo = pytest.importorskip(
    "vkdelegate.examples.efficientnet_lite", reason="needs the examples extra")
pytest.importorskip("efficientnet_lite_pytorch", reason="needs the examples extra")


@pytest.fixture(scope="module")
def model_and_input():
    model = model_zoo.load_model()
    x = torch.from_numpy(model_zoo.preprocess(model_zoo.load_image()))
    return model, x


@requires_vulkan
@pytest.mark.parametrize("form", ["default", "pointwise_split"])
def test_efficientnet_lite0_matches_eager_after_save_and_load(model_and_input, tmp_path,
                                                              form, monkeypatch):
    # pointwise_split: the GPUs' pointwise kernels (kernels/conv_pointwise.py), forced on
    # llvmpipe, in the forms the GPUs take: the ten 7 x 7 layers (49 pixels, not a
    # multiple of 4) on conv2d_pw_tiled.glsl, every one split at batch 1; the three
    # aligned layers whose tiled blocks alone give 132 workgroups (16 -> 96 at 112 x 112,
    # 24 -> 144 at 56 x 56 twice: TILED_ALIGNED_FULL) on it in one pass; most 14 x 14
    # layers on conv2d_pw.glsl's split form (SPLIT_K, the default SPLIT_WORKGROUPS); each
    # split convolution a SPLIT_OUT pass and a conv2d_pw_reduce.
    seen = []
    if form == "pointwise_split":
        from tests.ops.harness import spy_dispatches
        from vkdelegate.kernels import conv_pointwise
        monkeypatch.setattr(conv_pointwise, "use_gemm", lambda info: True)
        monkeypatch.setattr(conv_pointwise, "SPLIT_K", True)
        seen = spy_dispatches(monkeypatch, lambda shader, d: (shader, "SPLIT_OUT" in d))
    model, x = model_and_input
    ep = torch.export.export(model, (x,))
    lowered = vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner())
    assert lowered.report.cpu_nodes == [], str(lowered.report)
    path = tmp_path / "efficientnet_lite0.vkdp"
    lowered.save(path)
    lowered.close()

    with vkdelegate.load(path) as program:
        ours = program(x)
    with torch.no_grad():
        eager = model(x)

    assert ours.shape == eager.shape == (1, 1000)
    assert float((ours - eager).abs().max()) <= 1e-3
    ours_top = [i for i, _ in model_zoo.top_k(ours.numpy())]
    eager_top = [i for i, _ in model_zoo.top_k(eager.numpy())]
    assert ours_top == eager_top
    assert model_zoo.labels()[ours_top[0]] == "Egyptian cat"
    if form == "pointwise_split":
        splits = seen.count(("conv2d_pw", True))
        tiled = seen.count(("conv2d_pw_tiled", True))
        assert tiled == 10 and seen.count(("conv2d_pw_tiled", False)) == 3, seen
        assert splits >= 3, seen
        assert seen.count(("conv2d_pw_reduce", False)) == splits + tiled, seen
        assert seen.count(("conv2d_pw", False)) >= 5, seen  # the large layers: one pass


def test_preprocess_shape_and_normalisation():
    img = model_zoo.load_image()
    x = model_zoo.preprocess(img)
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    # A constant mid-grey image maps to (0.5 - mean) / std in every channel.
    grey = np.full((300, 400, 3), 128, dtype=np.uint8)
    g = model_zoo.preprocess(grey)
    expected = (128 / 255 - model_zoo.MEAN) / model_zoo.STD
    np.testing.assert_allclose(g[0, :, 112, 112], expected, rtol=1e-5)


def test_top_k_orders_by_probability():
    logits = np.array([0.0, 3.0, 1.0, 2.0])
    top = model_zoo.top_k(logits, k=3)
    assert [i for i, _ in top] == [1, 3, 2]
    p = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose([q for _, q in top], p[[1, 3, 2]])


def test_unreadable_image_is_a_clear_error(tmp_path):
    bad = tmp_path / "not_an_image.png"
    bad.write_bytes(b"this is not a PNG")
    with pytest.raises(vkdelegate.VkDelegateError, match="cannot read image"):
        model_zoo.load_image(str(bad))
