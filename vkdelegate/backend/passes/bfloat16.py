"""bfloat16 programs compute in float32: Vulkan compute has no portable bf16 arithmetic
(issue 11: "run as fp32 on devices without bf16 arithmetic, cast at the boundary").

A bf16 model (``model.to(torch.bfloat16)``) has bf16 weights, inputs, outputs and
intermediates, none of which an op family accepts. This pass rewrites the graph so that:

- bf16 constants (parameters, buffers never mutated, lifted constants) are converted
  to float32 at lowering, exactly (every bf16 value is a float32 value), and stored so;
- every node that computes a bf16 value computes it in float32 (its FakeTensor
  metadata and any ``dtype=torch.bfloat16`` argument become float32; a ``_to_copy`` to
  bf16 of a float32 value becomes a no-op the next pass removes, as does the
  ``_assert_tensor_metadata(dtype=torch.bfloat16)`` export leaves of a ``.to()``);
- bf16 user inputs and mutable state buffers are cast to float32 by ``_to_copy`` nodes
  at the boundary (CPU glue, ``BOUNDARY_REASON``), and every bf16 output (user outputs,
  state and input updates) is cast back to bf16 before it leaves, so callers see
  eager's dtypes.

The results are eager's computation with float32 intermediates: eager rounds every
intermediate to bf16 (8-bit significand, up to 2**-9 relative), this runs without those
roundings and rounds each output once, so the two differ by about 2**-9 relative per
op of eager's chain. Nodes so rewritten carry ``BF16_NOTE`` (``node.meta[NOTE_KEY]``),
which the partitioner puts in the partition report.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

aten = torch.ops.aten

NOTE_KEY = "vkdelegate_bf16_note"
BOUNDARY_KEY = "vkdelegate_bf16_boundary"
BF16_NOTE = "bfloat16 computed as float32 (no bf16 arithmetic on the device)"
BOUNDARY_REASON = ("bfloat16 <-> float32 cast at the delegate boundary (bfloat16 "
                   "programs run in float32 on the device)")


def _is_bf16(val) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16
               for v in pytree.tree_leaves(val))


def _as_float32(val, fake_mode):
    def convert(v):
        if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16:
            if fake_mode is None:
                return v.to(torch.float32)
            with fake_mode:
                return v.to(torch.float32)
        return v
    return pytree.tree_map(convert, val)


def _swap_dtype(value):
    return torch.float32 if value is torch.bfloat16 else value


def _cast(graph, node, dtype, val, fake_mode):
    cast = graph.call_function(aten._to_copy.default, (node,), {"dtype": dtype})
    cast.meta["val"] = val if dtype == torch.bfloat16 else _as_float32(val, fake_mode)
    cast.meta[BOUNDARY_KEY] = True
    return cast


def bfloat16_to_float32(pg) -> bool:
    """Rewrite ``pg`` (a ProgramGraph) from bfloat16 to float32 as the module docstring
    says; True if it held any bf16 value."""
    graph = pg.gm.graph
    vals = [n.meta.get("val") for n in graph.nodes if n.op != "output"]
    if not any(_is_bf16(v) for v in vals):
        return False
    fake_mode = torch._guards.detect_fake_mode(
        [v for v in vals if isinstance(v, torch.Tensor)])
    original = {}  # node -> its bf16 val, for the casts back at the outputs
    for node in list(graph.nodes):
        val = node.meta.get("val")
        if node.target == aten._assert_tensor_metadata.default:
            # What export leaves of a .to(torch.bfloat16) (HF's mask.to(self.dtype)):
            # the value it checks is float32 now, so is the dtype it asserts.
            node.args = pytree.tree_map(_swap_dtype, node.args)
            node.kwargs = pytree.tree_map(_swap_dtype, node.kwargs)
            continue
        if node.op == "output" or not _is_bf16(val):
            continue
        original[node] = val
        if node.op == "placeholder" and node.name in pg.constants:
            pg.constants[node.name] = pg.constants[node.name].to(torch.float32)
            node.meta["val"] = _as_float32(val, fake_mode)
        elif node.op == "placeholder":  # a user input or mutable state: cast after it
            with graph.inserting_after(node):
                cast = _cast(graph, node, torch.float32, val, fake_mode)
            node.replace_all_uses_with(cast, delete_user_cb=lambda user: user is not cast)
        else:
            node.args = pytree.tree_map(_swap_dtype, node.args)
            node.kwargs = pytree.tree_map(_swap_dtype, node.kwargs)
            node.meta["val"] = _as_float32(val, fake_mode)
            node.meta[NOTE_KEY] = BF16_NOTE
    output = graph.output_node()

    def cast_back(arg):
        if isinstance(arg, torch.fx.Node) and arg.meta.get(BOUNDARY_KEY):
            return arg.args[0]  # a bf16 input (or state) returned as it is
        if not isinstance(arg, torch.fx.Node) or arg not in original:
            return arg
        with graph.inserting_before(output):
            return _cast(graph, arg, torch.bfloat16, original[arg], None)
    output.args = pytree.tree_map(cast_back, output.args)
    return True
