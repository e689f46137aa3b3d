"""Descriptor bindings of a shader variant, declared by name in Python only.

A shader names its bindings and never numbers them (common.h, tensor_meta.h)::

    TENSOR_OUT(out_data, OUT_T)       // layout(binding = BINDING_out_data) ...
    TENSOR_IN(in_data, IN_T)
    TENSOR_META(out_meta)
    PARAMS(pool_block) { ivec4 kernel_stride; ... };

The op that dispatches it registers, next to the dispatch, a function from the
variant's defines to its ``Bindings`` (``@shader_bindings("pool2d")``). Their order is
the runtime's: outputs (storage buffers written), inputs (storage buffers read), then
parameter blocks (uniform buffers, or readonly storage buffers with PARAMS_IN_STORAGE).
An input may instead be declared a uniform texel buffer (``texels``: its name and
format; GLSL ``TEXEL_IN(name)``, read with ``texelFetch``): the runtime binds a
VkBufferView of the tensor's buffer there (docs/RUNTIME.md, "Texel-buffer inputs").
On llvmpipe a storage-buffer load whose address is not known at compile time runs as a
loop over the SIMD lanes, a texel fetch as one vectorised gather; the op decides per
tensor at load whether the device can view it (``NodeBuilder.texel_input``) and picks
the variant that declares it so.
``binding_defines`` turns that list into ``BINDING_<name>=<index>``, added to the
variant's defines only when it is compiled (runtime.pipeline.compile_defines and
``vkdelegate build-shaders``): a variant's identity (``variant_key``) stays the op's
defines, and its SPIR-V cache key is a function of them alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from vkdelegate.errors import VkDelegateError


@dataclass(frozen=True)
class Bindings:
    """One variant's bindings: ``outputs`` and ``inputs`` (GLSL names of storage
    buffers), ``params`` (runtime.param_block.ParamBlock objects, bound under their
    ``name``), numbered from 0 in that order. ``texels``: (input name, format) pairs,
    format a key of TEXEL_FORMATS: those inputs are uniform texel buffers instead."""

    outputs: tuple = ()
    inputs: tuple = ()
    params: tuple = ()
    texels: tuple = ()

    def texel_format(self, name: str) -> "str | None":
        """The texel format of input ``name``, or None for a storage buffer."""
        return dict(self.texels).get(name)

    def names(self) -> list[str]:
        """Every binding's name, in binding order."""
        return [*self.outputs, *self.inputs, *(p.name for p in self.params)]

    def defines(self) -> dict[str, str]:
        """``BINDING_<name>`` -> index for every binding (VkDelegateError when a name
        repeats)."""
        names = self.names()
        if len(set(names)) != len(names):
            raise VkDelegateError(f"binding names repeat: {names}")
        for name, fmt in self.texels:
            if name not in self.inputs or fmt not in TEXEL_FORMATS:
                raise VkDelegateError(f"texel binding {name} ({fmt}): not an input of "
                                      f"{names}, or a format not in {sorted(TEXEL_FORMATS)}")
        return {f"BINDING_{n}": str(i) for i, n in enumerate(names)}


#: Formats a texel input may have: name -> bytes per texel. The texel is what one
#: ``texelFetch`` returns (a vec4; .x of the one-channel formats): "rgba32f" a vec4 of
#: fp32, "r32f" one fp32, "rgba16f" / "r16f" the same of fp16 (converted to fp32 exactly);
#: "rgba32ui" a uvec4 of the raw 16 bytes (GLSL ``TEXEL_IN_UINT``, a usamplerBuffer:
#: packed integer weights).
TEXEL_FORMATS = {"rgba32f": 16, "r32f": 4, "rgba16f": 8, "r16f": 2, "rgba32ui": 16}


_LAYOUTS: dict[str, Callable[[Mapping[str, str]], Bindings]] = {}


def shader_bindings(shader: str):
    """Decorator registering ``fn(defines) -> Bindings`` as ``shader``'s bindings
    (defines: the variant's, values as strings). One function per shader."""
    def register(fn):
        if _LAYOUTS.get(shader, fn) is not fn:
            raise VkDelegateError(f"bindings of shader {shader} declared twice")
        _LAYOUTS[shader] = fn
        return fn
    return register


def bindings_of(shader: str, defines: Mapping) -> Bindings:
    """The Bindings of variant (``shader``, ``defines``); VkDelegateError when no op
    declared the shader's bindings."""
    if shader not in _LAYOUTS:
        raise VkDelegateError(f"shader {shader} has no declared bindings "
                              f"(vkdelegate.shaders.bindings.shader_bindings)")
    return _LAYOUTS[shader]({k: str(v) for k, v in defines.items()})


def binding_defines(shader: str, defines: Mapping) -> dict[str, str]:
    """``defines`` plus the ``BINDING_<name>`` indices of the variant."""
    return {**{k: str(v) for k, v in defines.items()},
            **bindings_of(shader, defines).defines()}
