"""Merge sibling linears (one input, constant weights) into one linear whose output
rows are statically 1, followed by ``vkdelegate.narrow_last`` parts of its output.

In an HF Llama/Qwen2/Mistral/Gemma decoder layer q_proj, k_proj and v_proj read the
same input (the RMS norm's output), and so do gate_proj and up_proj. In a decode step
each is a GEMV whose cost on a GPU is mostly the dispatch's own (~4 us on the H200):
one GEMV over the weights concatenated along N does the work of the group, and larger
GEMVs run nearer the memory bandwidth. A group is the ``aten.linear.default`` nodes
that read one input node x with:

- every dim of x but the last statically 1 (decode's [1, 1, K]), so that each part
  of the merged output is a contiguous byte range: memory planning gives the
  narrow_last's output its input's memory object and the runtime binds it at the
  part's offset, so the parts cost no dispatch (serialization/memory_planning.py,
  runtime/values.py). Where x has more rows (prefill's [1, T, K]) each part would be
  a strided affine copy, one dispatch per part for the two GEMMs saved: not merged.
- each weight a constant [N_i, K] placeholder of x's dtype (float32 or float16) that
  nothing else reads (a shared weight would be stored twice), and either every bias a
  constant [N_i] of that dtype read by nothing else, or none;
- at least two such linears.

The merged weight (and bias) is a new constant, the concatenation along N in graph
order; the old ones die with their linears (``drop_unused_constants``). Each output
element is the same K-long dot product as before (the kernels' loop over K does not
depend on N), so the result is bitwise equal to the unmerged lowering where the
merged product takes the same shader form. torchao's quantized linears
(et_vk.linear_q4gsw, aten._weight_int8pack_mm, et_vk.linear_dq8ca_q4gsw) are not
merged. Runs only when the registry has both ops.
"""
from __future__ import annotations

import torch

from vkdelegate.backend.custom_ops_llm import NARROW_LAST
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


def _one_row(x) -> bool:
    """Whether every dim of x but the last is statically 1 and the last is static."""
    val = _val(x)
    if not isinstance(val, torch.Tensor) or val.dim() < 1 or val.dtype not in _DTYPES:
        return False
    return all(isinstance(s, int) for s in val.shape) and all(s == 1 for s in val.shape[:-1])


def _member(pg, node, x):
    """(weight, bias or None) tensors of linear ``node`` of x if it may join a group."""
    if node.op != "call_function" or node.target != aten.linear.default \
            or node.kwargs or node.args[0] is not x or len(node.args) > 3:
        return None
    dtype, k = _val(x).dtype, _val(x).shape[-1]
    weight = _constant(pg, node.args[1], dtype, 2)
    if weight is None or weight.shape[1] != k or weight.shape[0] == 0:
        return None
    bias_node = node.args[2] if len(node.args) > 2 else None
    if bias_node is None:
        return weight, None
    bias = _constant(pg, bias_node, dtype, 1)
    if bias is None or bias.shape[0] != weight.shape[0]:
        return None
    return weight, bias


def _groups(pg):
    """Lists of (linear node, weight, bias), one per mergeable group, in graph order."""
    groups = []
    for x in pg.gm.graph.nodes:
        if not _one_row(x):
            continue
        members = [(n, *m) for n in x.users if (m := _member(pg, n, x)) is not None]
        with_bias = [m for m in members if m[2] is not None]
        without = [m for m in members if m[2] is None]
        groups += [g for g in (with_bias, without) if len(g) >= 2]
    return groups


def merge_linears(pg) -> bool:
    """Merge each group of sibling one-row linears (module docstring); True if any."""
    ops = registry.load_all()
    if "aten.linear.default" not in ops or NARROW_LAST.name not in ops:
        return False
    narrow = NARROW_LAST.overload()
    graph = pg.gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    changed = False
    for group in _groups(pg):
        group.sort(key=lambda m: order[m[0]])
        first, x = group[0][0], group[0][0].args[0]
        weight = pg.add_constant(f"{first.args[1].name}_merged",
                                 torch.cat([w for _, w, _ in group], 0).contiguous())
        bias = None
        if group[0][2] is not None:
            bias = pg.add_constant(f"{first.args[2].name}_merged",
                                   torch.cat([b for _, _, b in group], 0).contiguous())
        with graph.inserting_before(first):
            merged = graph.call_function(aten.linear.default, (x, weight, bias))
        merged.meta = dict(first.meta)
        xv = _val(x)
        merged.meta["val"] = xv.new_empty(tuple(xv.shape[:-1]) + (weight.meta["val"].shape[0],))
        start = 0
        for node, w, _ in group:
            with graph.inserting_before(node):
                part = graph.call_function(narrow, (merged, start, w.shape[0]))
            part.meta = dict(node.meta)
            node.replace_all_uses_with(part)
            graph.erase_node(node)
            start += w.shape[0]
        changed = True
    return changed
