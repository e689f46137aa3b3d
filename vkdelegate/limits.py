"""Resource budget for loading untrusted program files and delegate blobs.

A program file or a blob is untrusted data: before anything is allocated, compiled or
run, what it asks for is checked against these limits, and a file over any of them
raises ``vkdelegate.errors.ResourceLimitError`` (a ``VkDelegateError``) naming the
limit, the file or method, and the value that exceeds it.

The defaults fit real models (an 8-billion-parameter fp16 LLM is about 16 GB of weights;
EfficientNet-Lite0 needs about 40 MB); pass a ``LoadLimits`` to ``vkdelegate.load(...,
limits=)`` or ``vkdelegate.runtime.load_delegate(..., limits=)`` to tighten or widen
them. Torch-free.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class LoadLimits:
    """What one loaded program (or one delegate blob) may ask for.

    Units are bytes unless the name says otherwise.

    - ``max_device_bytes``: device memory of every tensor of every delegate, at the
      upper bound of dynamic sizes, summed over the program (mem_obj_id aliasing
      counted once per shared object).
    - ``max_tensor_bytes``: any single tensor (device or host).
    - ``max_host_bytes``: host memory of the CPU glue: its constants, its mutable
      state and the tensors its creation ops (``full``, ``zeros``, ``arange``, ...)
      make, summed over the program.
    - ``max_json_depth``: nesting of the program file's JSON manifest.
    - ``max_value_depth``: nesting of ``ValueList`` values inside a blob (cycles are
      always refused).
    - ``max_nodes``: operator calls in one blob, nodes in one method's glue.
    - ``max_values``: values in one blob.
    - ``max_segments``: segments in one program file.
    """

    max_device_bytes: int = 32 * GiB
    max_tensor_bytes: int = 8 * GiB
    max_host_bytes: int = 16 * GiB
    max_json_depth: int = 64
    max_value_depth: int = 32
    max_nodes: int = 200_000
    max_values: int = 1_000_000
    max_segments: int = 100_000

    def __post_init__(self):
        from vkdelegate.errors import VkDelegateError

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise VkDelegateError(f"LoadLimits.{f.name} must be an int >= 0, got "
                                      f"{value!r}")

    def replace(self, **changes) -> "LoadLimits":
        """A copy with some limits changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


#: The limits used when a caller passes none.
DEFAULT_LIMITS = LoadLimits()


def resolve_limits(limits: "LoadLimits | None") -> LoadLimits:
    """``limits`` or the defaults; VkDelegateError for anything but a LoadLimits."""
    from vkdelegate.errors import VkDelegateError

    if limits is None:
        return DEFAULT_LIMITS
    if not isinstance(limits, LoadLimits):
        raise VkDelegateError(f"limits must be a vkdelegate.limits.LoadLimits, got "
                              f"{type(limits).__name__}")
    return limits


def check_limit(what: str, value: int, limit: int, name: str, where: str = "") -> None:
    """Raise ResourceLimitError if ``value`` > ``limit``.

    what: the thing measured ("device memory of all tensors"); name: the LoadLimits
    field; where: the file / method / value id it was found in.
    """
    if value > limit:
        from vkdelegate.errors import ResourceLimitError

        prefix = f"{where}: " if where else ""
        raise ResourceLimitError(f"{prefix}{what} is {_count(value)}, over the load limit "
                                 f"{name}={limit:,} (vkdelegate.limits.LoadLimits)")


def _count(value) -> str:
    """``value`` with thousands separators; a crafted file's product of sizes may have
    thousands of digits (Python refuses to print an int past 4300 of them), so one
    past 2^128 is given by its bit length."""
    if isinstance(value, int) and abs(value) >= 1 << 128:
        return f"about 2^{abs(value).bit_length() - 1}"
    return f"{value:,}"
