"""Reference executor: run a delegate blob's VkGraph with torch ops on the CPU.

An oracle for debugging (which node of a delegate diverges from eager?) and for the
lowering tests, which then do not depend on a Vulkan device. Selected explicitly with
the compile option ``executor="reference"`` (or ``vkdelegate.load(..., executor=
"reference")``), never as a silent fallback.

Each ``OperatorCall`` resolves to its ATen overload (the same allow-list as the CPU
glue); its value ids map to Python arguments in schema order, the last id being the
output (a ``ValueList`` for multi-output ops).
"""
from __future__ import annotations

import numpy as np
import torch

from vkdelegate.backend import glue_ops
from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization import vkgraph as vk

_NP_DTYPES = {k: np.dtype(v) for k, v in vk.DTYPE_NAMES.items()}
_TORCH_DTYPES = {k: getattr(torch, v) for k, v in vk.DTYPE_NAMES.items()}


class ReferenceGraph:
    """A decoded delegate that executes with torch on the CPU.

    ``execute(inputs: list[np.ndarray]) -> list[np.ndarray]``, like the Vulkan runtime's
    DelegateGraph.
    """

    def __init__(self, blob: bytes, named_data: "dict | None" = None):
        from vkdelegate.serialization.blob import read_blob

        decoded = read_blob(blob)
        self.graph = decoded.graph
        named_data = named_data or {}
        self.constants: dict[int, torch.Tensor] = {}
        for vid, value in enumerate(self.graph.values):
            if isinstance(value, vk.VkTensor) and value.constant_id >= 0:
                ref = self.graph.constants[value.constant_id]
                if ref.is_named:
                    if ref.named_key not in named_data:
                        raise VkDelegateError(f"value {vid}: named constant "
                                              f"{ref.named_key!r} missing")
                    data = named_data[ref.named_key]
                else:
                    data = decoded.constants_section[ref.offset:ref.offset + ref.length]
                dtype = value.staging_datatype
                if dtype == vk.VkDataType.UNSET:
                    dtype = value.datatype
                arr = np.frombuffer(bytes(data), dtype=_NP_DTYPES[dtype])
                self.constants[vid] = torch.from_numpy(arr.reshape(value.dims).copy())
        self.ops = [glue_ops.resolve(call.name) for call in self.graph.chain]

    def _arg(self, vid: int, env: dict):
        value = self.graph.values[vid]
        if isinstance(value, (vk.VkTensor, vk.SymInt)):
            if vid not in env:
                raise VkDelegateError(f"value {vid} is read before it is computed")
            return env[vid]
        if isinstance(value, vk.Null):
            return None
        if isinstance(value, vk.Int):
            return value.int_val
        if isinstance(value, vk.Double):
            return value.double_val
        if isinstance(value, vk.Bool):
            return value.bool_val
        if isinstance(value, vk.String):
            return value.string_val
        if isinstance(value, vk.ValueList):
            return [self._arg(i, env) for i in value.items]
        return list(value.items)  # IntList, DoubleList, BoolList

    def execute(self, inputs: list) -> list:
        """Run the chain on ``inputs`` (numpy arrays, in input_ids order)."""
        if len(inputs) != len(self.graph.input_ids):
            raise VkDelegateError(f"delegate takes {len(self.graph.input_ids)} inputs, "
                                  f"got {len(inputs)}")
        env = dict(self.constants)
        for vid, arr in zip(self.graph.input_ids, inputs):
            value = self.graph.values[vid]
            env[vid] = (int(arr) if isinstance(value, vk.SymInt)
                        else torch.from_numpy(np.array(arr)))
        for call, op in zip(self.graph.chain, self.ops):
            *arg_ids, out_id = call.args
            schema = op._schema.arguments
            if len(arg_ids) != len(schema):
                raise VkDelegateError(f"node {call.node_id} ({call.name}) has "
                                      f"{len(arg_ids)} arguments, its schema {len(schema)}")
            args, kwargs = [], {}
            for a, vid in zip(schema, arg_ids):
                value = self._arg(vid, env)
                if "ScalarType" in str(a.real_type) and isinstance(value, int):
                    # The builder stores a dtype as an Int holding its VkDataType.
                    value = _TORCH_DTYPES[vk.VkDataType(value)]
                if a.kwarg_only:
                    kwargs[a.name] = value
                else:
                    args.append(value)
            result = op(*args, **kwargs)
            out = self.graph.values[out_id]
            if isinstance(out, vk.ValueList):
                for i, item in zip(out.items, result):
                    env[i] = item
            else:
                env[out_id] = result
        return [np.asarray(self._arg(i, env)) for i in self.graph.output_ids]


def load_reference(blob: bytes, named_data: "dict | None" = None) -> ReferenceGraph:
    """Decode ``blob`` for CPU execution; VkDelegateError for a malformed blob."""
    return ReferenceGraph(blob, named_data)
