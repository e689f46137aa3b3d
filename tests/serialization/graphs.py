"""Hand-built VkGraphs shared by the serialization tests."""
from vkdelegate.serialization import vkgraph as vk


def every_kind_graph() -> vk.VkGraph:
    """A graph holding one value of every GraphTypes kind, with non-default fields."""
    values = [
        vk.Null(),
        vk.Int(-(1 << 63)),
        vk.Double(-2.5e-300),
        vk.Bool(True),
        vk.VkTensor(vk.VkDataType.FLOAT32, [2, 3, 5], constant_id=0, mem_obj_id=-1),
        vk.IntList([1, -2, (1 << 63) - 1]),
        vk.DoubleList([0.5, float("inf"), -0.0]),
        vk.BoolList([True, False, True]),
        vk.ValueList([4, 11]),
        vk.String("relu \u00e9\u4e2d"),
        vk.SymInt(7),
        vk.VkTensor(vk.VkDataType.INT64, [7], constant_id=-1, mem_obj_id=3,
                    storage_type=vk.VkStorageType.TEXTURE_3D,
                    memory_layout=vk.VkMemoryLayout.PACKED_INT8_CONV2D,
                    staging_datatype=vk.VkDataType.FLOAT16),
        vk.VkTensor(vk.VkDataType.FLOAT16, [], constant_id=1),
        vk.Bool(False),
        vk.Int(0),
    ]
    return vk.VkGraph(
        version="0.7",
        chain=[vk.OperatorCall(0, "aten.add.Tensor", [4, 4, 1, 11]),
               vk.OperatorCall(5, "aten.split_with_sizes.default", [11, 5, 14, 8])],
        values=values,
        input_ids=[4, 10],
        output_ids=[11, 11, 8],
        constants=[vk.VkBytes(0, 120), vk.VkBytes(vk.NAMED_OFFSET, 2, "k" * 64)],
        shaders=[vk.VkBytes(128, 4)],
        storage_type_override=vk.VkStorageType.BUFFER,
        memory_layout_override=vk.VkMemoryLayout.TENSOR_CHANNELS_PACKED,
    )
