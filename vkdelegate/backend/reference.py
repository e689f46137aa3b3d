"""Reference executor: run a delegate blob's VkGraph with torch ops on the CPU.

An oracle for debugging (which node of a delegate diverges from eager?) and for the
lowering tests, which then do not depend on a Vulkan device. Selected explicitly with
the compile option ``executor="reference"`` (or ``vkdelegate.load(..., executor=
"reference")``), never as a silent fallback.

Each ``OperatorCall`` resolves to its ATen overload (the same allow-list as the CPU
glue, see ``resolve``); its value ids map to Python arguments in schema order, the last
id being the output (a ``ValueList`` for multi-output ops). The serialization tests use
it as their oracle too (``ReferenceGraph.from_graph``): it reads only the VkGraph, so a
builder bug in argument order, defaults, dtype encoding or ids shows up as a wrong
result against eager PyTorch.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch

from vkdelegate.backend import glue_ops
from vkdelegate.errors import VkDelegateError
from vkdelegate.limits import LoadLimits, resolve_limits
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.graph_checks import check_graph
from vkdelegate.serialization.tensor_budget import check_tensor_budget

_NP_DTYPES = {k: np.dtype(v) for k, v in vk.DTYPE_NAMES.items()}
_TORCH_DTYPES = {k: getattr(torch, v) for k, v in vk.DTYPE_NAMES.items()}


class ReferenceGraph:
    """A decoded delegate that executes with torch on the CPU.

    ``execute(inputs: list[np.ndarray]) -> list[np.ndarray]``, like the Vulkan runtime's
    DelegateGraph.
    """

    def __init__(self, blob: bytes, named_data: "dict | None" = None,
                 limits: "LoadLimits | None" = None):
        from vkdelegate.serialization.blob import read_blob

        self.limits = resolve_limits(limits)
        decoded = read_blob(blob, self.limits)
        named_data = named_data or {}
        self._load(decoded.graph, lambda i: decoded.constant_bytes(i, named_data))

    @classmethod
    def from_graph(cls, graph: vk.VkGraph, constant_bytes: Callable[[int], bytes],
                   extra_ops: "Mapping[str, Callable] | None" = None) -> "ReferenceGraph":
        """A reference graph from a decoded VkGraph; ``constant_bytes(i)`` gives the
        bytes of ``graph.constants[i]`` (e.g. ``DelegateBlob.constant_bytes``).
        ``extra_ops`` maps op names outside the allow-list (a test's custom op) to
        their callables; a program file can never supply them."""
        self = cls.__new__(cls)
        self.limits = resolve_limits(None)
        self._load(graph, constant_bytes, extra_ops or {})
        return self

    def _load(self, graph: vk.VkGraph, constant_bytes: Callable[[int], bytes],
              extra_ops: "Mapping[str, Callable] | None" = None) -> None:
        self.graph = graph
        # Untrusted data: structure and the memory of the constants are checked before
        # any is materialised. Other tensors are made by torch at their actual sizes
        # when the graph runs (so a delegate over the device budget because of a huge
        # dynamic upper bound can fall back to this executor, see backend/program.py).
        check_graph(graph, self.limits)
        check_tensor_budget(graph, self.limits, constants_only=True)
        self.constants: dict[int, torch.Tensor] = {}
        for vid, value in enumerate(self.graph.values):
            if isinstance(value, vk.VkTensor) and value.constant_id >= 0:
                data = constant_bytes(value.constant_id)
                dtype = value.staging_datatype
                if dtype == vk.VkDataType.UNSET:
                    dtype = value.datatype
                np_dtype = _NP_DTYPES.get(dtype)
                numel = int(np.prod(value.dims, dtype=object))
                if np_dtype is None or len(data) != numel * np_dtype.itemsize:
                    raise VkDelegateError(
                        f"tensor {vid}: constant {value.constant_id} has {len(data)} "
                        f"bytes, {getattr(np_dtype, 'name', dtype)} {list(value.dims)} "
                        f"needs {numel * getattr(np_dtype, 'itemsize', 0)}")
                arr = np.frombuffer(bytes(data), dtype=np_dtype)
                self.constants[vid] = torch.from_numpy(arr.reshape(value.dims).copy())
        extra_ops = extra_ops or {}
        self.ops = [extra_ops[call.name] if call.name in extra_ops else resolve(call.name)
                    for call in self.graph.chain]

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
        """Run the chain on ``inputs`` (numpy arrays, in input_ids order). Raises
        VkDelegateError, naming the node, for whatever torch or numpy refuses in a
        malformed graph (a wrong argument kind, a dim out of range, a bad dtype)."""
        self._node = None
        try:
            return self._run(inputs)
        except VkDelegateError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError,
                NotImplementedError, OverflowError) as exc:
            call = self._node
            where = f"node {call.node_id} ({call.name})" if call else "graph inputs"
            raise VkDelegateError(f"reference executor, {where}: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc

    def _run(self, inputs: list) -> list:
        if len(inputs) != len(self.graph.input_ids):
            raise VkDelegateError(f"delegate takes {len(self.graph.input_ids)} inputs, "
                                  f"got {len(inputs)}")
        env = dict(self.constants)
        for vid, arr in zip(self.graph.input_ids, inputs):
            value = self.graph.values[vid]
            env[vid] = (int(arr) if isinstance(value, vk.SymInt)
                        else torch.from_numpy(np.array(arr)))
        for call, op in zip(self.graph.chain, self.ops):
            self._node = call
            *arg_ids, out_id = call.args
            if not hasattr(op, "_schema"):  # size arithmetic on SymInts: positional
                env[out_id] = op(*[self._arg(vid, env) for vid in arg_ids])
                continue
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
        self._node = None
        return [np.asarray(self._arg(i, env)) for i in self.graph.output_ids]


def _prepack(x):
    return x.clone()


#: Delegate-internal ET-VK ops with no ATen or glue equivalent: ``prepack`` copies a
#: constant into its GPU layout, on the CPU a copy.
_DELEGATE_ONLY = {"et_vk.prepack.default": _prepack}


def resolve(name: str):
    """The CPU callable for an ``OperatorCall`` name: an allowed glue op
    (``glue_ops.resolve``), a Python operator on SymInts under the builder's bare
    name (``mul`` for operator.mul), or a delegate-only ET-VK op. Raises
    VkDelegateError naming the op for anything else."""
    if name in _DELEGATE_ONLY:
        return _DELEGATE_ONLY[name]
    if "." not in name and f"operator.{name}" in glue_ops.BUILTINS:
        return glue_ops.BUILTINS[f"operator.{name}"]
    return glue_ops.resolve(name)


def load_reference(blob: bytes, named_data: "dict | None" = None,
                   limits: "LoadLimits | None" = None) -> ReferenceGraph:
    """Decode ``blob`` for CPU execution; VkDelegateError for a malformed blob,
    ResourceLimitError for one over ``limits`` (None: the defaults)."""
    return ReferenceGraph(blob, named_data, limits)
