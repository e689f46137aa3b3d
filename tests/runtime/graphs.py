"""Building small VkGraphs by hand for runtime tests (no torch, no serializer)."""
from __future__ import annotations

import numpy as np

from vkdelegate.runtime import DelegateGraph
from vkdelegate.serialization import vkgraph as g
from vkdelegate.serialization.blob import write_blob

_DT = {name: dt for dt, name in g.DTYPE_NAMES.items()}


class GraphMaker:
    """Appends values and nodes; ``build(device)`` returns a DelegateGraph."""

    def __init__(self):
        self.graph = g.VkGraph()
        self.constants: list[bytes] = []

    def _add(self, value) -> int:
        self.graph.values.append(value)
        return len(self.graph.values) - 1

    def tensor(self, shape, dtype="float32", mem_obj_id=-1) -> int:
        return self._add(g.VkTensor(_DT[dtype], list(shape), mem_obj_id=mem_obj_id))

    def input(self, shape, dtype="float32") -> int:
        vid = self.tensor(shape, dtype)
        self.graph.input_ids.append(vid)
        return vid

    def constant(self, array: np.ndarray) -> int:
        self.constants.append(np.ascontiguousarray(array).tobytes())
        self.graph.constants.append(g.VkBytes(0, len(self.constants[-1])))
        return self._add(g.VkTensor(_DT[array.dtype.name], list(array.shape),
                                    constant_id=len(self.constants) - 1))

    def scalar(self, value) -> int:
        if value is None:
            return self._add(g.Null())
        if isinstance(value, bool):
            return self._add(g.Bool(value))
        if isinstance(value, int):
            return self._add(g.Int(value))
        if isinstance(value, float):
            return self._add(g.Double(value))
        if isinstance(value, list):
            return self._add(g.IntList(value))
        raise TypeError(value)

    def op(self, name: str, args: list, out_shape, out_dtype="float32", mem_obj_id=-1) -> int:
        """Append node ``name``; non-int args... are value ids already."""
        out = self.tensor(out_shape, out_dtype, mem_obj_id)
        self.graph.chain.append(g.OperatorCall(len(self.graph.chain), name, list(args) + [out]))
        return out

    def output(self, vid: int) -> None:
        self.graph.output_ids.append(vid)

    def blob(self) -> bytes:
        """The graph as a delegate blob, its constants laid out 16-byte aligned."""
        section = b""
        for i, data in enumerate(self.constants):
            self.graph.constants[i] = g.VkBytes(len(section), len(data))
            section += data + bytes(-len(data) % 16)
        return write_blob(self.graph, section)

    def build(self, device, **options) -> DelegateGraph:
        return DelegateGraph(self.graph, lambda i: self.constants[i], device=device,
                             **options)


def rand(rng, shape, dtype="float32") -> np.ndarray:
    """Seeded random data of ``dtype``: normal floats, full-range small ints."""
    if dtype in ("float32", "float16", "float64"):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)
