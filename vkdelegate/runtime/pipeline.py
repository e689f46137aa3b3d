"""Compute pipelines, cached per device by (shader variant, bindings, specialization).

A ``Pipeline`` owns its shader module, descriptor set layout, pipeline layout and
VkPipeline. The descriptor layout follows the variant's declared bindings
(vkdelegate.shaders.bindings, checked by ``NodeBuilder.dispatch``): storage buffers for
the tensors written, then for the tensors read (uniform texel buffers for the inputs
the variant declares so: runtime/texel.py), then the parameter blocks (uniform
buffers; storage buffers on lavapipe, see ``compile_defines``), numbered from 0 in that
order.
Specialization constants 0, 1, 2 are the workgroup size (``local_size_x_id`` ... in
common.h); an op's own specialization constants follow from id 3.
"""
from __future__ import annotations

import numpy as np
import vulkan as vk

from vkdelegate.runtime import pipeline_stats
from vkdelegate.runtime.params import int32_value
from vkdelegate.runtime.vkcall import vk_call
from vkdelegate.shaders.bindings import binding_defines
from vkdelegate.shaders.compiler import default_compiler
from vkdelegate.shaders.variants import check, variant_key

STORAGE = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
UNIFORM = vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
TEXEL = vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER


def compile_defines(device, shader: str, defines: dict) -> dict:
    """The defines variant (``shader``, ``defines``) is compiled with on ``device``: the
    op's, its BINDING_<name> indices (shaders.bindings.binding_defines), plus
    PARAMS_IN_STORAGE where the device binds parameter blocks as storage buffers
    (``Device.params_in_storage``; common.h's PARAM_BLOCK)."""
    full = binding_defines(shader, defines)
    if device.params_in_storage:
        full["PARAMS_IN_STORAGE"] = "1"
    return full


class Pipeline:
    """One compute pipeline: ``name`` (shader), ``defines`` (sorted (name, value)
    pairs of the variant), ``binding_types`` (each binding's descriptor type)."""

    def __init__(self, device, shader: str, defines: dict, binding_types: tuple,
                 spec_constants: tuple):
        self.name = shader
        self.defines = tuple(sorted(defines.items()))
        self.binding_types = binding_types
        dev = device.device
        what = f"shader {shader}"
        # Checked before any Vulkan object exists, so that a refusal leaks nothing.
        spec_values = [int32_value(v, f"specialization constant {i} of {what}")
                       for i, v in enumerate(spec_constants)]
        check(shader, defines, device.capabilities)
        spirv = default_compiler().compile(shader, compile_defines(device, shader, defines),
                                           device.capabilities.target_env)
        module_info = vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            codeSize=len(spirv), pCode=spirv)
        self.module = vk_call(vk.vkCreateShaderModule, dev, module_info, None, what=what)
        bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=t, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i, t in enumerate(binding_types)]
        layout_info = vk.VkDescriptorSetLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
            bindingCount=len(bindings), pBindings=bindings)
        self.set_layout = vk_call(vk.vkCreateDescriptorSetLayout, dev, layout_info, None,
                                  what=what)
        pl_info = vk.VkPipelineLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
            setLayoutCount=1, pSetLayouts=[self.set_layout])
        self.layout = vk_call(vk.vkCreatePipelineLayout, dev, pl_info, None, what=what)
        # Keep the specialization data, map entries and entry-point name in locals until
        # vkCreateComputePipelines returns: cffi frees what nothing references.
        spec_data = np.asarray(spec_values, dtype=np.int32).tobytes()
        spec_buffer = vk.ffi.new("char[]", spec_data)
        entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4)
                   for i in range(len(spec_constants))]
        spec = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries,
                                       dataSize=len(spec_data), pData=spec_buffer)
        entry_name = "main"
        stage = vk.VkPipelineShaderStageCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module, pName=entry_name,
            pSpecializationInfo=spec)
        create = vk.VkComputePipelineCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage,
            layout=self.layout, flags=pipeline_stats.create_flags(device))
        self.pipeline = vk_call(vk.vkCreateComputePipelines, dev, vk.VK_NULL_HANDLE, 1,
                                [create], None, what=what)[0]
        del spec_buffer, entries, spec, stage, create
        self._device = device

    def statistics(self) -> list:
        """The driver's compiler statistics of this pipeline's executables
        (runtime/pipeline_stats.py; VkDelegateError where the device captures none)."""
        return pipeline_stats.executables(self._device, self.pipeline)

    def destroy(self, dev) -> None:
        """Destroy the pipeline and the objects it owns on VkDevice ``dev``."""
        vk.vkDestroyPipeline(dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)
        vk.vkDestroyShaderModule(dev, self.module, None)


class PipelineCache:
    """Pipelines of one device, created on first request and shared by all graphs."""

    def __init__(self, device):
        self.device = device
        self._pipelines: dict[tuple, Pipeline] = {}

    def get(self, shader: str, defines: dict, binding_types: tuple,
            spec_constants: tuple) -> Pipeline:
        key = (variant_key(shader, defines), binding_types, tuple(spec_constants))
        pipe = self._pipelines.get(key)
        if pipe is None:
            pipe = Pipeline(self.device, shader, defines, binding_types, tuple(spec_constants))
            self._pipelines[key] = pipe
        return pipe

    def items(self) -> list:
        """(shader name, sorted defines, Pipeline) of every cached pipeline, in creation order."""
        return [(p.name, p.defines, p) for p in self._pipelines.values()]

    def __len__(self) -> int:
        return len(self._pipelines)

    def close(self) -> None:
        """Destroy every cached pipeline (at Device.close)."""
        for pipe in self._pipelines.values():
            pipe.destroy(self.device.device)
        self._pipelines.clear()
