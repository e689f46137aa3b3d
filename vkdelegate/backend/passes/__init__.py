"""Lowering passes, run on a ProgramGraph before partitioning.

Each pass is a small function ``pass_(pg: ProgramGraph) -> bool`` that returns whether
it changed the graph. ``PASSES`` lists them once, in the order they must run.
"""
from __future__ import annotations

from vkdelegate.backend.passes.as_strided_views import as_strided_views
from vkdelegate.backend.passes.bfloat16 import bfloat16_to_float32
from vkdelegate.backend.passes.cache_positions import cache_positions
from vkdelegate.backend.passes.cse import cse
from vkdelegate.backend.passes.fold_batch_norm import fold_batch_norm
from vkdelegate.backend.passes.fold_constants import fold_constants
from vkdelegate.backend.passes.fold_conv_padding import fold_conv_padding
from vkdelegate.backend.passes.fuse_conv_add import fuse_conv_add
from vkdelegate.backend.passes.fuse_elementwise import fuse_elementwise
from vkdelegate.backend.passes.fuse_linear_add import fuse_linear_add
from vkdelegate.backend.passes.fuse_linear_rotary_cache import fuse_linear_rotary_cache
from vkdelegate.backend.passes.fuse_linear_swiglu import fuse_linear_swiglu
from vkdelegate.backend.passes.fuse_conv_clamp import fuse_conv_clamp
from vkdelegate.backend.passes.fuse_rms_norm import fuse_rms_norm
from vkdelegate.backend.passes.fuse_rms_norm_linear import fuse_rms_norm_linear
from vkdelegate.backend.passes.fuse_rotary import fuse_rotary
from vkdelegate.backend.passes.index_put_values import index_put_values
from vkdelegate.backend.passes.linear import addmm_to_linear
from vkdelegate.backend.passes.merge_linears import merge_linears
from vkdelegate.backend.passes.pair_cache_updates import pair_cache_updates
from vkdelegate.backend.passes.local_symints import local_symints
from vkdelegate.backend.passes.permute_to_view import permute_to_view
from vkdelegate.backend.passes.quantized_embedding import fuse_quantized_embedding
from vkdelegate.backend.passes.quantized_linear import (fuse_choose_qparams,
                                                       fuse_quantized_linear)
from vkdelegate.backend.passes.remove_noops import remove_noop_copies
from vkdelegate.backend.passes.rotary_tables import rotary_tables
from vkdelegate.backend.passes.sdpa_seq_first import sdpa_seq_first
from vkdelegate.backend.passes.symbolic_view_sizes import symbolic_view_sizes
from vkdelegate.backend.passes.unique_index_put import unique_index_put
from vkdelegate.backend.passes.zero_dim_operands import zero_dim_operands

