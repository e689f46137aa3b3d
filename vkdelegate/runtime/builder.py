"""``NodeBuilder``: the API op implementations use to turn one node into dispatches.

See docs/RUNTIME.md ("How to add an op") for a worked example. An op's ``impl`` is
called once per node at load time as ``impl(b: NodeBuilder, node: OperatorCall)``;
``node.args`` are value ids in ATen schema order with the output id last. The impl
reads its arguments through ``b``, allocates what it needs and declares its dispatches
with ``b.dispatch``; it records no Vulkan commands itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from vkdelegate.errors import DeviceLimitError, VkDelegateError, node_label
from vkdelegate.limits import check_limit
from vkdelegate.runtime.dtypes import device_dtype
from vkdelegate.runtime.params import ParamBuffer
from vkdelegate.runtime import texel
from vkdelegate.runtime.pipeline import STORAGE, TEXEL, UNIFORM
from vkdelegate.runtime.tensor import Tensor
from vkdelegate.runtime.values import PooledConstant, pack_key
from vkdelegate.shaders.bindings import bindings_of
from vkdelegate.serialization import vkgraph as g


@dataclass
class Dispatch:
    """One recorded compute dispatch (built by NodeBuilder.dispatch)."""

    node_id: int
    op: str
    pipeline: object
    buffers: list            # memory.Buffer per binding, in binding order
    groups: tuple            # workgroup counts (x, y, z)
    reads: set = field(default_factory=set)   # memory regions read
    writes: set = field(default_factory=set)  # memory regions written
    descriptor_set: object = None
    #: per binding, the texel format of a uniform texel buffer binding, else None
    #: (empty when the dispatch has none)
    formats: tuple = ()
    #: (src Tensor, dst Tensor) when the dispatch only copies src whole into dst
    #: (NodeBuilder.mark_whole_copy): DeviceState may drop it for an in-place state.
    whole_copy: tuple = ()
    #: the slot of its workgroup counts in the graph's indirect buffer (its counts
    #: follow the current sizes: NodeBuilder.dispatch's ``grid``), or -1: ``groups``
    indirect: int = -1


def workgroup_counts(global_size, ls: tuple, limits: tuple) -> list:
    """Workgroup counts (x, y, z) for ``global_size`` invocations in workgroups of
    ``ls``, at least one a dimension; a 1-D count beyond the x limit of ``limits``
    (maxComputeWorkGroupCount) folded into y (``linear_id()`` reads it back)."""
    gs = tuple(global_size) + (1,) * (3 - len(tuple(global_size)))
    groups = [max(1, -(-max(0, int(n)) // l)) for n, l in zip(gs, ls)]
    if groups[0] > limits[0] and groups[1] == 1 and groups[2] == 1:
        rows = -(-groups[0] // limits[0])
        groups = [-(-groups[0] // rows), rows, 1]
    return groups


@dataclass
class ErrorFlag:
    """One node's word in its graph's error-flag buffer (see NodeBuilder.error_flag).

    buffer: the graph's error-flag storage buffer (host-visible, one uint32 per checked
    node, zeroed before every run); bind it by passing the ErrorFlag among a
    dispatch's ``outputs``. slot: this node's word index in it (pass it to the shader,
    e.g. in the op's params). message: ``() -> str`` (or a str) saying what was wrong,
    called when the word was set, after the run (so it may read current sizes).
    """

    buffer: object
    slot: int
    node_id: int
    op: str
    message: object


class NodeBuilder:
    """Gives an op impl access to values, memory and dispatches of one graph.

    Created by DelegateGraph at load; ``node`` is the OperatorCall being built.
    """

    def __init__(self, graph):
        self._graph = graph
        self.device = graph.device
        self.node: g.OperatorCall | None = None
        self._published: dict = {}

    # ---- arguments -------------------------------------------------------------------
    def value(self, vid: int):
        """Value ``vid`` as Python: Tensor, int, float, bool, None, str or list. A
        SymInt (or a list holding SymInts) gives its current number(s): an op whose
        spec lists the argument in ``symbolic_args`` reads it again in its resize
        hooks or plan functions."""
        return self._graph.resolve(vid)

    def option(self, name: str, default):
        """Kernel option ``name`` of this graph (``DelegateGraph(kernel_options=)``,
        from the compile options, e.g. ``sdpa_skip_masked_tiles``), else ``default``."""
        return self._graph.kernel_options.get(name, default)

    def tensor(self, vid: int) -> Tensor:
        """The Tensor with value id ``vid``; VkDelegateError if it is not a tensor."""
        v = self._graph.resolve(vid)
        if not isinstance(v, Tensor):
            raise self.error(f"value {vid} is {type(v).__name__}, expected a tensor")
        return v

    def scalar(self, vid: int):
        """Int/Double/Bool value ``vid`` as int/float/bool (None for Null)."""
        v = self._graph.resolve(vid)
        if isinstance(v, (Tensor, list)):
            raise self.error(f"value {vid} is not a scalar")
        return v

    def set_symint(self, vid: int, value: int) -> None:
        """Set the current number of SymInt value ``vid`` (an op returning a SymInt,
        ops/families/symint.py); the nodes after it read it through ``value``."""
        self._graph.values.set_symint(vid, value)

    def int_list(self, vid: int) -> list[int]:
        """IntList value ``vid`` (Null gives an empty list)."""
        v = self._graph.resolve(vid)
        if v is None:
            return []
        if not isinstance(v, list) or any(not isinstance(x, int) for x in v):
            raise self.error(f"value {vid} is not a list of ints")
        return v

    def error(self, message: str, limit: bool = False) -> VkDelegateError:
        """A VkDelegateError naming the node being built; with ``limit`` a
        DeviceLimitError (the node is valid but over a limit of this device)."""
        return (DeviceLimitError if limit else VkDelegateError)(f"{self._where()}: {message}")

    def _where(self) -> str:
        """The node being built, as errors name it (its op name escaped: it comes from
        the blob), or "graph"."""
        return node_label(self.node.node_id, self.node.name) if self.node else "graph"

    # ---- memory ----------------------------------------------------------------------
    def temporary(self, shape, dtype: str) -> Tensor:
        """A new device tensor of ``shape`` and graph dtype ``dtype`` (e.g. scratch).
        Its sizes derive from the blob's declared ones, so a crafted blob may ask for a
        large one: ResourceLimitError when it is over the graph's
        ``LoadLimits.max_tensor_bytes``."""
        limits = getattr(self._graph, "limits", None)
        if limits is not None:
            nbytes = Tensor.nbytes_for(device_dtype(dtype, self.device.info), shape)
            check_limit(f"scratch tensor {dtype}{list(shape)} in bytes", nbytes,
                        limits.max_tensor_bytes, "max_tensor_bytes", self._where())
        return self._graph.values.new_tensor(-1, dtype, shape)

    def zeroed(self, shape, dtype: str) -> Tensor:
        """``temporary(shape, dtype)`` holding zeros from the load on: for a shader's
        own counters (atomic counts that the shader itself returns to zero before its
        dispatch ends, such as sdpa_decode_lanes.glsl's LAST_MERGE). Same limits and
        errors as ``temporary``."""
        t = self.temporary(shape, dtype)
        self._graph.values.upload(t, np.zeros(tuple(shape), dtype))
        return t

    def publish(self, key: tuple, t: Tensor) -> None:
        """Offer ``t``, which the node being built writes on every run, to the later
        nodes of this graph under ``key`` (a tuple naming what it holds by value ids of
        this node's own outputs, e.g. ``("q8x", scale, zero point)``: 8da4w's
        activation rows quantized once by its qparams' dispatch,
        kernels/quantized_x.py). A node finding it (``published``) may read it instead
        of computing the same values itself, after checking that its sizes cover what
        it reads (a crafted blob may pair the key's values with other data: it then
        reads other values, never out of bounds); one that does not is unaffected."""
        self._published[key] = t

    def published(self, key: tuple) -> "Tensor | None":
        """What an earlier node of this graph published under ``key``, else None."""
        return self._published.get(key)

    def constant_array(self, t: Tensor) -> np.ndarray | None:
        """The host copy (graph dtype, shaped) of a constant tensor, else None."""
        return self._graph.values.constant_arrays.get(t.value_id)

    def prepacked(self, array: np.ndarray, dtype: str | None = None) -> Tensor:
        """Upload ``array`` (already in the layout the shader wants) as a new constant
        tensor of graph dtype ``dtype`` (default: the array's) and return it."""
        array = np.asarray(array)
        values = self._graph.values
        t = values.new_tensor(-1, dtype or array.dtype.name, array.shape, constant=True)
        values.upload(t, array)
        return t

    def repacked(self, t: Tensor, array: np.ndarray, dtype: str | None = None) -> Tensor:
        """``prepacked(array, dtype)`` for an array that is constant ``t`` in another
        layout, written over t's own device buffer where that loses nothing: this node
        is t's only reader (one argument of one node of the graph; not a graph output)
        and the array, stored as ``dtype``, fits t's buffer. The device then holds the
        constant once; t itself must not be bound any more (its host copy,
        ``constant_array``, keeps the original). Otherwise (and for a constant of
        the program's pool) a new constant, as ``prepacked``. Returns the tensor to
        bind: the array's shape and dtype."""
        array = np.asarray(array)
        dtype = dtype or array.dtype.name
        values = self._graph.values
        if not (t.constant and self._sole_reader(t.value_id)) \
                or isinstance(t, PooledConstant):  # other graphs read its buffer
            return self.prepacked(array, dtype)
        ddt = device_dtype(dtype, self.device.info)
        if Tensor.nbytes_for(ddt, array.shape) > t.buffer.size:
            return self.prepacked(array, dtype)
        packed = Tensor(-1, dtype, ddt, array.shape, t.buffer,
                        values.new_meta(f"metadata of {t.name} repacked"), constant=True)
        values.upload(packed, array)
        return packed

    def packed_constant(self, t: Tensor, pack: Callable[[np.ndarray], np.ndarray],
                        dtype: str | None = None) -> Tensor:
        """Constant ``t`` in the layout a shader wants: ``pack(constant_array(t))``
        stored as graph dtype ``dtype`` (default: the packed array's), the Tensor to
        bind (the packed array's shape). pack: a module-level function of the array, or
        a functools.partial of one whose other arguments are ints, floats, bools,
        strings or tuples of them; with t's bytes they name the layout. Where t is in
        the program's constant pool (runtime/constant_pool.py) the packed copy is
        pooled under that name, so the graphs of all methods share one device copy
        per layout, packed once, and t's stored layout takes no device memory unless
        some dispatch binds it; otherwise ``repacked`` (over t's own buffer when this
        node is its only reader). TypeError for a ``pack`` that cannot name a layout
        (a lambda or closure)."""
        values = self._graph.values
        entry = values.packed_constant(t, pack, dtype)
        if entry is None:
            pack_key(pack)  # the same contract with or without a pool
            return self.repacked(t, pack(self.constant_array(t)), dtype)
        return Tensor(-1, entry.dtype, entry.device_dtype, entry.shape, entry.buffer,
                      values.new_meta(f"metadata of {t.name} packed"), constant=True)

    def _sole_reader(self, vid: int) -> bool:
        """Whether value ``vid`` is read by this node alone, once, and is no graph
        output (ValueList arguments counted by their items)."""
        graph = self._graph.graph
        if vid < 0 or vid in graph.output_ids:
            return False
        uses = 0
        for call in graph.chain:
            for a in call.args:
                item = graph.values[a] if 0 <= a < len(graph.values) else None
                if isinstance(item, g.ValueList):
                    uses += sum(1 for i in item.items if i == vid)
                elif a == vid:
                    uses += 1 if call is self.node else 2
        return uses == 1

    def params(self, data: bytes, what: str = "") -> ParamBuffer:
        """An op-owned uniform buffer holding ``data`` (std140 bytes, see params.py)."""
        return self._graph.values.new_params(
            data, what or f"params of node {self.node.node_id}")

    def on_resize(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` after every resize walk (to rewrite op-owned buffers that
        depend on sizes). Tensor metadata never needs a hook."""
        self._graph.resize_hooks.append(hook)

    def error_flag(self, message) -> ErrorFlag:
        """This node's word in the graph's error-flag buffer, for input errors only the
        shader can see (ATen raises, e.g. an index out of range). A shader that finds
        one sets the word non-zero (``atomicOr``); after the fence wait of that run the
        graph raises VkDelegateError "node N (op): <message>". message: str or
        ``() -> str``. Calling it twice for one node returns the same word.
        """
        return self._graph.error_flag(self.node, message)

    def texel_input(self, t: Tensor, fmt: str) -> bool:
        """Whether a dispatch may read tensor ``t`` as a uniform texel buffer of format
        ``fmt`` (a key of shaders.bindings.TEXEL_FORMATS) on this device: CPU drivers
        (``Device.texel_inputs``) whose format and limits allow a view of t's whole
        buffer (runtime.texel.unfit). The op then picks the variant declaring that
        input a texel binding; otherwise its storage-buffer form. Decided at load,
        for t's upper-bound size (a resize never outgrows the view)."""
        return texel.unfit(self.device, t.buffer, fmt) is None

    # ---- dispatches ------------------------------------------------------------------
    def local_size_1d(self, invocations: int) -> tuple:
        """Workgroup size for a 1-D dispatch of ``invocations`` (upper bound).

        Small grids get 64 (a multiple of every common subgroup size, 32 or 64) so
        that few invocations idle; large ones get 256, which amortizes per-workgroup
        cost; always within the device's workgroup limits. "Large" starts at 65536
        invocations on GPUs and at 4096 on CPU drivers (lavapipe runs a workgroup as
        one job of SIMD loops: each workgroup costs a fixed host-side overhead, and
        idle invocations cost nothing; aten.relu of 8192 fp32 values 101 -> 52 us).
        """
        info = self.device.info
        large = 1 << 12 if info.type == "cpu" else 1 << 16
        size = 64 if invocations <= large else 256
        size = min(size, info.max_workgroup_size[0], info.max_workgroup_invocations)
        return (max(size, 1), 1, 1)

    def dispatch(self, shader: str, defines: dict, outputs: list, inputs: list,
                 params: list, global_size, local_size=(64, 1, 1),
                 spec_constants: tuple = (), grid=None) -> None:
        """Declare one dispatch of shader variant (``shader``, ``defines``).

        Bindings, numbered from 0: ``outputs`` (Tensors written, storage buffers), then
        ``inputs`` (Tensors read; uniform texel buffers where the variant declares
        them so, ``texel_input`` having said the tensor can be), then ``params``
        (ParamBuffers, e.g. ``t.meta``, as uniform buffers, or readonly storage
        buffers on a device with ``params_in_storage``), in the order of the variant's
        declared bindings (``shaders.bindings.shader_bindings``; VkDelegateError naming
        them when the counts differ or a parameter buffer is smaller than its block).
        global_size: invocations (x, y, z), sized for the upper-bound shapes; the grid
        is rounded up to whole workgroups, so shaders bounds-check.
        A 1-D global size beyond the device's workgroup-count limit is folded into y
        (read it back with ``linear_id()`` from common.h). An ErrorFlag among
        ``outputs`` binds the error-flag buffer there. local_size: workgroup size,
        passed as specialization constants 0..2; spec_constants: ints for ids 3...
        grid: ``() -> global size`` for the CURRENT sizes (read after every resize,
        as parameter hooks are; each extent at most global_size's): on a device with
        ``indirect_dispatch`` the dispatch then runs that many workgroups
        (vkCmdDispatchIndirect; a 1-D grid folded alike), so a graph resized below
        its bounds does not pay for workgroups that would only bounds-check; the
        shader must not depend on the grid's extent beyond ``linear_id()``.
        """
        ls = tuple(local_size) + (1,) * (3 - len(tuple(local_size)))
        limits = tuple(self.device.info.max_workgroup_count)
        groups = workgroup_counts(global_size, ls, limits)
        if any(n > lim for n, lim in zip(groups, limits)) or \
                math.prod(ls) > self.device.info.max_workgroup_invocations:
            raise self.error(f"dispatch of {shader} with {groups} workgroups of {list(ls)} "
                             f"exceeds this device's compute limits", limit=True)
        for t in outputs:
            if getattr(t, "constant", False):  # pooled constants are other graphs' too
                raise self.error(f"dispatch of {shader} writes constant {t.name}")
        declared = self._check_bindings(shader, defines, outputs, inputs, params)
        formats = (None,) * len(outputs) + tuple(
            declared.texel_format(name) for name in declared.inputs) + (None,) * len(params)
        for t, fmt in zip(inputs, formats[len(outputs):]):
            if fmt is not None:  # created now: a view the device refuses fails the load
                self._graph.allocator.texel_view(t.buffer, fmt)
        param_type = STORAGE if self.device.params_in_storage else UNIFORM
        types = tuple(TEXEL if f is not None else STORAGE
                      for f in formats[:len(outputs) + len(inputs)]) + \
            (param_type,) * len(params)
        pipeline = self.device.pipelines.get(shader, defines, types,
                                             ls + tuple(spec_constants))
        buffers = [t.buffer for t in outputs] + [t.buffer for t in inputs] + \
                  [p.buffer for p in params]
        indirect = -1
        if grid is not None and getattr(self.device, "indirect_dispatch", False):
            bound = tuple(groups)
            where = node_label(self.node.node_id, self.node.name) if self.node else shader

            # Holds no builder or graph (the graph holds it: no reference cycle).
            def current() -> tuple:
                now = workgroup_counts(grid(), ls, limits)
                if any(n > lim for n, lim in zip(now, limits)) or \
                        math.prod(now) > math.prod(bound):
                    raise VkDelegateError(f"{where}: grid {now} of {shader} past its "
                                          f"bound {bound}")
                return now
            indirect = self._graph.indirect_slot(current)
        self._graph.dispatches.append(Dispatch(
            node_id=self.node.node_id if self.node else -1,
            op=self.node.name if self.node else shader,
            pipeline=pipeline, buffers=buffers, groups=tuple(groups),
            formats=formats if any(formats) else (),
            reads={t.buffer.region for t in inputs},
            # Error-flag words are only set (atomicOr, order-free) and read by the host
            # after the final barrier: they need no barrier between dispatches.
            writes={t.buffer.region for t in outputs if not isinstance(t, ErrorFlag)},
            indirect=indirect))


    def mark_whole_copy(self, src: Tensor, dst: Tensor) -> None:
        """Say that the last dispatch copies ``src`` whole into ``dst`` (same dtype and
        sizes) and does nothing else, as a functional update does before writing its
        region (ops/families/cache_update.py). A graph keeping ``src`` as device
        state whose new value is ``dst`` may then drop the copy and let ``dst`` live in
        the state's memory (``DeviceState.bind_state``: the update runs in place)."""
        last = self._graph.dispatches[-1]
        if src.buffer.region in last.reads and dst.buffer.region in last.writes:
            last.whole_copy = (src, dst)

    def _check_bindings(self, shader: str, defines: dict, outputs, inputs, params):
        """The buffers of a dispatch against the variant's declared bindings; returns
        those Bindings."""
        declared = bindings_of(shader, defines)
        got = (len(outputs), len(inputs), len(params))
        want = (len(declared.outputs), len(declared.inputs), len(declared.params))
        if got != want:
            raise self.error(f"dispatch of {shader} binds {got[0]} outputs, {got[1]} "
                             f"inputs, {got[2]} parameter blocks; the variant declares "
                             f"{declared.names()}")
        for block, param in zip(declared.params, params):
            if param.buffer.size < block.size:
                raise self.error(f"dispatch of {shader}: {param.what} has "
                                 f"{param.buffer.size} bytes, block {block.name} needs "
                                 f"{block.size}")
        return declared
