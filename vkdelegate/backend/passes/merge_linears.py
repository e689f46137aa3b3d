"""Merge sibling linears (one input, constant weights) into one linear followed by
``vkdelegate.narrow_last`` parts of its output.

In an HF Llama/Qwen2/Mistral/Gemma decoder layer q_proj, k_proj and v_proj read the
same input (the RMS norm's output), and so do gate_proj and up_proj. In a decode step
each is a GEMV whose cost on a GPU is mostly the dispatch's own (~4 us on the H200):
one GEMV over the weights concatenated along N does the work of the group, and larger
GEMVs run nearer the memory bandwidth. A group is the ``aten.linear.default`` nodes
that read one input node x with:

- x float32 or float16 with a static last dim K. Where every dim of x but the last is
  statically 1 (decode's [1, 1, K]) each part of the merged output is a contiguous
  byte range: memory planning gives the narrow_last's output its input's memory
  object and the runtime binds it at the part's offset, so the parts cost no dispatch
  (serialization/memory_planning.py, runtime/values.py). With more rows (prefill's
  [1, T, K], T dynamic) each part is one strided copy, and the gate/up parts none
  (passes/fuse_linear_swiglu takes them into the product). Prefill merges so that it
  reads the same merged constants as decode: the program file deduplicates segments
  by content across methods, so each weight is stored once (left unmerged, prefill's
  separate weights were stored beside decode's merged ones, ~1.6x the parameters;
  tests/llm/test_program_size.py). On lavapipe the merged prefill is a few percent
  faster (docs/LOWERING.md, "Merged sibling linears").
- each weight a constant [N_i, K] placeholder of x's dtype (float32 or float16) that
  nothing else reads (a shared weight would be stored twice), and either every bias a
  constant [N_i] of that dtype read by nothing else, or none;
- at least two such linears.

The merged weight (and bias) is a new constant, the concatenation along N in graph
order; the old ones die with their linears (``drop_unused_constants``). Each output
element is the same K-long dot product as before (the kernels' loop over K does not
depend on N), so the result is bitwise equal to the unmerged lowering where the
merged product takes the same shader form.

torchao's int4 weight-only linears (``et_vk.linear_q4gsw``, made by
passes/quantized_linear, which runs first) merge the same way when they share the
group size and K: packed weights uint8 [N_i, K/2] concatenated along rows, scales
[K/gs, N_i] (the first N_i columns where a blob padded them) along columns, biases
along N. torchao's int8 weight-only linears (``aten._weight_int8pack_mm(x2, w, scales)``
of one 2-D view x2 = [M, K] of x: equal views of one node are made one first, as cse
would later) merge too: int8
weights [N_i, K] along rows, scales [N_i] along N. 8da4w (``et_vk.linear_dq8ca_q4gsw``)
merges like int4 (its per-group weight sums [K/gs, N_i padded to 8] along columns,
padded again) where every member's activation scale and zero point are the
per-token qparams of x itself (torchao's chain, ``quantized_linear.
_choose_qparams_chain``: a function of x alone, so equal): the merged node takes the
first member's, and the others' chains die.
Runs only when the registry has ``aten.linear`` and ``narrow_last``.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops import LINEAR_DQ8CA_Q4GSW, LINEAR_Q4GSW
from vkdelegate.backend.custom_ops_llm import NARROW_LAST
from vkdelegate.backend.passes.quantized_linear import _choose_qparams_chain
from vkdelegate.ops import registry

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float16)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _constant(pg, node, dtype, rank):
    """The tensor of constant placeholder ``node`` of ``dtype`` and ``rank`` that only
    one node reads, else None."""
    if not (isinstance(node, torch.fx.Node) and node.op == "placeholder"
            and node.name in pg.constants and len(node.users) == 1):
        return None
    value = pg.constants[node.name]
    return value if value.dtype == dtype and value.dim() == rank else None


def _mergeable_input(x) -> bool:
    """Whether x is a float32/float16 tensor of rank >= 1 whose last dim is static."""
    val = _val(x)
    return isinstance(val, torch.Tensor) and val.dim() >= 1 and val.dtype in _DTYPES \
        and isinstance(val.shape[-1], int)


def _bias(pg, node, dtype, n):
    """(ok, bias tensor [n] or None) of bias argument ``node`` of an n-output linear:
    a constant of ``dtype`` read only there, at least n long (ExecuTorch pads
    linear_q4gsw's to a multiple of 4: the first n are the linear's)."""
    if node is None:
        return True, None
    bias = _constant(pg, node, dtype, 1)
    if bias is None or bias.shape[0] < n:
        return False, None
    return True, bias[:n]


def _member(pg, node, x):
    """(group key, [tensors to concatenate]) of linear ``node`` of x if it may join a
    group: aten.linear (weight [N, K], bias?) or et_vk.linear_q4gsw (packed weight
    uint8 [N, K/2], scales [K/gs, >= N], group size, bias?); None otherwise."""
    if node.op != "call_function" or node.kwargs or not node.args \
            or node.args[0] is not x:
        return None
    dtype, k = _val(x).dtype, _val(x).shape[-1]
    if node.target == aten.linear.default and len(node.args) <= 3:
        weight = _constant(pg, node.args[1], dtype, 2)
        if weight is None or weight.shape[1] != k or weight.shape[0] == 0:
            return None
        ok, bias = _bias(pg, node.args[2] if len(node.args) > 2 else None, dtype,
                         weight.shape[0])
        return (("linear", bias is not None), [weight, bias]) if ok else None
    if node.target == LINEAR_Q4GSW.overload() and len(node.args) in (4, 5):
        weight = _constant(pg, node.args[1], torch.uint8, 2)
        scales = _constant(pg, node.args[2], dtype, 2)
        group = node.args[3]
        if weight is None or scales is None or not isinstance(group, int) \
                or isinstance(group, bool) or weight.shape[0] == 0 \
                or scales.shape[1] < weight.shape[0]:
            return None
        n = weight.shape[0]
        ok, bias = _bias(pg, node.args[4] if len(node.args) > 4 else None, dtype, n)
        return ((LINEAR_Q4GSW.name, group, tuple(weight.shape[1:]), tuple(scales.shape[:1]),
                 bias is not None), [weight, scales[:, :n], bias]) if ok else None
    if node.target == LINEAR_DQ8CA_Q4GSW.overload() and len(node.args) in (7, 8):
        chain = _choose_qparams_chain(node.args[2])
        weight = _constant(pg, node.args[3], torch.uint8, 2)
        sums = _constant(pg, node.args[4], torch.int32, 2)
        scales = _constant(pg, node.args[5], dtype, 2)
        group = node.args[6]
        if chain is None or chain[0] is not x or chain[1] is not node.args[1] \
                or weight is None or sums is None or scales is None \
                or not isinstance(group, int) or isinstance(group, bool) \
                or weight.shape[0] == 0 or scales.shape[1] < weight.shape[0] \
                or sums.shape[1] < weight.shape[0]:
            return None
        n = weight.shape[0]
        ok, bias = _bias(pg, node.args[7] if len(node.args) > 7 else None, dtype, n)
        return ((LINEAR_DQ8CA_Q4GSW.name, group, tuple(weight.shape[1:]),
                 tuple(scales.shape[:1]), bias is not None),
                [weight, scales[:, :n], bias, sums[:, :n], node.args[1], node.args[2]]) \
            if ok else None
    if node.target == aten._weight_int8pack_mm.default and len(node.args) == 3:
        weight = _constant(pg, node.args[1], torch.int8, 2)
        scales = _constant(pg, node.args[2], dtype, 1)
        if weight is None or scales is None or weight.shape[1] != k \
                or weight.shape[0] == 0 or scales.shape[0] != weight.shape[0]:
            return None
        return ("int8pack",), [weight, scales]
    return None


def _share_quantized_views(graph) -> None:
    """Make equal ``aten.view`` nodes of one input that feed _weight_int8pack_mm,
    linear_dq8ca_q4gsw or 8da4w's per-token amin / amax one node (torchao's int8 and
    8da4w linears each view x as [-1, K], 8da4w's qparams chain once more; an exact
    rewrite, as cse's)."""
    readers = (aten._weight_int8pack_mm.default, LINEAR_DQ8CA_Q4GSW.overload(),
               aten.amin.default, aten.amax.default)
    seen: dict = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.view.default or node.kwargs \
                or not any(u.target in readers for u in node.users):
            continue
        key = (node.args[0], tuple(node.args[1]) if isinstance(node.args[1], (list, tuple))
               else node.args[1])
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)


