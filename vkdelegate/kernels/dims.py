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
