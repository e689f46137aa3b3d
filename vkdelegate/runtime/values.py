"""The values of one graph on the device: tensors, constants and scalars.

``GraphValues`` allocates every VkTensor of a VkGraph (tensors with the same
``mem_obj_id`` alias one region; graph inputs, outputs and constants live in mapped
memory unless the graph uses staging), uploads constants (directly into mapped memory,
else through staging buffers copied once at load), creates each tensor's metadata
uniform buffer, and resolves value ids to Tensors or Python values. It also allocates
what op implementations ask for at load (temporaries, prepacked weights, op-owned
uniform buffers).

With a ConstantPool (runtime/constant_pool.py) a named constant that is no graph input
or output is a ``PooledConstant``: its device buffer is the pool's, taken at its first
use (``Tensor.buffer``), and its copies in other layouts are the pool's too
(``packed_constant``).
"""
from __future__ import annotations

import functools

import numpy as np
import vulkan as vk

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.commands import run_once
from vkdelegate.runtime.constant_pool import ConstantPool
from vkdelegate.runtime.dtypes import device_dtype, to_device
from vkdelegate.runtime.memory import (STAGING_USAGE, UNIFORM_USAGE, Allocator,
                                       shared_region, tensor_usage)
from vkdelegate.runtime.params import META_BYTES, ParamBuffer
from vkdelegate.runtime.tensor import Tensor
from vkdelegate.serialization import vkgraph as g

NARROW_LAST = "vkdelegate.narrow_last.default"
_SCALARS = {g.Int: "int_val", g.Double: "double_val", g.Bool: "bool_val",
            g.String: "string_val"}


class PooledConstant(Tensor):
    """A constant tensor whose device buffer is a ConstantPool's, made (and its bytes
    uploaded) at the first read of ``buffer``: a constant that every op reads in
    another layout (``GraphValues.packed_constant``) never takes device memory as
    stored. pool_key: its key in the pool; source: its stored bytes."""

    def __init__(self, value_id, dtype, device_dtype, max_shape, meta, values,
                 pool_key, source):
        self._buffer = None
        self._values = values
        self.pool_key, self.source = pool_key, source
        super().__init__(value_id, dtype, device_dtype, max_shape, None, meta,
                         constant=True)

    @property
    def buffer(self):
        if self._buffer is None and self._values is not None:
            self._buffer = self._values.pooled_buffer(self)
        return self._buffer

    @buffer.setter
    def buffer(self, value) -> None:
        self._buffer = value


