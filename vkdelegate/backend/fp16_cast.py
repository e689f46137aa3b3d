"""force_fp16 on a built VkGraph: float32 tensors become float16, except those of the
nodes that must stay float32 (``fp16_ranges.fp32_nodes``); casts join the two.

Every float32 tensor gets a *home* dtype: the dtype of its producer's node (float32
for a kept node, float16 otherwise); an input or constant is homed float32 when any
kept node reads it, else float16. A node that needs a tensor in the other dtype reads
a *twin*: for a constant, a second constant converted at lowering; otherwise the
output of an ``aten._to_copy`` node inserted before the first node that needs it
(carrying that node's ``node_id``). So every node sees its float tensors in one dtype,
the combinations the fp32 graph already had (kept) or the all-fp16 one, and the glue
casts only inputs and outputs homed float16. Memory is planned again afterwards.
Torch-free.
"""
from __future__ import annotations

import hashlib

import numpy as np

from vkdelegate.errors import VkDelegateError
from vkdelegate.ops.registry import alias_ops
from vkdelegate.serialization import vkgraph as vk
from vkdelegate.serialization.graph_checks import check_graph
from vkdelegate.serialization.memory_planning import plan_memory

F32, F16 = vk.VkDataType.FLOAT32, vk.VkDataType.FLOAT16


class _Rewrite:
    def __init__(self, graph: vk.VkGraph, named_data: dict, keep_ids: set):
        self.graph, self.named_data, self.keep_ids = graph, named_data, keep_ids
        self.fp32 = {vid for vid, v in enumerate(graph.values)
                     if isinstance(v, vk.VkTensor) and v.datatype == F32}
        self.twins: dict = {}   # (vid, dtype) -> twin vid
        self.extra: dict = {}   # shared scalar values added here, by key
        self.half_ids: dict = {}  # float32 constant entry -> its float16 entry

    def tensors(self, vid: int) -> list[int]:
        value = self.graph.values[vid]
        return list(value.items) if isinstance(value, vk.ValueList) else [vid]

    def homes(self) -> dict:
        """float32 tensor id -> home dtype (see the module docstring)."""
        home, read_by_kept = {}, set()
        for op in self.graph.chain:
            kept = op.node_id in self.keep_ids
            for vid in op.args[:-1]:
                if kept:
                    read_by_kept.update(self.tensors(vid))
            for vid in self.tensors(op.args[-1]):
                home.setdefault(vid, F32 if kept else F16)
        for vid in self.fp32:
            home.setdefault(vid, F32 if vid in read_by_kept else F16)
        return {vid: home[vid] for vid in self.fp32}

    def _add(self, value) -> int:
        self.graph.values.append(value)
        return len(self.graph.values) - 1

    def _scalar(self, key, make) -> int:
        if key not in self.extra:
            self.extra[key] = self._add(make())
        return self.extra[key]

    def _half_constant(self, cid: int) -> int:
        """Id of a new constant entry holding constant ``cid``'s float32 bytes as
        float16. Entry ``cid`` itself stays: the builder shares an entry between
        tensors with equal bytes, which may be of another dtype or homed float32."""
        if cid not in self.half_ids:
            ref = self.graph.constants[cid]
            if not ref.is_named:
                raise VkDelegateError("force_fp16 needs named constants")
            data = np.frombuffer(self.named_data[ref.named_key], np.float32)
            half = data.astype(np.float16).tobytes()
            key = hashlib.sha256(half).hexdigest()
            self.named_data[key] = half
            self.graph.constants.append(vk.VkBytes(vk.NAMED_OFFSET, len(half), key))
            self.half_ids[cid] = len(self.graph.constants) - 1
        return self.half_ids[cid]

    def drop_unused_constants(self) -> None:
        """Remove constant entries no tensor refers to (renumbering the others)."""
        graph = self.graph
        tensors = [v for v in graph.values if isinstance(v, vk.VkTensor)]
        used = sorted({t.constant_id for t in tensors if t.constant_id >= 0})
        new_id = {old: new for new, old in enumerate(used)}
        graph.constants = [graph.constants[old] for old in used]
        for t in tensors:
            if t.constant_id >= 0:
                t.constant_id = new_id[t.constant_id]
        keys = {ref.named_key for ref in graph.constants if ref.is_named}
        self.named_data = {k: v for k, v in self.named_data.items() if k in keys}

    def twin(self, vid: int, dtype, op: vk.OperatorCall, chain: list) -> int:
        """``vid`` in ``dtype`` (a converted constant or a cast appended to ``chain``)."""
        if (vid, dtype) in self.twins:
            return self.twins[(vid, dtype)]
        src = self.graph.values[vid]
        t = vk.VkTensor(dtype, list(src.dims), storage_type=src.storage_type,
                        memory_layout=src.memory_layout)
        if src.constant_id >= 0:
            # The source keeps float32 bytes; a float16 twin gets its own constant.
            t.constant_id = self._half_constant(src.constant_id)
            out = self._add(t)
        else:
            out = self._add(t)
            null = self._scalar("Null", vk.Null)
            code = self._scalar(("Int", int(dtype)), lambda: vk.Int(int(dtype)))
            false = self._scalar(("Bool", False), lambda: vk.Bool(False))
            # _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking,
            # memory_format) -> out, as the builder writes it.
            chain.append(vk.OperatorCall(op.node_id, "aten._to_copy.default",
                                         [vid, code, null, null, null, false, null, out]))
        self.twins[(vid, dtype)] = out
        return out

    def arg(self, vid: int, want, home: dict, op, chain: list) -> int:
        value = self.graph.values[vid]
        if isinstance(value, vk.ValueList):
            items = [self.arg(i, want, home, op, chain) for i in value.items]
            return vid if items == value.items else self._add(vk.ValueList(items))
        if vid in home and home[vid] != want:
            return self.twin(vid, want, op, chain)
        return vid

    def run(self) -> tuple[list, list]:
        graph = self.graph
        home = self.homes()
        chain = []
        for op in graph.chain:
            want = F32 if op.node_id in self.keep_ids else F16
            args = [self.arg(vid, want, home, op, chain) for vid in op.args[:-1]]
            chain.append(vk.OperatorCall(op.node_id, op.name, args + [op.args[-1]]))
        graph.chain = chain
        for vid, dtype in home.items():
            tensor = graph.values[vid]
            if dtype == F16:
                tensor.datatype = F16
                if tensor.constant_id >= 0:
                    tensor.constant_id = self._half_constant(tensor.constant_id)
        self.drop_unused_constants()
        casts_in = ["float16" if home.get(v) == F16 else None for v in graph.input_ids]
        casts_out = ["float32" if home.get(v) == F16 else None for v in graph.output_ids]
        return casts_in, casts_out


def apply_force_fp16(graph: vk.VkGraph, named_data: dict, keep_ids: set,
                     planned: bool) -> tuple[dict, list, list]:
    """Rewrite ``graph`` (in place) for force_fp16.

    named_data: the delegate's named constants (key -> float32 bytes for float32
        tensors); keep_ids: ``OperatorCall.node_id`` of the nodes that stay float32;
        planned: whether the graph's memory was planned (it is planned again).
    Returns (named_data, input casts, output casts): the constants in use (float16
    ones added), and per graph input/output the dtype the glue casts it to, or None.
    Raises VkDelegateError for a constant stored inline (force_fp16 converts named
    constants only).
    """
    rewrite = _Rewrite(graph, dict(named_data), set(keep_ids))
    casts_in, casts_out = rewrite.run()
    if planned:
        plan_memory(graph, alias_ops())
    check_graph(graph)
    return rewrite.named_data, casts_in, casts_out
