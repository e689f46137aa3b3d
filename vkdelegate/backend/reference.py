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

from vkdelegate.backend import allowed_ops, custom_ops, glue_ops
from vkdelegate.backend.creation_ops import UNKNOWN
from vkdelegate.backend.glue_checks import CreationBudget, Named, check_arguments
from vkdelegate.ops.load_checks import DeclaredValues, check_node
from vkdelegate.ops.registry import load_all
from vkdelegate.errors import VkDelegateError, first_line, node_label
from vkdelegate.limits import LoadLimits, resolve_limits
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.graph_checks import check_graph
from vkdelegate.serialization.tensor_budget import check_tensor_budget

_NP_DTYPES = {k: np.dtype(v) for k, v in vk.DTYPE_NAMES.items()}
_TORCH_DTYPES = {k: getattr(torch, v) for k, v in vk.DTYPE_NAMES.items()}


class ReferenceGraph:
    """A decoded delegate that executes with torch on the CPU.

    ``execute(inputs: list[np.ndarray]) -> list[np.ndarray]``, like the Vulkan runtime's
    DelegateGraph (an ``executor.Executor`` that keeps no state on a device).
    """

    keeps_state = False

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
        # Untrusted data, checked before anything is materialised: the structure, every
        # node's declared output sizes against its op's shape function (so that the
        # declared dims bound what torch will make; not for a test's extra_ops), and
        # the memory of every tensor at those dims against the load limits. Inputs are
        # checked against their declared dims at each run.
        check_graph(graph, self.limits)
        self._resolve_ops(extra_ops or {})
        if not extra_ops:
            values = DeclaredValues(graph)
            registered = load_all()
            for call in graph.chain:
                # Size arithmetic the registry lacks (mod, neg...): SymInts in, one
                # int out, checked by the operator itself.
                if not _is_size_arithmetic(call.name) or call.name in registered:
                    check_node(graph, call, values)
        check_tensor_budget(graph, self.limits)
        self.constants: dict[int, torch.Tensor] = {}
        for vid, value in enumerate(self.graph.values):
            if isinstance(value, vk.VkTensor) and value.constant_id >= 0:
                self.constants[vid] = _constant(vid, value, constant_bytes(value.constant_id))

    def _resolve_ops(self, extra_ops: Mapping) -> None:
        """Each call's callable (the allow-list, naming the node) and its load-time
        argument checks."""
        self.creation = CreationBudget(self.limits)
        self.ops = []
        for call in self.graph.chain:
            if call.name in extra_ops:
                self.ops.append(extra_ops[call.name])
                continue
            where = f"node {call.node_id} of the delegate"
            op = resolve(call.name, where)
            self.ops.append(op)
            self._check_call(call, op, where)

    def _check_call(self, call, op, where: str) -> None:
        """Load-time argument checks of an allowed op and the sizing of a creation op
        (``glue_checks``), from the literal values of its arguments."""
        schema = getattr(op, "_schema", None)
        if schema is None or not isinstance(call.args, list) or not call.args:
            return  # size arithmetic; a malformed call fails in execute
        kwargs = {}
        for a, vid in zip(schema.arguments, call.args[:-1]):
            value = self._literal(vid)
            if "ScalarType" in str(a.real_type) and isinstance(value, int):
                # The builder stores a dtype as an Int holding its VkDataType.
                name = vk.DTYPE_NAMES.get(value)
                value = UNKNOWN if name is None else Named(name)
            kwargs[a.name] = value
        check_arguments(call.name, op, [], kwargs, where)
        self.creation.add(call.node_id, call.name, [], kwargs, f"{where} ({call.name})")

    def _literal(self, vid):
        """The value ``vid`` holds if it is a literal, else UNKNOWN."""
        values = self.graph.values
        value = values[vid] if isinstance(vid, int) and 0 <= vid < len(values) else None
        literal = _literal_of(value)
        return UNKNOWN if literal is _NOT_LITERAL else literal

    def _arg(self, vid: int, env: dict):
        value = self.graph.values[vid]
        if isinstance(value, (vk.VkTensor, vk.SymInt)):
            if vid not in env:
                raise VkDelegateError(f"value {vid} is read before it is computed")
            return env[vid]
        if isinstance(value, vk.ValueList):
            return [self._arg(i, env) for i in value.items]
        return _literal_of(value)

    def close(self) -> None:
        """Nothing to free: the graph holds host memory only (Executor interface)."""

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
            where = node_label(call.node_id, call.name) if call else "graph inputs"
            raise VkDelegateError(f"reference executor, {where}: {type(exc).__name__}: "
                                  f"{first_line(exc)}") from exc

    def _run(self, inputs: list) -> list:
        if len(inputs) != len(self.graph.input_ids):
            raise VkDelegateError(f"delegate takes {len(self.graph.input_ids)} inputs, "
                                  f"got {len(inputs)}")
        env = dict(self.constants)
        for k, (vid, arr) in enumerate(zip(self.graph.input_ids, inputs)):
            env[vid] = _input(k, vid, self.graph.values[vid], arr)
        created = 0  # bytes this run's run-time-sized creation ops made
        for call, op in zip(self.graph.chain, self.ops):
            where = node_label(call.node_id, call.name)
            self._node = call
            *arg_ids, out_id = call.args
            if not hasattr(op, "_schema"):  # size arithmetic on SymInts: positional
                env[out_id] = _call(where, op, [self._arg(vid, env) for vid in arg_ids], {})
                continue
            schema = op._schema.arguments
            if len(arg_ids) != len(schema):
                raise VkDelegateError(f"{where} has {len(arg_ids)} arguments, its schema "
                                      f"{len(schema)}")
            args, kwargs, named = [], {}, {}
            for a, vid in zip(schema, arg_ids):
                value = self._arg(vid, env)
                if "ScalarType" in str(a.real_type) and isinstance(value, int):
                    # The builder stores a dtype as an Int holding its VkDataType.
                    value = _dtype_arg(where, a.name, value)
                named[a.name] = value
                if a.kwarg_only:
                    kwargs[a.name] = value
                else:
                    args.append(value)
            if call.node_id in self.creation.at_run_time:  # sizes known only now
                created += self.creation.check_call(call.name, [], named,
                                                    f"node {call.node_id} of the "
                                                    f"delegate ({call.name})", created)
            result = _call(where, op, args, kwargs)
            out = self.graph.values[out_id]
            multi = isinstance(result, (tuple, list))
            if isinstance(out, vk.ValueList):
                if not multi or len(result) != len(out.items):
                    count = f"{len(result)} outputs" if multi else "one output"
                    raise VkDelegateError(f"{where} returned {count}, its output list has "
                                          f"{len(out.items)}")
                for i, item in zip(out.items, result):
                    env[i] = item
            elif multi:
                raise VkDelegateError(f"{where} returned {len(result)} outputs, its output "
                                      f"is one value ({out_id}, a {type(out).__name__})")
            else:
                env[out_id] = result
        self._node = None
        return [_output(k, vid, self.graph.values[vid], self._arg(vid, env))
                for k, vid in enumerate(self.graph.output_ids)]


