"""Shared allocations for intermediate tensors: assigns ``VkTensor.mem_obj_id``.

Works on a built VkGraph (no torch). A tensor lives from the op that writes it (it is
that op's output, the last arg, or an item of the output ValueList) to the last op
that reads it. Walking the chain in order, each new tensor takes a memory object that
no live tensor holds (the smallest that fits, else the largest, which then grows) or
a new one; a tensor's object returns to the free pool after its last reader, and only
after that op's own outputs are placed, because an op's output must not alias its
inputs. Inputs, outputs and constants keep dedicated memory (-1): the host reads and
writes them between runs. The one exception to "no aliasing of inputs" is a flat copy
(view, squeeze, unsqueeze, clone: ``alias_ops``), whose output may share its input's
memory: then there is nothing to copy. ``vkdelegate.narrow_last`` (a contiguous part
of its input: rows statically 1) joins its input's memory object the same way; the
runtime binds it at the part's offset.
"""
from __future__ import annotations

from vkdelegate import dtypes
from vkdelegate.serialization import vkgraph as vk

_ITEM_BYTES = {w: dtypes.ITEMSIZE[n] for w, n in vk.DTYPE_NAMES.items()}


def _nbytes(t: vk.VkTensor) -> int:
    n = _ITEM_BYTES.get(t.datatype, 4)
    for d in t.dims:
        n *= d
    return n


def _expand(graph: vk.VkGraph, ids) -> list[int]:
    """``ids`` plus the items of any ValueList among them."""
    out = []
    for vid in ids:
        out.append(vid)
        value = graph.values[vid]
        if isinstance(value, vk.ValueList):
            out.extend(value.items)
    return out


#: The one alias op whose output is a part of its input (at a byte offset the runtime
#: takes from the op's ``start``, runtime/values.py), not all of it.
NARROW_LAST = "vkdelegate.narrow_last.default"


def _contiguous_part(graph: vk.VkGraph, op, a: vk.VkTensor, b: vk.VkTensor) -> bool:
    """Whether narrow_last ``op`` (a -> b) takes one contiguous byte range of ``a``:
    every dim but the last is 1 in both (upper bounds: static) and the part is
    inside a."""
    start = graph.values[op.args[1]] if isinstance(op.args[1], int) else None
    if not isinstance(start, vk.Int) or len(a.dims) != len(b.dims) or not a.dims \
            or any(d != 1 for d in list(a.dims[:-1]) + list(b.dims[:-1])):
        return False
    return 0 <= start.int_val and start.int_val + b.dims[-1] <= a.dims[-1]


def _alias_roots(graph: vk.VkGraph, alias_ops, planned, defined_at) -> dict[int, int]:
    """Tensor -> the tensor whose memory it shares, for each output of an ``alias_ops``
    node (a flat copy: same dtype, same bytes) whose input is planned memory too."""
    root: dict[int, int] = {}
    for k, op in enumerate(graph.chain):
        if op.name not in alias_ops or len(op.args) < 2:
            continue
        src, out = op.args[0], op.args[-1]
        if not (isinstance(src, int) and planned(src) and planned(out)) or src == out \
                or defined_at.get(out) != k or defined_at.get(src, k) >= k:
            continue
        a, b = graph.values[src], graph.values[out]
        if a.datatype != b.datatype:
            continue
        if _nbytes(a) == _nbytes(b) if op.name != NARROW_LAST \
                else _contiguous_part(graph, op, a, b):
            root[out] = root.get(src, src)
    return root


def plan_memory(graph: vk.VkGraph, alias_ops: frozenset = frozenset()) -> int:
    """Sets ``mem_obj_id`` of every intermediate tensor of ``graph`` in place (and -1
    on inputs, outputs and constants). Returns the number of memory objects used.

    alias_ops: names of ops whose output is a flat copy of ``args[0]`` (OpSpec
    ``may_alias``; ``vkdelegate.ops.registry.alias_ops()``). Such an output gets its
    input's memory object when both are intermediates of one dtype and size; the object
    then lives until the last reader of either, and the runtime records no copy for
    the node (the copy would be an identity). This relies on the graph being SSA: no
    op writes a planned tensor it did not produce.
    """
    pinned = set(_expand(graph, graph.input_ids)) | set(_expand(graph, graph.output_ids))
    for vid, value in enumerate(graph.values):
        if isinstance(value, vk.VkTensor):
            value.mem_obj_id = -1
            if value.constant_id >= 0:
                pinned.add(vid)

    def planned(vid: int) -> bool:
        return isinstance(graph.values[vid], vk.VkTensor) and vid not in pinned

    defined_at: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for k, op in enumerate(graph.chain):
        if not op.args:
            continue
        for vid in _expand(graph, op.args[-1:]):
            if planned(vid) and vid not in defined_at:
                defined_at[vid] = k
        for vid in _expand(graph, op.args):
            if planned(vid):
                last_use[vid] = k
    root = _alias_roots(graph, alias_ops, planned, defined_at)
    for vid, r in root.items():
        last_use[r] = max(last_use.get(r, 0), last_use.get(vid, 0))

    sizes: list[int] = []          # per memory object: bytes it must hold
    free: set[int] = set()
    released_at: dict[int, list[int]] = {}
    for k, op in enumerate(graph.chain):
        for vid in (v for v in _expand(graph, op.args[-1:]) if defined_at.get(v) == k):
            tensor = graph.values[vid]
            if vid in root:
                tensor.mem_obj_id = graph.values[root[vid]].mem_obj_id
                continue
            need = _nbytes(tensor)
            fits = [m for m in free if sizes[m] >= need]
            if fits:
                mem = min(fits, key=lambda m: (sizes[m], m))
            elif free:
                mem = max(free, key=lambda m: (sizes[m], -m))
                sizes[mem] = need
            else:
                mem = len(sizes)
                sizes.append(need)
            free.discard(mem)
            tensor.mem_obj_id = mem
            released_at.setdefault(last_use.get(vid, k), []).append(mem)
        free.update(released_at.pop(k, []))
    return len(sizes)