class GraphValues:
    """Device-side values of ``graph`` (see the module docstring).

    allocator: the graph's memory.Allocator. staging: True when inputs, outputs and
    constants are not mapped and go through staging buffers. pool: the program's
    ConstantPool for this device and staging (attached by the graph), or None: every
    constant in the graph's own memory.
    """

    def __init__(self, graph: g.VkGraph, device, allocator, staging: bool,
                 pool: ConstantPool | None = None):
        self.graph = graph
        self.device = device
        self.allocator = allocator
        self.staging = staging
        self.pool = pool
        # Set by the graph once its load's uploads ran: a pooled buffer made later
        # (PooledConstant.buffer) is uploaded at once, within this timeout.
        self.upload_timeout_s: float | None = None
        self.constant_arrays: dict[int, np.ndarray] = {}
        self._values: dict[int, object] = {}
        # SymInt value id -> its current number (set by the node producing it, at load
        # and after every resize); ValueLists holding SymInts are never cached.
        self.symints: dict[int, int] = {}
        self._live: set[int] = set()
        self._pending_uploads: list = []
        # Staging memory for constant uploads lives only until the copies ran.
        self._upload_allocator = None
        # Pool keys this graph added whose bytes are still queued (staging).
        self._unwritten: list = []
        # id(Buffer) -> the Allocator of its own that holds it: graph inputs and
        # outputs a program may bind to a shared state buffer (own_buffer, free_own).
        self._own: dict = {}

    def allocate(self, io_ids, constant_bytes, alias_nodes=frozenset()) -> None:
        """Allocate every VkTensor of the graph and upload the constants.
        alias_nodes: indexes in the chain of the nodes whose op may alias its input
        (``RuntimeOp.may_alias``), for ``_parts``."""
        parts = self._parts(io_ids, alias_nodes)
        own = self._state_like()
        groups: dict[int, list[int]] = {}
        for vid, v in enumerate(self.graph.values):
            if isinstance(v, g.VkTensor) and vid not in parts and \
                    not self._pooled(vid, v, io_ids, constant_bytes):
                key = v.mem_obj_id if v.mem_obj_id >= 0 and v.constant_id < 0 else -1 - vid
                groups.setdefault(key, []).append(vid)
        for vids in groups.values():
            specs = [self.graph.values[v] for v in vids]
            dtypes = [_dtype_of(vid, spec) for vid, spec in zip(vids, specs)]
            dev_dtypes = [device_dtype(dt, self.device.info) for dt in dtypes]
            host = not self.staging and any(v in io_ids or s.constant_id >= 0
                                            for v, s in zip(vids, specs))
            sizes = [Tensor.nbytes_for(d, s.dims) for d, s in zip(dev_dtypes, specs)]
            if len(vids) == 1 and vids[0] in own and specs[0].constant_id < 0:
                # A state input or output may later live in a shared state buffer
                # (DeviceState.bind_state): memory of its own, freed then.
                bufs = [self.own_buffer(sizes[0], tensor_usage(self.device), host,
                                        f"tensor {vids[0]}")]
            else:
                bufs = self.allocator.aliased(sizes, tensor_usage(self.device), host,
                                              [f"tensor {v}" for v in vids])
            for vid, s, dt, ddt, buf in zip(vids, specs, dtypes, dev_dtypes, bufs):
                t = Tensor(vid, dt, ddt, s.dims, buf, self._meta(f"metadata of tensor {vid}"),
                           constant=s.constant_id >= 0)
                self._values[vid] = t
                if s.constant_id >= 0:
                    self._load_constant(t, s.constant_id, constant_bytes)
        for vid, (src, start) in parts.items():  # in chain order: sources first
            s, parent = self.graph.values[vid], self._values[src]
            dt = _dtype_of(vid, s)
            ddt = device_dtype(dt, self.device.info)
            size, what = Tensor.nbytes_for(ddt, s.dims), f"tensor {vid}"
            buf = None
            if ddt == parent.device_dtype:
                buf = self.allocator.part(parent.buffer,
                                          start * Tensor.nbytes_for(ddt, (1,)), size,
                                          tensor_usage(self.device), what)
            if buf is None:  # memory of its own: its op then copies
                buf = self.allocator.buffer(size, tensor_usage(self.device), False, what)
            self._values[vid] = Tensor(vid, dt, ddt, s.dims, buf,
                                       self._meta(f"metadata of tensor {vid}"))

    def _state_like(self) -> set:
        """Graph inputs and outputs that could be bound as state: an input and an
        output of one dtype and sizes (a mutable buffer's old and new value), each
        with no memory shared with other tensors."""
        values = self.graph.values

        def sig(vid):
            v = values[vid] if 0 <= vid < len(values) else None
            if not isinstance(v, g.VkTensor) or v.mem_obj_id >= 0:
                return None
            return (int(v.datatype), tuple(v.dims))
        ins = {vid: sig(vid) for vid in self.graph.input_ids}
        outs = {vid: sig(vid) for vid in self.graph.output_ids}
        both = (set(ins.values()) & set(outs.values())) - {None}
        return {vid for vid, s in list(ins.items()) + list(outs.items()) if s in both}

    def _parts(self, io_ids, alias_nodes) -> dict[int, tuple[int, int]]:
        """Tensors bound inside another's memory: tensor -> (source tensor, element
        offset), in chain order. The output of a ``vkdelegate.narrow_last`` that memory
        planning put in its input's memory object (a contiguous part: every dim but
        the last 1) lies in that memory at ``start`` elements; the output of a flat
        alias op (view, clone...) of such a tensor, in the same memory object, at its
        source's place. ``allocate`` binds each there (``Allocator.part``), or gives
        it memory of its own where that fails (then the op copies)."""
        values, parts = self.graph.values, {}
        for k, op in enumerate(self.graph.chain):
            if k not in alias_nodes or len(op.args) < 2:
                continue
            src, out = op.args[0], op.args[-1]
            if not all(isinstance(v, int) and 0 <= v < len(values)
                       and isinstance(values[v], g.VkTensor) for v in (src, out)):
                continue
            a, b = values[src], values[out]
            if src == out or out in parts or out in io_ids or b.constant_id >= 0 \
                    or b.mem_obj_id < 0 or a.mem_obj_id != b.mem_obj_id \
                    or a.constant_id >= 0 or a.datatype != b.datatype:
                continue
            if op.name == NARROW_LAST:
                start = values[op.args[1]] if isinstance(op.args[1], int) \
                    and 0 <= op.args[1] < len(values) else None
                if isinstance(start, g.Int) and len(a.dims) == len(b.dims) and a.dims \
                        and all(d == 1 for d in list(a.dims[:-1]) + list(b.dims[:-1])) \
                        and 0 <= start.int_val <= a.dims[-1] - b.dims[-1]:
                    parts[out] = (src, start.int_val)
            elif src in parts:
                parts[out] = (src, 0)
        return parts

    def _load_constant(self, t: Tensor, cid: int, constant_bytes):
        self.upload(t, self._constant_array(t.value_id, t.dtype, t.max_shape, cid,
                                            constant_bytes(cid)))

    def _constant_array(self, vid: int, dtype: str, shape, cid: int, data) -> np.ndarray:
        """Constant ``cid``'s bytes ``data`` as tensor ``vid``'s host array (kept in
        ``constant_arrays``); VkDelegateError when their length is not its size."""
        if not 0 <= cid < len(self.graph.constants):
            raise VkDelegateError(f"tensor {vid}: constant_id {cid} out of range "
                                  f"({len(self.graph.constants)} constants)")
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if len(data) != expected:
            raise VkDelegateError(f"tensor {vid}: constant {cid} has {len(data)} bytes, "
                                  f"{dtype} {list(shape)} needs {expected}")
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
        self.constant_arrays[vid] = array
        return array

    def _pooled(self, vid: int, spec, io_ids, constant_bytes) -> bool:
        """Make tensor ``vid`` a PooledConstant when it can be one (a pool, a named
        constant, no graph input or output); return whether it is."""
        cid = spec.constant_id
        if self.pool is None or cid < 0 or vid in io_ids or cid >= len(self.graph.constants) \
                or not self.graph.constants[cid].is_named:
            return False
        dt = _dtype_of(vid, spec)
        ddt = device_dtype(dt, self.device.info)
        data = constant_bytes(cid)
        self._constant_array(vid, dt, spec.dims, cid, data)
        key = (self.graph.constants[cid].named_key, dt, ddt)
        self._values[vid] = PooledConstant(vid, dt, ddt, spec.dims,
                                           self._meta(f"metadata of tensor {vid}"), self,
                                           key, data)
        return True

    def pooled_buffer(self, t: PooledConstant):
        """The pool's device buffer of constant ``t``, made and uploaded on first use
        (PooledConstant.buffer)."""
        return self._from_pool(t.pool_key, t.source, t.name,
                               lambda: self.constant_arrays[t.value_id], t.dtype).buffer

    def packed_constant(self, t: Tensor, pack, dtype: str | None = None):
        """Constant ``t`` in another layout, ``pack(constant_array(t))`` stored as
        ``dtype``, as the pool's entry (PoolEntry), made on first request and keyed by
        t's key and sizes and ``pack_key(pack)`` (see NodeBuilder.packed_constant).
        None when ``t`` is not pooled."""
        if not isinstance(t, PooledConstant):
            return None
        key = ("packed", t.pool_key, t.max_shape, pack_key(pack), dtype)
        return self._from_pool(key, t.source, f"{t.name} packed",
                               lambda: np.asarray(pack(self.constant_arrays[t.value_id])),
                               dtype)

    def _from_pool(self, key, source, what: str, make, dtype: str | None):
        pool = self.pool
        with pool.lock:
            entry = pool.get(key, source, what)
            if entry is not None:
                return entry
            array = make()
            dt = dtype or array.dtype.name
            ddt = device_dtype(dt, self.device.info)
            entry = pool.add(key, source, array.shape, dt, ddt,
                             Tensor.nbytes_for(ddt, array.shape),
                             tensor_usage(self.device), f"pooled {what}")
            self._write(entry.buffer, ddt, array, what)
            if entry.buffer.host is None:
                self._unwritten.append(key)
            if self.upload_timeout_s is not None:  # after the load: upload now
                try:
                    self.flush_uploads(self.upload_timeout_s)
                except BaseException:
                    self.drop_unwritten()
                    raise
            return entry

    def drop_unwritten(self) -> None:
        """Take the pool entries this graph added out of the pool while their bytes are
        still queued (a load that failed before ``flush_uploads``): no other graph
        may bind a buffer that was never written."""
        if self.pool is not None:
            self.pool.discard(self._unwritten)
        self._unwritten = []

    def own_buffer(self, size: int, usage: int, host_visible: bool, what: str,
                   cached: bool = False):
        """A buffer in memory of its own (an Allocator sized to it), which ``free_own``
        can give back while the graph lives: a graph input or output, or its staging
        buffer, that a shared state buffer may replace."""
        allocator = Allocator(self.device, block_size=max(int(size), 16))
        try:
            buf = allocator.buffer(size, usage, host_visible, what, cached)
        except BaseException:
            allocator.close()
            raise
        buf.region = shared_region()  # unique across allocators (hazard tracking)
        self._own[id(buf)] = (buf, allocator)
        return buf

    def free_own(self, buffer) -> None:
        """Free ``buffer``'s memory if it is one of ``own_buffer``'s (nothing binds it
        any more: its texel views go first); any other buffer is left alone."""
        entry = self._own.pop(id(buffer), None) if buffer is not None else None
        if entry is not None and entry[0] is buffer:
            self.allocator.drop_views(buffer)
            entry[1].close()

    def close_own(self) -> None:
        """Free every ``own_buffer`` (the graph is released; after its allocator,
        whose texel views may view them)."""
        for _, allocator in self._own.values():
            allocator.close()
        self._own = {}

    @property
    def owned_ids(self) -> set:
        """id() of every ``own_buffer`` still held."""
        return set(self._own)

    @property
    def own_bytes(self) -> int:
        """Bytes of device memory the ``own_buffer``s hold."""
        return sum(a.allocated_bytes for _, a in self._own.values())

    def new_meta(self, what: str) -> ParamBuffer:
        """A tensor metadata buffer (TensorMeta), for a Tensor an op makes over existing
        memory (NodeBuilder.repacked)."""
        return self._meta(what)

    def _meta(self, what: str) -> ParamBuffer:
        return ParamBuffer(self.allocator.buffer(META_BYTES, UNIFORM_USAGE, True, what), what)

    def new_tensor(self, vid: int, dtype: str, shape, constant: bool = False) -> Tensor:
        """A tensor outside the VkGraph values (op temporaries, prepacked weights)."""
        ddt = device_dtype(dtype, self.device.info)
        what = "prepacked constant" if constant else "temporary tensor"
        buf = self.allocator.buffer(Tensor.nbytes_for(ddt, shape),
                                    tensor_usage(self.device), constant and not self.staging,
                                    what)
        return Tensor(vid, dtype, ddt, shape, buf, self._meta(f"metadata of {what}"),
                      constant=constant)

    def new_params(self, data: bytes, what: str) -> ParamBuffer:
        """An op-owned uniform buffer initialised with ``data`` (std140 bytes)."""
        p = ParamBuffer(self.allocator.buffer(len(data), UNIFORM_USAGE, True, what), what)
        p.write(data)
        return p

    def upload(self, t: Tensor, array: np.ndarray) -> None:
        """Write ``array`` into ``t`` (directly if mapped, else through staging memory
        copied once before the command buffer is recorded)."""
        array = np.asarray(array)
        if array.size != t.max_numel:
            raise VkDelegateError(f"{t.name}: {array.size} values for {t.max_numel} "
                                  f"elements")
        self._write(t.buffer, t.device_dtype, array, t.name)

    def _write(self, buffer, ddt: str, array: np.ndarray, what: str) -> None:
        raw = to_device(array, ddt, what).reshape(-1).view(np.uint8)
        if raw.size > buffer.size:
            raise VkDelegateError(f"{what}: {raw.size} bytes for a {buffer.size}-byte "
                                  f"buffer")
        if buffer.host is not None:
            buffer.host[:raw.size] = raw
            return
        if self._upload_allocator is None:
            self._upload_allocator = Allocator(self.device)
        stage = self._upload_allocator.buffer(buffer.size, STAGING_USAGE, True,
                                              f"upload of {what}")
        stage.host[:raw.size] = raw
        # A constant repacked over its own buffer (NodeBuilder.repacked) is written
        # twice: only the last copy runs (two copies to one buffer in one submit
        # would need a barrier between them).
        self._pending_uploads = [(s, d) for s, d in self._pending_uploads
                                 if d is not buffer]
        self._pending_uploads.append((stage, buffer))

    def flush_uploads(self, timeout_s: float) -> None:
        """Run the copies queued by ``upload`` for unmapped tensors (once, at load)."""
        if not self._pending_uploads:
            return

        def fill(cmd):
            for src, dst in self._pending_uploads:
                vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1,
                                   [vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=src.size)])
        try:
            run_once(self.device, fill, timeout_s)
            self._unwritten = []
        finally:
            self._pending_uploads = []
            self.close_uploads()

    def close_uploads(self) -> None:
        """Free the upload staging memory (after the copies, or on a failed load)."""
        if self._upload_allocator is not None:
            self._upload_allocator.close()
            self._upload_allocator = None

    def set_symint(self, vid: int, value: int) -> None:
        """Set SymInt value ``vid``'s current number (VkDelegateError if ``vid`` is not
        a SymInt value)."""
        if not isinstance(self.graph.values[vid], g.SymInt):
            raise VkDelegateError(f"value {vid} is "
                                  f"{type(self.graph.values[vid]).__name__}, not a SymInt")
        self.symints[vid] = int(value)

    def resolve(self, vid: int):
        """Value ``vid`` as a Tensor or Python value (see NodeBuilder.value); a SymInt
        as its current number, a ValueList holding SymInts with their current numbers."""
        if vid in self._values:
            return self._values[vid]
        if not isinstance(vid, int) or not 0 <= vid < len(self.graph.values):
            raise VkDelegateError(f"value id {vid} out of range "
                                  f"({len(self.graph.values)} values)")
        v = self.graph.values[vid]
        if isinstance(v, g.SymInt):
            if vid not in self.symints:
                raise VkDelegateError(f"SymInt value {vid} is read before a node sets it")
            return self.symints[vid]
        if isinstance(v, g.ValueList):
            out = [self.resolve(i) for i in v.items]
            if any(i in self._live or isinstance(self.graph.values[i], g.SymInt)
                   for i in v.items):
                self._live.add(vid)
                return out
            self._values[vid] = out
            return out
        if isinstance(v, g.Null):
            out = None
        elif type(v) in _SCALARS:
            out = getattr(v, _SCALARS[type(v)])
        elif isinstance(v, (g.IntList, g.DoubleList, g.BoolList)):
            out = list(v.items)
        else:
            raise VkDelegateError(f"value {vid} has unsupported type {type(v).__name__}")
        self._values[vid] = out
        return out