_NOT_LITERAL = object()
_SCALAR_FIELD = {vk.Int: "int_val", vk.Double: "double_val", vk.Bool: "bool_val",
                 vk.String: "string_val"}


def _literal_of(value):
    """The Python value of a scalar or list value (Null -> None), else _NOT_LITERAL."""
    if isinstance(value, vk.Null):
        return None
    if type(value) in _SCALAR_FIELD:
        return getattr(value, _SCALAR_FIELD[type(value)])
    if isinstance(value, (vk.IntList, vk.DoubleList, vk.BoolList)):
        return list(value.items)
    return _NOT_LITERAL


def _constant(vid: int, value: vk.VkTensor, data) -> torch.Tensor:
    """Tensor value ``vid``'s constant from its bytes (in the staging dtype if set);
    VkDelegateError when the bytes do not hold dtype x dims."""
    dtype = value.staging_datatype
    if dtype == vk.VkDataType.UNSET:
        dtype = value.datatype
    if dtype not in _NP_DTYPES:
        raise VkDelegateError(f"value {vid}: constant {value.constant_id} has dtype "
                              f"{dtype!r}, which the reference executor cannot read")
    count = 1
    for d in value.dims:
        count *= d
    need = count * _NP_DTYPES[dtype].itemsize
    if any(d < 0 for d in value.dims) or need != len(data):
        raise VkDelegateError(f"value {vid}: constant {value.constant_id} holds "
                              f"{len(data)} bytes, {vk.DTYPE_NAMES[dtype]}{list(value.dims)} "
                              f"needs {need}")
    arr = np.frombuffer(bytes(data), dtype=_NP_DTYPES[dtype])
    return torch.from_numpy(arr.reshape(value.dims).copy())


