"""8da4w's activation rows quantized once, shared by the qparams op
(ops/families/choose_qparams.py, which writes and publishes them: choose_qparams.glsl's
QX form) and the quantized linears (ops/families/quantized_linear.py, whose GEMV reads
them: linear_qw_gemv.glsl's QX_IN form) instead of quantizing x in each workgroup.

Layout (``words(K)`` 32-bit words a row): the int8 values of k = 8g .. 8g + 7 are words
2g (k = 8g, 8g + 2, 8g + 4, 8g + 6 in bytes 0 .. 3) and 2g + 1 (the odd k), the k
parity of an int4 weight word's low and high nibbles; K padded to a multiple of 32 (a
weight block) with zeros. Torch-free; registers no op.
"""
from __future__ import annotations

#: Write and publish the quantized rows for the products' GEMV (GPUs only). Off: each
#: GEMV workgroup quantizes x as it loads it.
QX = True
#: The most rows (the upper bound) whose products run the GEMV on GPUs
#: (quantized_linear.GEMV_ROWS is this).
ROWS = 4


def words(k: int) -> int:
    """32-bit words of one row of k values in the layout (8 per 32 values)."""
    return 8 * -(-k // 32)


def key(scale, zp) -> "tuple | None":
    """The key (NodeBuilder.publish) of the rows quantized with qparams (Tensors scale
    and zero point: the qparams op's outputs): their value ids; None for an op's
    temporary (nothing to match). Not x's: the products of our lowering read x or a view
    of it (an aten.view of the norm's y: the same values row by row); a product of other
    values with these qparams (a crafted blob) reads published rows of its own sizes
    (the reader checks them): other values, never out of bounds. A product reading a
    view of the qparams (passes/quantized_linear._fold_norm views them where x was a
    view of the norm) has other ids and quantizes x itself."""
    ids = (scale.value_id, zp.value_id)
    return ("q8x",) + ids if min(ids) >= 0 else None


def gemv_device(info) -> bool:
    """Whether device ``info`` (a DeviceInfo) runs the quantized GEMV for few rows:
    GPUs; CPU drivers take the GEMM and texel forms (quantized_linear.use_gemv)."""
    return info.type != "cpu"


def publishes(info, rows: int, k: int) -> bool:
    """Whether qparams of ``rows`` rows (the upper bound) of ``k`` values on device
    ``info`` write and publish the quantized rows: QX, and products that would read
    them (the GEMV's rows on a GPU, rows of whole weight blocks)."""
    return QX and rows <= ROWS and k % 32 == 0 and gemv_device(info)
