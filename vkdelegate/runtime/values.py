"""The values of one graph on the device: tensors, constants and scalars.

``GraphValues`` allocates every VkTensor of a VkGraph (tensors with the same
``mem_obj_id`` alias one region; graph inputs, outputs and constants live in mapped
memory unless the graph uses staging), uploads constants (directly into mapped memory,
else through staging buffers copied once at load), creates each tensor's metadata
uniform buffer, and resolves value ids to Tensors or Python values. It also allocates
what op implementations ask for at load (temporaries, prepacked weights, op-owned
uniform buffers).
"""
from __future__ import annotations

import numpy as np
import vulkan as vk

from vkdelegate.errors import VkDelegateError
from vkdelegate.runtime.commands import run_once
from vkdelegate.runtime.dtypes import device_dtype, to_device
from vkdelegate.runtime.memory import (STAGING_USAGE, UNIFORM_USAGE, Allocator,
                                       tensor_usage)
from vkdelegate.runtime.params import META_BYTES, ParamBuffer
from vkdelegate.runtime.tensor import Tensor
from vkdelegate.serialization import vkgraph as g

NARROW_LAST = "vkdelegate.narrow_last.default"
_SCALARS = {g.Int: "int_val", g.Double: "double_val", g.Bool: "bool_val",
            g.String: "string_val"}


class GraphValues:
    """Device-side values of ``graph`` (see the module docstring).

    allocator: the graph's memory.Allocator. staging: True when inputs, outputs and
    constants are not mapped and go through staging buffers.
    """

    def __init__(self, graph: g.VkGraph, device, allocator, staging: bool):
        self.graph = graph
        self.device = device
        self.allocator = allocator
        self.staging = staging
        self.constant_arrays: dict[int, np.ndarray] = {}
        self._values: dict[int, object] = {}
        # SymInt value id -> its current number (set by the node producing it, at load
        # and after every resize); ValueLists holding SymInts are never cached.
        self.symints: dict[int, int] = {}
        self._live: set[int] = set()
        self._pending_uploads: list = []
        # Staging memory for constant uploads lives only until the copies ran.
        self._upload_allocator = None

    def allocate(self, io_ids, constant_bytes, alias_nodes=frozenset()) -> None:
        """Allocate every VkTensor of the graph and upload the constants.
        alias_nodes: indexes in the chain of the nodes whose op may alias its input
        (``RuntimeOp.may_alias``), for ``_parts``."""
        parts = self._parts(io_ids, alias_nodes)
        groups: dict[int, list[int]] = {}
        for vid, v in enumerate(self.graph.values):
            if isinstance(v, g.VkTensor) and vid not in parts:
                key = v.mem_obj_id if v.mem_obj_id >= 0 and v.constant_id < 0 else -1 - vid
                groups.setdefault(key, []).append(vid)
        for vids in groups.values():
            specs = [self.graph.values[v] for v in vids]
            dtypes = [g.DTYPE_NAMES.get(s.datatype) for s in specs]
            for vid, spec, dt in zip(vids, specs, dtypes):
                if dt is None:
                    raise VkDelegateError(f"tensor {vid} has no dtype (datatype "
                                          f"{int(spec.datatype)})")
            dev_dtypes = [device_dtype(dt, self.device.info) for dt in dtypes]
            host = not self.staging and any(v in io_ids or s.constant_id >= 0
                                            for v, s in zip(vids, specs))
            bufs = self.allocator.aliased(
                [Tensor.nbytes_for(d, s.dims) for d, s in zip(dev_dtypes, specs)],
                tensor_usage(self.device), host, [f"tensor {v}" for v in vids])
            for vid, s, dt, ddt, buf in zip(vids, specs, dtypes, dev_dtypes, bufs):
                t = Tensor(vid, dt, ddt, s.dims, buf, self._meta(f"metadata of tensor {vid}"),
                           constant=s.constant_id >= 0)
                self._values[vid] = t
                if s.constant_id >= 0:
                    self._load_constant(t, s.constant_id, constant_bytes)
        for vid, (src, start) in parts.items():  # in chain order: sources first
            s, parent = self.graph.values[vid], self._values[src]
            dt = g.DTYPE_NAMES.get(s.datatype)
            if dt is None:
                raise VkDelegateError(f"tensor {vid} has no dtype (datatype "
                                      f"{int(s.datatype)})")
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
        if not 0 <= cid < len(self.graph.constants):
            raise VkDelegateError(f"{t.name}: constant_id {cid} out of range "
                                  f"({len(self.graph.constants)} constants)")
        data = constant_bytes(cid)
        expected = t.max_numel * np.dtype(t.dtype).itemsize
        if len(data) != expected:
            raise VkDelegateError(f"{t.name}: constant {cid} has {len(data)} bytes, "
                                  f"{t.dtype} {list(t.max_shape)} needs {expected}")
        array = np.frombuffer(data, dtype=t.dtype).reshape(t.max_shape)
        self.constant_arrays[t.value_id] = array
        self.upload(t, array)

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
        data = to_device(array, t.device_dtype, t.name).reshape(-1)
        if data.size != t.max_numel:
            raise VkDelegateError(f"{t.name}: {data.size} values for {t.max_numel} elements")
        raw = data.view(np.uint8)
        if t.buffer.host is not None:
            t.buffer.host[:raw.size] = raw
            return
        if self._upload_allocator is None:
            self._upload_allocator = Allocator(self.device)
        stage = self._upload_allocator.buffer(t.buffer.size, STAGING_USAGE, True,
                                              f"upload of {t.name}")
        stage.host[:raw.size] = raw
        self._pending_uploads.append((stage, t.buffer))

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