def _input(k: int, vid: int, value, arr):
    """Input ``k`` (value ``vid``) as the chain reads it: a Python int for a SymInt,
    else a tensor (a copy); VkDelegateError naming the input for anything else."""
    where = f"input {k} (value {vid}, a {type(value).__name__})"
    arr = np.asarray(arr)
    if isinstance(value, vk.SymInt):
        if arr.shape != () or arr.dtype.kind not in "iub":
            raise VkDelegateError(f"{where} must be one integer, got an array of shape "
                                  f"{arr.shape} and dtype {arr.dtype}")
        return int(arr)
    if arr.dtype.kind not in "biufc":
        raise VkDelegateError(f"{where} must be a numeric array, got dtype {arr.dtype}")
    if isinstance(value, vk.VkTensor) and (
            arr.ndim != len(value.dims) or any(a > d for a, d in zip(arr.shape, value.dims))):
        raise VkDelegateError(f"{where} has sizes {list(arr.shape)}, over its declared "
                              f"upper bounds {list(value.dims)}")
    return torch.from_numpy(np.array(arr))


def _output(k: int, vid: int, value, result) -> np.ndarray:
    """Output ``k`` (value ``vid``) as one numpy array; VkDelegateError naming it when
    a crafted blob's output is a list of tensors that do not stack, or no number."""
    where = f"output {k} (value {vid}, a {type(value).__name__})"
    try:
        if isinstance(result, torch.Tensor):
            result = result.resolve_conj().resolve_neg()
        arr = np.asarray(result)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise VkDelegateError(f"{where} is not one array: {exc}") from None
    if arr.dtype.kind not in "biufc":
        raise VkDelegateError(f"{where} is not one array: it has dtype {arr.dtype}")
    return arr


def _dtype_arg(where: str, name: str, value: int):
    """The torch dtype a builder-written Int holds (its VkDataType)."""
    try:
        return _TORCH_DTYPES[vk.VkDataType(value)]
    except (ValueError, KeyError):
        raise VkDelegateError(f"{where} argument {name}: {value} is not a VkDataType the "
                              f"reference executor knows") from None


def _call(where: str, op, args: list, kwargs: dict):
    """``op(*args, **kwargs)``; any failure (a crafted blob's shapes or argument kinds
    the op refuses) becomes VkDelegateError naming the node and op, as the CPU glue
    does."""
    try:
        return op(*args, **kwargs)
    except Exception as exc:
        raise VkDelegateError(f"{where} failed: {type(exc).__name__}: "
                              f"{first_line(exc)}") from exc


def resolve(name: str, where: str = "a node of the delegate"):
    """The CPU callable for an ``OperatorCall`` name: an allowed glue op
    (``glue_ops.resolve``), a Python operator on SymInts under the builder's bare
    name (``mul`` for operator.mul), ``sym_size.int``, or a delegate-only ET-VK op
    (``custom_ops`` declared with glue=False: its ``cpu`` kernel). Raises
    VkDelegateError naming ``where`` and the op for anything else."""
    if name == "sym_size.int":  # ExecuTorch's (and our builder's) blob name
        return glue_ops.TORCH_FREE["aten.sym_size.int"]
    if name in allowed_ops.REFERENCE_ONLY:
        return custom_ops.CUSTOM_OPS[name].cpu
    if _is_size_arithmetic(name):
        return glue_ops.BUILTINS[f"operator.{name}"]
    return glue_ops.resolve(name, where, reference=True)


def _is_size_arithmetic(name) -> bool:
    """A Python operator on SymInts under the builder's bare name (``mul``)."""
    return isinstance(name, str) and "." not in name and f"operator.{name}" in glue_ops.BUILTINS


def load_reference(blob: bytes, named_data: "dict | None" = None,
                   limits: "LoadLimits | None" = None) -> ReferenceGraph:
    """Decode ``blob`` for CPU execution; VkDelegateError for a malformed blob,
    ResourceLimitError for one over ``limits`` (None: the defaults)."""
    return ReferenceGraph(blob, named_data, limits)
