"""Compile options: the backend configuration a user passes to VulkanPartitioner.

Parsed once, here, into a frozen ``CompileOptions``; every other module reads the
dataclass, never the raw dict (ExecuTorch parses its options from bytes in two places;
we do not). Torch-free, so that a loaded program can carry its options too.

Keys (all optional):

- ``force_fp16`` (bool, default False): store float32 tensors inside delegates as
  float16; inputs and outputs keep float32 staging. Nodes that need values float16
  cannot hold stay float32 inside the delegate (``backend/fp16_ranges.py``).
- ``require_dynamic_shapes`` (bool, default False): delegate only ops that can be
  resized at run time, so that every delegate accepts any input size in range.
- ``storage_type_override`` (str | None): "BUFFER", "TEXTURE_3D" or "TEXTURE_2D";
  written into each blob's ``VkGraph.storage_type_override``.
- ``memory_layout_override`` (str | None): a ``VkMemoryLayout`` name such as
  "TENSOR_WIDTH_PACKED"; written into ``VkGraph.memory_layout_override``.
- ``skip_memory_planning`` (bool, default False): give every tensor dedicated memory
  (``mem_obj_id = -1``); useful when debugging aliasing.
- ``device`` (int | None): index of the Vulkan device to run on (None: the first).
- ``sdpa_skip_masked_tiles`` (bool, default True): the fused attention shader skips
  key tiles that are masked for every query row of a workgroup (causal, sliding
  window, boolean masks; kernels/attention.py). Exact: outputs are bit-identical with
  it off, which exists to show that (and to measure the speed-up).
- ``fuse_elementwise`` (bool, default True): fold chains of float elementwise ops
  into one ``vkdelegate.fused_elementwise`` node each (backend/passes/fuse_elementwise.py):
  one dispatch and no intermediate tensors in memory. Off: every op is its own node.
- ``fuse_linear_swiglu`` (bool, default True): a merged gate/up linear and the SwiGLU
  chain over its halves (an LLM decode step's MLP) become one
  ``vkdelegate.linear_swiglu`` node (int4 / int8 weight-only:
  ``vkdelegate.linear_q4gsw_swiglu`` / ``weight_int8pack_mm_swiglu``;
  backend/passes/fuse_linear_swiglu.py): the chain in the GEMV's epilogue, one
  dispatch fewer per layer, the same bits. Off: the linear and its fused_elementwise
  chain stay two nodes.
- ``rotary_tables`` (bool, default True): the rotary cos/sin of a decode step's cache
  writes at one position are read from a table computed at lowering (eager's values,
  for every position the cache accepts; backend/passes/rotary_tables.py): one row
  gather instead of the prelude's dispatches (cast, product, cat, cos, sin). Off: the
  prelude runs on the device every step.
- ``fuse_linear_rotary_cache`` (bool, default True): a decode layer's merged q/k/v
  ``rms_norm_linear`` and the ``rotary_index_put_pair`` reading its three parts become
  one ``vkdelegate.rms_norm_linear_rotary_cache`` node (int4 / int8 weight-only:
  ``rms_norm_linear_q4gsw`` / ``rms_norm_weight_int8pack_mm`` ->
  ``rms_norm_linear_q4gsw_rotary_cache`` / ``rms_norm_weight_int8pack_mm_rotary_cache``;
  backend/passes/fuse_linear_rotary_cache.py): where the product takes the GEMV path
  (GPUs), the rotary embedding of q and k and the K/V cache writes run in the GEMV's
  epilogue (gemv.glsl's or linear_qw_gemv.glsl's ROTARY), one dispatch fewer per
  layer, the same bits; elsewhere the node records the two ops' dispatches. Off: the
  two nodes stay apart.
- ``sdpa_seq_first`` (bool, default True): an ATen SDPA between head transposes of
  [B, L, H, E] tensors (HF encoders' ``view(B, L, H, E).transpose(1, 2)`` and the
  transpose back) becomes one ``vkdelegate.sdpa_seq_first`` node reading and writing
  that layout (backend/passes/sdpa_seq_first.py): four copy dispatches fewer per
  attention, the same bits. Off: the transposes are copied.
- ``sdpa_cooperative_matrix`` (bool, default True): float16 prefill attention runs on
  cooperative matrices (sdpa_coopmat.glsl) where the device has them; False keeps the
  portable tiled kernel (sdpa_tiled.glsl), to compare the two.
- ``rms_norm_prologue`` (bool, default True): ``vkdelegate.rms_norm_linear`` and
  ``rms_norm_linear_swiglu`` (an RMS norm fused into the linear reading it,
  backend/passes/fuse_rms_norm_linear.py, fuse_linear_swiglu.py; and the int4 / int8
  forms ``rms_norm_linear_q4gsw``, ``rms_norm_weight_int8pack_mm`` and their
  ``_swiglu`` forms, in linear_qw_gemv.glsl's RMS_NORM) run the norm inside
  the GEMV where it takes the GEMV path (gemv.glsl's RMS_NORM: the norm weight
  applied to the row as it is loaded, its sum of squares reduced with the products,
  each sum scaled by 1 / rms; one dispatch); False records the norm's dispatch and
  then the product, the unfused pair's two. (The name is the first form's, a prologue
  that normalized the row into shared memory first: slower on the H200, docs/PERF.md,
  2026-12-03 evening; kept so that saved program files load.)
- ``executor`` (str, default "vulkan"): "vulkan" runs delegates on the Vulkan runtime;
  "reference" runs them with torch ops on the CPU (``vkdelegate.backend.reference``),
  for debugging a divergence and for tests only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization.vkgraph import VkMemoryLayout, VkStorageType

_STORAGE_TYPES = tuple(t.name for t in VkStorageType if t != VkStorageType.DEFAULT_STORAGE)
_MEMORY_LAYOUTS = tuple(m.name for m in VkMemoryLayout if m != VkMemoryLayout.DEFAULT_LAYOUT)
_EXECUTORS = ("vulkan", "reference")


@dataclass(frozen=True)
class CompileOptions:
    """Validated compile options (see the module docstring for each field)."""

    force_fp16: bool = False
    require_dynamic_shapes: bool = False
    storage_type_override: Optional[str] = None
    memory_layout_override: Optional[str] = None
    skip_memory_planning: bool = False
    device: Optional[int] = None
    executor: str = "vulkan"
    sdpa_skip_masked_tiles: bool = True
    fuse_elementwise: bool = True
    sdpa_cooperative_matrix: bool = True
    rms_norm_prologue: bool = True
    fuse_linear_swiglu: bool = True
    rotary_tables: bool = True
    fuse_linear_rotary_cache: bool = True
    sdpa_seq_first: bool = True

    def to_dict(self) -> dict:
        """The options as a JSON-ready dict (stored in the program file)."""
        return dataclasses.asdict(self)

    @property
    def kernel_options(self) -> dict:
        """The options op impls read at load (``NodeBuilder.option``)."""
        return {"sdpa_skip_masked_tiles": self.sdpa_skip_masked_tiles,
                "sdpa_cooperative_matrix": self.sdpa_cooperative_matrix,
                "rms_norm_prologue": self.rms_norm_prologue}

    @property
    def storage_type(self) -> VkStorageType:
        if self.storage_type_override is None:
            return VkStorageType.DEFAULT_STORAGE
        return VkStorageType[self.storage_type_override]

    @property
    def memory_layout(self) -> VkMemoryLayout:
        if self.memory_layout_override is None:
            return VkMemoryLayout.DEFAULT_LAYOUT
        return VkMemoryLayout[self.memory_layout_override]


# key -> (accepted Python types, allowed values or None, may be None)
_SCHEMA = {
    "force_fp16": ((bool,), None, False),
    "require_dynamic_shapes": ((bool,), None, False),
    "storage_type_override": ((str,), _STORAGE_TYPES, True),
    "memory_layout_override": ((str,), _MEMORY_LAYOUTS, True),
    "skip_memory_planning": ((bool,), None, False),
    "device": ((int,), None, True),
    "executor": ((str,), _EXECUTORS, False),
    "sdpa_skip_masked_tiles": ((bool,), None, False),
    "fuse_elementwise": ((bool,), None, False),
    "sdpa_cooperative_matrix": ((bool,), None, False),
    "rms_norm_prologue": ((bool,), None, False),
    "fuse_linear_swiglu": ((bool,), None, False),
    "rotary_tables": ((bool,), None, False),
    "fuse_linear_rotary_cache": ((bool,), None, False),
    "sdpa_seq_first": ((bool,), None, False),
}


def known_options() -> list:
    """The compile option names this version knows, sorted."""
    return sorted(_SCHEMA)


def parse_options(options: "dict | CompileOptions | None") -> CompileOptions:
    """Validate a user's options dict.

    Raises VkDelegateError naming the key for an unknown key, a value of the wrong type
    (``True`` is not accepted as an int) or a value outside the allowed set.
    """
    if options is None:
        return CompileOptions()
    if isinstance(options, CompileOptions):
        return options
    if not isinstance(options, dict):
        raise VkDelegateError(f"compile options must be a dict, got "
                              f"{type(options).__name__}")
    for key, value in options.items():
        if key not in _SCHEMA:
            raise VkDelegateError(f"unknown compile option {key!r}; known options: "
                                  f"{', '.join(sorted(_SCHEMA))}")
        types, allowed, nullable = _SCHEMA[key]
        if value is None and nullable:
            continue
        # bool is a subclass of int in Python: reject it where an int is expected.
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            expected = " or ".join(t.__name__ for t in types) + (" or None" if nullable else "")
            raise VkDelegateError(f"compile option {key!r} must be {expected}, got "
                                  f"{type(value).__name__} {value!r}")
        if allowed is not None and value not in allowed:
            raise VkDelegateError(f"compile option {key!r} must be one of "
                                  f"{', '.join(allowed)}; got {value!r}")
        if key == "device" and value < 0:
            raise VkDelegateError(f"compile option 'device' must be >= 0, got {value}")
    return CompileOptions(**options)