def _dtype_of(vid: int, spec) -> str:
    """Graph dtype name of VkTensor ``spec`` (value ``vid``); VkDelegateError if its
    datatype is none we know."""
    dt = g.DTYPE_NAMES.get(spec.datatype)
    if dt is None:
        raise VkDelegateError(f"tensor {vid} has no dtype (datatype {int(spec.datatype)})")
    return dt


def pack_key(pack) -> tuple:
    """What names the layout ``pack`` makes (a pool key part): a module-level function's
    qualified name, or a functools.partial of one with its arguments, which must be
    ints, floats, bools, strings or tuples of them. TypeError for anything else (a
    lambda or closure: its captured values would not be part of the key)."""
    args: tuple = ()
    if isinstance(pack, functools.partial):
        args = (pack.args, tuple(sorted(pack.keywords.items())))
        _check_key_args(args, pack)
        pack = pack.func
    if not callable(pack) or getattr(pack, "__closure__", None) or \
            "<" in getattr(pack, "__qualname__", "<"):
        raise TypeError(f"packed_constant needs a module-level function or a "
                        f"functools.partial of one, got {pack!r}")
    return (f"{pack.__module__}.{pack.__qualname__}",) + args


def _check_key_args(value, pack) -> None:
    if isinstance(value, tuple):  # hashable: a list could not be part of a pool key
        for item in value:
            _check_key_args(item, pack)
    elif not isinstance(value, (int, float, bool, str, type(None))):
        raise TypeError(f"packed_constant: argument {value!r} of {pack!r} is not an int, "
                        f"float, bool, string or tuple")
