"""A decode step's rotary cos/sin from a table: one row gather instead of the prelude.

Every decode step of a HF decoder computes the rotary embedding's cos and sin from its
position before the layers: ``position.float() * inv_freq``, ``cat((f, f), -1)``,
``cos``/``sin``, ``* attention_scaling`` and the cast to the model's dtype (6 small
dependent dispatches per step, each a few microseconds of latency on a GPU). Where a
layer's ``vkdelegate.rotary_index_put_pair`` (passes/pair_cache_updates) writes the
keys at ONE position P, a one-element integer tensor (``indices`` = [None, ..., P]
along a cache dim of size S), and its cos and sin are computed from P and constants
alone, this pass computes them at lowering for every position the cache write accepts,
p in -S..S-1, with the graph's own ATen ops on the CPU, one position at a time at the
graph's sizes (eager's values, bit for bit: the float32 math of HF's prelude and its
cast, as HF eager computes them in a decode step on the CPU), into one constant table
of 2 S rows: row p for p >= 0, row 2 S + p for p < 0; cos at the row's start, sin at
the next multiple of ``ALIGN`` bytes. The step then
reads its row with ``aten.index.Tensor(table, [P])`` (negative indices wrap, as the
cache write's do) and takes cos and sin as its ``vkdelegate.narrow_last`` parts (a
one-row part is bound inside the row's memory: no copy) viewed to their sizes: ONE
dispatch. A P outside -S..S-1 is refused by the cache write (the node's error flag);
P in S..2S-1 reads another position's row, but the same step's cache write flags it, so
the run raises either way.

The position computation is what matters, not its form: any chain of deterministic
ATen ops with static sizes from P and constant placeholders matches (transformers
5.25's ``position_ids[..., None].float() * inv_freq`` and 5.17's ``bmm`` of the
expanded inv_freq by the positions alike). Not taken: a prefill's positions (T
rows: ``arange(T) + start_pos``), cos/sin that read anything else (another input, a
state other than P, a random op), tables past ``MAX_ROWS`` rows or ``MAX_ELEMENTS``
elements (a table is a constant, stored in the program file: 2 S x head_dim values).
Runs after pair_cache_updates (which makes the rotary cache writes) and before
fuse_elementwise (the prelude still plain ATen ops), when the registry has
``aten.index.Tensor`` and ``narrow_last``; off with compile option ``rotary_tables``.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops_llm import NARROW_LAST, ROTARY_INDEX_PUT_PAIR
from vkdelegate.ops import registry

aten = torch.ops.aten

#: The most table rows (2 S: positions -S..S-1) computed, one position at a time.
MAX_ROWS = 1 << 16
#: The largest table, in elements.
MAX_ELEMENTS = 1 << 23
#: sin's byte offset in a row is a multiple of this (the largest storage-buffer offset
#: alignment Vulkan allows), so that the runtime can bind both parts inside the
#: gathered row (a misaligned part would be copied: a dispatch).
ALIGN = 256


def _static(v) -> bool:
    return isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape)


def _position(indices) -> "tuple[int, torch.fx.Node] | None":
    """(dim, P) of an indices list holding one one-element integer tensor, else None."""
    if not isinstance(indices, (list, tuple)):
        return None
    found = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(found) != 1 or not isinstance(found[0][1], torch.fx.Node):
        return None
    dim, pos = found[0]
    v = pos.meta.get("val")
    if not _static(v) or v.numel() != 1 or v.dtype not in (torch.int64, torch.int32):
        return None
    return dim, pos


def _slice(pg, outputs, pos) -> "list | None":
    """The nodes computing ``outputs`` from ``pos`` and constants, in graph order
    (``pos`` and the constants excluded), or None when they read anything else, hold
    an op that is not a deterministic ATen op with static sizes, or do not read
    ``pos``."""
    seen, stack, uses_pos = set(), list(outputs), False
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        if node is pos:
            uses_pos = True
            continue
        if node.op == "placeholder":
            if node.name not in pg.constants:
                return None
            continue
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) \
                or target.namespace != "aten" \
                or torch.Tag.nondeterministic_seeded in target.tags \
                or not _static(node.meta.get("val")):
            return None
        seen.add(node)
        stack.extend(node.all_input_nodes)
    if not uses_pos:
        return None
    order = {n: i for i, n in enumerate(pos.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def sin_offset(numel: int, dtype: torch.dtype) -> int:
    """Where sin starts in a table row (elements): cos's ``numel`` rounded up to
    ``ALIGN`` bytes."""
    item = torch.empty((), dtype=dtype).element_size()
    return -(-numel * item // ALIGN) * ALIGN // item


def _table(pg, nodes, pos, cos, sin, rows: int) -> "torch.Tensor | None":
    """[rows, sin_offset + numel(sin)]: row r the values of cos (flattened, from 0) and
    sin (from ``sin_offset``; zeros between) at position r (r < rows / 2) or r - rows,
    computed by ``nodes`` on the CPU."""
    pv, cv, sv = (n.meta["val"] for n in (pos, cos, sin))
    half = rows // 2
    at = sin_offset(cv.numel(), cv.dtype)
    out = torch.zeros((rows, at + sv.numel()), dtype=cv.dtype)
    constants = {n.name: pg.constants[n.name] for node in nodes
                 for n in node.all_input_nodes if n.op == "placeholder" and n is not pos}
    for r in range(rows):
        env = dict(constants)
        env[pos.name] = torch.full(tuple(pv.shape), r if r < half else r - rows,
                                   dtype=pv.dtype)
        for node in nodes:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                                 lambda n: env[n.name])
            env[node.name] = node.target(*args, **kwargs)
        c, s = env[cos.name], env[sin.name]
        for got, want in ((c, cv), (s, sv)):
            if not isinstance(got, torch.Tensor) or got.dtype != want.dtype \
                    or tuple(got.shape) != tuple(want.shape):
                return None
        out[r, :cv.numel()] = c.reshape(-1)
        out[r, at:] = s.reshape(-1)
    return out


def _call(graph, target, args, val):
    node = graph.call_function(target, args)
    node.meta["val"] = val
    return node


def rotary_tables(pg) -> bool:
    """Replace the cos/sin prelude of rotary cache writes at one position by a table
    row (module docstring); True if any."""
    options = getattr(pg, "options", None)
    if options is not None and not getattr(options, "rotary_tables", True):
        return False
    ops = registry.load_all()
    if not {ROTARY_INDEX_PUT_PAIR.name, NARROW_LAST.name, "aten.index.Tensor"} <= set(ops):
        return False
    graph = pg.gm.graph
    rotary, narrow = ROTARY_INDEX_PUT_PAIR.overload(), NARROW_LAST.overload()
    made: dict = {}  # (cos, sin, P, rows) -> (cos', sin') nodes, or None
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not rotary or node.kwargs:
            continue
        _q, _k, cos, sin, cache, _cache2, indices, _v = node.args
        found = _position(indices)
        cv, sv, xv = (getattr(a, "meta", {}).get("val") for a in (cos, sin, cache))
        if found is None or not all(_static(v) for v in (cv, sv, xv)) \
                or cv.dtype != sv.dtype or not cv.dtype.is_floating_point:
            continue
        dim, pos = found
        rows = 2 * xv.shape[dim]
        key = (cos, sin, pos, rows)
        if key not in made:
            made[key] = None
            nodes = _slice(pg, [cos, sin], pos)
            if nodes is None or rows == 0 or rows > MAX_ROWS \
                    or rows * (cv.numel() + sv.numel()) > MAX_ELEMENTS:
                continue
            with torch.no_grad():
                table = _table(pg, nodes, pos, cos, sin, rows)
            if table is None:
                continue
            nc, ns = cv.numel(), sv.numel()
            const = pg.add_constant("rotary_cos_sin_table", table)
            tv = const.meta["val"]
            with graph.inserting_before(node):
                index = pos
                if pos.meta["val"].dim() != 1:
                    index = _call(graph, aten.view.default, (pos, [1]),
                                  pos.meta["val"].reshape(1))
                row = _call(graph, aten.index.Tensor, (const, [index]),
                            tv.new_empty((1, table.shape[1])))
                parts = []
                for start, n, val in ((0, nc, cv), (sin_offset(nc, cv.dtype), ns, sv)):
                    part = _call(graph, narrow, (row, start, n), tv.new_empty((1, n)))
                    parts.append(_call(graph, aten.view.default, (part, list(val.shape)),
                                       val))
            made[key] = tuple(parts)
        if made[key] is None:
            continue
        new_cos, new_sin = made[key]
        node.args = (*node.args[:2], new_cos, new_sin, *node.args[4:])
        changed = True
    return changed
