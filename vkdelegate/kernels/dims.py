"""ATen's dim arguments, as op families read them. Torch-free; registers no op."""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError


def wrap_dim(dim: int, ndim: int, what: str = "dim") -> int:
    """ATen's dim wrapping (a 0-d tensor accepts dims -1 and 0): ``dim`` in
    [-ndim, ndim) as a non-negative index. Raises VkDelegateError "<what> <dim> out of
    range for rank <ndim>" when it is out of range (what: e.g. "softmax dim")."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise VkDelegateError(f"{what} {dim} out of range for rank {ndim}")
    return dim % n


def reduced_dims(dims, ndim: int) -> list[int]:
    """ATen's reduction dims: ``dims`` (a list, or None/empty for every dim) wrapped
    (``wrap_dim``) and sorted, duplicates merged; [] for a 0-d tensor."""
    if not dims:
        return list(range(ndim))
    out = {wrap_dim(d, ndim, "reduction dim") for d in dims}
    if ndim == 0:
        return []
    return sorted(out)


def reduced_mask(dims, ndim: int) -> int:
    """The reduced-dims bitmask of reduced_dims.h (``mask.x``): bit ``ndim - 1 - d`` for
    each (wrapped) dim d in ``dims``, since tensor metadata counts dims from the
    innermost (tensor_meta.h)."""
    mask = 0
    for d in dims:
        mask |= 1 << (ndim - 1 - d)
    return mask


def run_defines(mask: int) -> dict:
    """reduced_dims.h's REDUCED_RUN define where the reduced dims of ``mask``
    (``reduced_mask``) are consecutive (e.g. H and W of NCHW, or the last dim): the
    runtime's tensors are contiguous (params.meta_record), so the r-th reduced element
    is then ``r`` times the lowest reduced dim's stride from the output's base, without
    a division and modulo per dim and element (llvmpipe divides lane by lane: a mean over
    7 x 7 pixels took 5-7x longer through the general index)."""
    low = mask & -mask
    run = mask != 0 and ((mask // low) & (mask // low + 1)) == 0
    return {"REDUCED_RUN": "1"} if run else {}


def run_forms(forms: list) -> list:
    """Each define set of ``forms`` without and with REDUCED_RUN (``run_defines``), for
    declare_grid."""
    return [f for d in forms for f in (d, dict(d, REDUCED_RUN="1"))]


def sum_shape(shape, dims, keepdim: bool) -> tuple:
    """Output sizes of a reduction of ``shape`` over ``dims`` (as ``reduced_dims``
    reads them): reduced dims become 1 with ``keepdim``, else disappear."""
    red = set(reduced_dims(dims, len(shape)))
    if keepdim:
        return tuple(1 if d in red else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in red)


def slice_bounds(size: int, start, end, step: int) -> tuple[int, int]:
    """ATen's clamping of slice bounds: (start, length) for a dim of ``size``."""
    if step <= 0:
        raise VkDelegateError(f"slice step must be positive, got {step}")
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, -(-(end - start) // step)
