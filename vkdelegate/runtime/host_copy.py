"""Host copies between numpy arrays and mapped device memory (inputs in, outputs out).

An execute copies each input into its mapped buffer (the staging buffer on a discrete
GPU, the tensor itself where memory is shared) and each output out of it, as raw bytes
(one memmove: ``np.copyto`` on contiguous uint8 views). One thread's memmove runs at
one core's bandwidth: on the H200's host EfficientNet-Lite0's batch-8 input (8 x 3 x
224 x 224 fp32, 4.8 MB) took 0.39-0.44 ms by memmove or numpy assignment alike, and
0.73 ms inside execute, of a 3.0 ms call; torch's ``copy_`` (its intra-op thread pool,
16 threads there) copied it in 0.03 ms. Python threads do not help (0.33 ms at 4,
0.54 ms at 8: GIL hand-offs). So copies of at least ``PARALLEL_MIN_BYTES`` go to a
registered parallel copier (``set_parallel_copy``; the torch side registers torch's,
see vkdelegate/backend/interpreter.py), smaller ones and a torch-free process keep
the memmove. The runtime itself never imports torch.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from vkdelegate.errors import VkDelegateError

#: Copies below this many bytes stay one memmove on the calling thread (handing a
#: copy to a thread pool costs microseconds, what one thread copies in that time).
PARALLEL_MIN_BYTES = 1 << 20

_parallel: Callable[[np.ndarray, np.ndarray], None] | None = None


def set_parallel_copy(fn: Callable[[np.ndarray, np.ndarray], None] | None) -> None:
    """Register ``fn(dst, src)`` for large copies: it copies ``src`` into ``dst``,
    equal-size C-contiguous uint8 arrays (``src`` writable), and returns when done.
    None: back to the memmove."""
    global _parallel
    _parallel = fn


def copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """Copy the bytes of ``src`` into the start of ``dst``: both C-contiguous arrays
    (any dtypes: raw bytes, no conversion), ``dst.nbytes >= src.nbytes``. Raises
    VkDelegateError when an array is not contiguous or ``dst`` is too small."""
    if not (src.flags.c_contiguous and dst.flags.c_contiguous):
        raise VkDelegateError("copy_bytes needs C-contiguous arrays")
    n = src.nbytes
    if n > dst.nbytes:
        raise VkDelegateError(f"copy_bytes: {n} bytes do not fit in {dst.nbytes}")
    s = src.reshape(-1).view(np.uint8)
    d = dst.reshape(-1).view(np.uint8)[:n]
    if _parallel is not None and n >= PARALLEL_MIN_BYTES and s.flags.writeable:
        _parallel(d, s)
    else:
        np.copyto(d, s)
