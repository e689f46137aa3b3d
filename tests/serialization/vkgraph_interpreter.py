"""Test oracle: runs a VkGraph with torch ATen ops on the CPU.

Independent of the builder's code: it only reads the VkGraph, resolves each op name to
``torch.ops`` and its args by the op schema, so a builder bug in arg order, defaults,
dtype encoding or ids shows up as a wrong result against eager PyTorch.
"""
import operator

import torch

from vkdelegate.serialization import vkgraph as vk

VK_TO_TORCH = {vk.VkDataType.BOOL: torch.bool, vk.VkDataType.UINT8: torch.uint8,
               vk.VkDataType.INT8: torch.int8, vk.VkDataType.INT32: torch.int32,
               vk.VkDataType.FLOAT16: torch.float16, vk.VkDataType.FLOAT32: torch.float32,
               vk.VkDataType.FLOAT64: torch.float64, vk.VkDataType.INT64: torch.int64}


def _prepack(x):
    return x.clone()


# ET-VK's own ops that have an eager equivalent (they are not in torch.ops without ET).
ET_VK_OPS = {"et_vk.prepack.default": _prepack}


def resolve_op(name: str):
    if name in ET_VK_OPS:
        return ET_VK_OPS[name]
    if "." not in name:
        return getattr(operator, name)
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def run(graph: vk.VkGraph, inputs, constant):
    """Runs ``graph`` on ``inputs``; ``constant(i)`` gives the bytes of constant i."""
    env = {}
    for vid, value in enumerate(graph.values):
        if isinstance(value, vk.VkTensor) and value.constant_id >= 0:
            data = bytearray(constant(value.constant_id))
            dtype = VK_TO_TORCH[value.datatype]
            t = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            env[vid] = t.reshape(value.dims)
    for vid, x in zip(graph.input_ids, inputs):
        env[vid] = x

    def get(vid, schema_type=None):
        value = graph.values[vid]
        if vid in env:
            return env[vid]
        if isinstance(value, vk.Null):
            return None
        if isinstance(value, vk.Int):
            if schema_type is not None and "ScalarType" in str(schema_type):
                return VK_TO_TORCH[vk.VkDataType(value.int_val)]
            return value.int_val
        if isinstance(value, vk.Double):
            return value.double_val
        if isinstance(value, vk.Bool):
            return value.bool_val
        if isinstance(value, vk.String):
            return value.string_val
        if isinstance(value, (vk.IntList, vk.DoubleList, vk.BoolList)):
            return list(value.items)
        if isinstance(value, vk.ValueList):
            return [get(i) for i in value.items]
        raise AssertionError(f"value {vid} ({value}) read before written")

    for op in graph.chain:
        fn = resolve_op(op.name)
        *arg_ids, out_id = op.args
        schema = getattr(fn, "_schema", None)
        if schema is None:
            result = fn(*[get(i) for i in arg_ids])
        else:
            args, kwargs = [], {}
            for sa, vid in zip(schema.arguments, arg_ids):
                v = get(vid, sa.real_type)
                if sa.kwarg_only:
                    kwargs[sa.name] = v
                else:
                    args.append(v)
            result = fn(*args, **kwargs)
        out = graph.values[out_id]
        if isinstance(out, vk.ValueList):
            for i, r in zip(out.items, result):
                env[i] = r
        else:
            env[out_id] = result
    return [get(i) for i in graph.output_ids]