def _groups(pg):
    """(x, key, [(linear node, tensors)]), one per mergeable group, in graph order."""
    groups = []
    _share_quantized_views(pg.gm.graph)
    for x in pg.gm.graph.nodes:
        if not _mergeable_input(x):
            continue
        by_key: dict = {}
        for n in x.users:
            found = _member(pg, n, x)
            if found is not None:
                by_key.setdefault(found[0], []).append((n, found[1]))
        groups += [(x, key, g) for key, g in by_key.items() if len(g) >= 2]
    return groups


def _merged_args(pg, x, key, group):
    """The merged node's target and args: the group's tensors concatenated along N as
    new constants (named after the first's)."""
    first = group[0][0]

    def cat(i, arg, dim):  # tensors[i], first's argument ``arg``
        parts = [tensors[i] for _, tensors in group]
        if parts[0] is None:
            return None
        return pg.add_constant(f"{first.args[arg].name}_merged",
                               torch.cat(parts, dim).contiguous())
    if key[0] == "linear":
        return aten.linear.default, (x, cat(0, 1, 0), cat(1, 2, 0))
    if key[0] == "int8pack":
        return aten._weight_int8pack_mm.default, (x, cat(0, 1, 0), cat(1, 2, 0))
    if key[0] == LINEAR_DQ8CA_Q4GSW.name:
        sums = torch.cat([tensors[3] for _, tensors in group], 1)
        n8 = -(-sums.shape[1] // 8) * 8
        sums = pg.add_constant(f"{first.args[4].name}_merged", torch.nn.functional.pad(
            sums, (0, n8 - sums.shape[1])).contiguous())
        x_scale, x_zp = group[0][1][4:6]
        return LINEAR_DQ8CA_Q4GSW.overload(), (x, x_scale, x_zp, cat(0, 3, 0), sums,
                                               cat(1, 5, 1), key[1], cat(2, 7, 0))
    return LINEAR_Q4GSW.overload(), (x, cat(0, 1, 0), cat(1, 2, 1), key[1],
                                     cat(2, 4, 0))


def merge_linears(pg) -> bool:
    """Merge each group of sibling linears (module docstring); True if any."""
    ops = registry.load_all()
    if "aten.linear.default" not in ops or NARROW_LAST.name not in ops:
        return False
    narrow = NARROW_LAST.overload()
    graph = pg.gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    changed = False
    for x, key, group in _groups(pg):
        group.sort(key=lambda m: order[m[0]])
        first = group[0][0]
        target, args = _merged_args(pg, x, key, group)
        with graph.inserting_before(first):
            merged = graph.call_function(target, args)
        merged.meta = dict(first.meta)
        n_total = sum(tensors[0].shape[0] for _, tensors in group)
        xv = _val(x)
        merged.meta["val"] = xv.new_empty(tuple(xv.shape[:-1]) + (n_total,))
        start = 0
        for node, tensors in group:
            n = tensors[0].shape[0]
            with graph.inserting_before(node):
                part = graph.call_function(narrow, (merged, start, n))
            part.meta = dict(node.meta)
            node.replace_all_uses_with(part)
            graph.erase_node(node)
            start += n
        changed = True
    return changed