# Order matters:
# 0. bfloat16 -> float32 first: every other pass and the op families see float32 (its
#    no-op _to_copy nodes to bf16 are then removed by 1.);
# 1. no-op clones/copies go first, so that they do not hide the patterns below
#    (a clone between a linear and its batch norm would block the fold);
# 1'. as_strided calls that are views of contiguous tensors -> view (as_strided_views):
#    early, so that every pattern pass sees a plain view;
# 1''. 0-d operands of another dtype of the result's category -> an explicit cast
#    (zero_dim_operands), after the no-op removal (its casts are not no-ops) and
#    before fold_constants, which folds the casts of constants;
# 1b. quantized linears and embeddings (torchao's dequantize chains) before addmm ->
#    linear, which would otherwise see a permute of a dequantized weight as a plain
#    linear's;
# 2. addmm/permute -> linear before batch-norm folding, so that a BatchNorm1d after a
#    Linear folds into one linear node;
# 3. batch-norm folding: it needs the conv/linear with constant weights;
# 4. conv+clamp fusion after the fold, so that conv -> bn -> relu, now conv -> relu,
#    fuses too.
# 4b. zero-pad folding after the clamp fusion: it folds a pad into a plain convolution
#    and into a conv_with_clamp alike.
# 4c. residual adds into the convolution before them (fuse_conv_add), after the pad
#    fold, so that a padded conv's add fuses too;
# 4d. sibling linears (q/k/v, gate/up in decode and prefill) -> one linear and its
#    narrow_last parts (merge_linears), after addmm -> linear and the batch-norm fold,
#    which need the separate linears; before fuse_elementwise and permute_to_view,
#    which then see the parts as the linears' outputs (rotary and SwiGLU patterns
#    start at the parts, whatever made them).
# 5. RMS-norm and rotary-embedding fusion: independent of the others (their patterns
#    have no clone in them).
# 5a. common subexpressions and no-op arithmetic (cse) after the pattern passes above,
#    whose matches need intermediates that nothing else reads (two equal dequantize
#    chains of a tied weight, merged, would block both fusions), and before every pass
#    below: cache_positions and fuse_elementwise then see one position computation per
#    step instead of one per layer, a fused chain would hide its nodes from it, and
#    local_symints gives each consumer its own SymInt nodes on purpose (cse never
#    merges those, nor float elementwise nodes that fuse_elementwise recomputes
#    inside each chain);
# 5a'. values every call computes alike (an integer arange of static bounds, a dtype
#    copy of a constant) -> constants (fold_constants), after cse, so that merged
#    duplicates fold once;
# 5a'+. torchao's per-token activation qparams (8da4w's amin / amax / ... chain) -> one
#    choose_qparams_per_token (fuse_choose_qparams), after cse, which gives the
#    chains over one x one amin, and before fuse_elementwise, which would hide the
#    chain's nodes in fused chains;
# 5a''. an accumulating index_put whose constant indices name each element once ->
#    gather, add, index_put (unique_index_put), after fold_constants, which makes
#    the indices (nn.functional.fold's arange arithmetic) constants;
# 5a'''. index_put values that broadcast to the written region -> an expand to it
#    (index_put_values; a multi-query K row into a cache of several heads), before
#    pair_cache_updates, which pairs the cache writes the kernels can then take;
# 5b. KV-cache positions: slice_scatter at ``pos.item()`` -> slice_scatter_at (reads the
#    position on the device); before 6./7., which would give its SymInts their own
#    sym_size nodes.
# 5b'. a layer's K and V cache writes (index_put at one positions node) -> one
#    index_put_pair, after cse, which gives them that one node;
# 5b'+. the rotary cos/sin of a cache write at one position (a decode step) -> a row
#    of a table computed at lowering (rotary_tables), after pair_cache_updates, which
#    makes the rotary cache writes, and cse/fold_constants, which give every layer one
#    prelude; before fuse_elementwise, which would hide the prelude's ATen ops in
#    chains;
# 5b''. residual adds into the linear before them (fuse_linear_add): after every
#    linear pass above (quantized_linear, addmm -> linear, the batch-norm fold and
#    merge_linears need the plain linears; an o_proj or down_proj is never merged, its
#    input has no sibling reader) and after cse (two equal linears merged by it have
#    two readers and keep their add); before fuse_elementwise, which would otherwise
#    take the add into an elementwise chain;
# 5b'''. an RMS norm into the linear(s) reading it (fuse_rms_norm_linear): after
#    fuse_rms_norm (which makes the norm), merge_linears (one merged q/k/v or gate/up
#    linear per norm in decode, where several readers would each renormalize) and
#    cse; after fuse_linear_add, so that a linear_add is never a plain linear here;
# 5c. elementwise chains (fuse_elementwise) after every pattern pass above, which
#    look for single elementwise nodes (a clamp after a conv, RMS norm's mul/rsqrt,
#    rotary's mul/add) that a fused chain would hide;
# 5c'. a merged gate/up linear and the SwiGLU chain over its halves -> one
#    linear_swiglu (fuse_linear_swiglu) right after fuse_elementwise, which makes the
#    chain, and after fuse_rms_norm_linear, whose fused norm it keeps
#    (rms_norm_linear_swiglu);
# 5d. permutes that move only size-1 dims -> views (permute_to_view) after every
#    pattern pass (addmm_to_linear looks for a weight's permute, rotary and attention
#    patterns for transposes), so that they share their input's memory;
# 5d'. a merged q/k/v rms_norm_linear (or its int4 / int8 form) whose parts (through
#    views) only a rotary_index_put_pair reads -> one rms_norm_linear_rotary_cache (or
#    its quantized form; fuse_linear_rotary_cache): after permute_to_view, which turns
#    the heads' transposes between the parts and the rotary node into views, and after
#    fuse_rms_norm_linear (the norm in the product) and pair_cache_updates (the
#    rotary cache writes);
# 5d''. an ATen SDPA between head transposes -> sdpa_seq_first (no transpose copied),
#    after permute_to_view, which leaves the transposes that move only size-1 dims
#    (one query row) as views, where there is nothing to gain;
# 6. symbolic view sizes -> -1: independent of the others (it frees views of a dynamic
#    batch from their sym_size inputs, which then die).
# 7. local SymInts last: every consumer of a symbolic size that is left gets its own
#    sym_size/arithmetic nodes, so that they can join its partition
#    (backend/symint_partitions.py).
PASSES = (bfloat16_to_float32, remove_noop_copies, as_strided_views, zero_dim_operands,
          fuse_quantized_linear, fuse_quantized_embedding, addmm_to_linear,
          fold_batch_norm, fuse_conv_clamp, fold_conv_padding, fuse_conv_add,
          merge_linears, fuse_rms_norm, fuse_rotary, cse, fold_constants, fuse_choose_qparams,
          unique_index_put, index_put_values, cache_positions, pair_cache_updates, rotary_tables,
          fuse_linear_add, fuse_rms_norm_linear, fuse_elementwise, fuse_linear_swiglu,
          permute_to_view, fuse_linear_rotary_cache, sdpa_seq_first, symbolic_view_sizes,
          local_symints)


def run_passes(pg) -> list[str]:
    """Run every pass once, in order; the names of those that changed the graph."""
    changed = []
    for pass_ in PASSES:
        if pass_(pg):
            changed.append(pass_.__name__)
    if changed:
        pg.drop_unused_constants()
        pg.gm.graph.eliminate_dead_code()
        pg.gm.recompile()
    return changed
