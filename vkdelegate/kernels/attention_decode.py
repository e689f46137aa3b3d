"""The decode attention kernel (sdpa_decode.glsl) as kernels/attention.py dispatches it.

For few query rows (an LLM decode step: one query position of the Hq / Hk query
heads that share a K/V head) on GPUs: one workgroup of WG invocations per (query-head
group, batch, key split; a group is one query head unless PACK_GQA), its keys spread
over the invocations (each K and V row read once per workgroup, as 4-element vectors
where the head dims allow), the rows' work unrolled R_MAX times, subgroup max
reductions where the device has subgroup arithmetic. sdpa.glsl gives each query row
an invocation instead, which leaves a decode workgroup nearly idle (Llama-3.2-1B,
256 cached positions on the H200: 37 us per call, docs/PERF.md). Long caches split
the keys over workgroups (SPLIT_KEYS per split) and merge them with sdpa_combine.glsl.
CPU drivers (llvmpipe) keep sdpa.glsl (``use_decode``). Torch-free; registers no op.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from vkdelegate.kernels import attention as at
from vkdelegate.kernels import loop_limit
from vkdelegate.kernels.workgroup import has_subgroup_arithmetic
from vkdelegate.shaders.bindings import Bindings, shader_bindings

SHADER = "sdpa_decode"
#: Invocations per workgroup and keys per chunk (a power of two >= the largest D4, 64).
WG = 128
#: Keys per split once the query-head groups alone leave the GPU idle (< SPLIT_BELOW
#: workgroups): a 256-position cache is one workgroup per group, 4096 positions 16
#: splits (H200, 32/8 heads x 64, 2048 cached, position 1500: 512 keys a split 37.2 us
#: with the combine pass, 256 keys 26.4 us; docs/PERF.md).
SPLIT_KEYS = 256
SPLIT_BELOW = 128

shader_bindings(SHADER)(at._bindings)  # sdpa.glsl's bindings (sdpa.h)

LANES_SHADER = "sdpa_decode_lanes"


@shader_bindings(LANES_SHADER)
def _lanes_bindings(d) -> Bindings:
    """sdpa.glsl's bindings; LAST_MERGE adds the split rows and the row counters as
    outputs after out_data."""
    found = at._bindings(d)
    if "LAST_MERGE" in d:
        found = dataclasses.replace(found, outputs=found.outputs + ("part_data", "count_data"))
    return found


#: Whether one-row decode attention takes sdpa_decode_lanes.glsl where it applies
#: (``lanes_for``). Measured on an H100 (2026-12-06, docs/PERF.md; 32/8 heads x 64,
#: fp16): 13.2 -> 10.2 us at 256 cached / position 96, 26.9 -> 18.6 at 2048 / 1500
#: (with the combine pass); the Llama-3.2-1B-shaped decode's attention 252.6 -> 169.6
#: us a step, fp16 decode +3-4% tokens/s, int4 +4%.
LANES_FORM = True
#: The lanes form's invocations per workgroup (a multiple of any subgroup size it runs
#: with: a power of two), keys per cluster per chunk (their K and V loads issued
#: together) and head-dim vec4s per lane (LANES = D_MAX / 4 / LANES_DL4, at most
#: LANES_MAX: ``lanes_shape``). On the H100 at head dim 64, WG 256 with 2 vec4s a
#: lane (LANES 8) was the fastest of WG 64 / 128 / 256, KB 1 / 2 / 4, DL4 2 / 4 (10.2
#: us against 13.4 for WG 128, DL4 4 at 256 / 96); a head dim of 256 (8 vec4s a lane
#: at LANES 8) keeps the workgroup form.
LANES_WG = 256
LANES_KB = 2
LANES_DL4 = 2
#: The most lanes a key (8: lavapipe's subgroups, the smallest common GPU ones).
LANES_MAX = 8
#: Whether the lanes form merges its key splits in the dispatch itself: the split of a
#: query row that finishes last (an atomic counter per row) merges them all
#: (sdpa_decode_lanes.glsl's LAST_MERGE) instead of sdpa_combine.glsl's second
#: dispatch; the keys are then split once the query-head groups leave the GPU idle
#: (fewer than SPLIT_BELOW workgroups) into LANES_SPLIT_KEYS keys a split, at most
#: attention.MAX_SPLITS, so that a decode step's few workgroups become many short
#: ones without a dispatch more. Off: right on an H100 (validation on), but slower
#: there at the 1B decode (cache 256: 140 -> 185 us of attention a step; the last
#: split's serial merge costs more than the shorter chains save; docs/PERF.md,
#: "An H100 and lavapipe, 2026-12-07 (sixteenth session)"); long caches not measured.
LAST_MERGE = False
LANES_SPLIT_KEYS = 64


def rows_max(d_max: int) -> int:
    """The most query rows per workgroup for head-dim bucket ``d_max``: 8, or 4 at 256
    (the queries, probabilities and reduction slots within 16 KiB of shared memory)."""
    return 8 if d_max <= 128 else 4


#: Whether the query heads that share a K/V head share a workgroup (each K and V row
#: then read once per group instead of once per head). Off: a decode step's
#: workgroups are latency-bound, each invocation running its rows' work one
#: instruction after another with nothing else on its SM to hide it, so one row per
#: workgroup (4x the workgroups of a Llama-3.2-1B step) is the faster form: on the
#: H200, 32/8 heads x 64, 97 cached keys, 12.9 us against 20.7 packed (4 rows,
#: R_MAX 8; docs/PERF.md); K and V, read 4x, come from L2.
PACK_GQA = False


def pack(l_max: int, q_heads: int, kv_heads: int, d_max: int) -> Optional[int]:
    """Query heads per workgroup for ``l_max`` query rows: Hq / Hk (the heads of one
    K/V head, grouped-query attention) when PACK_GQA and their rows fit rows_max, else
    1 when the rows of one head do, else None (the kernel does not apply)."""
    r = rows_max(d_max)
    if PACK_GQA and kv_heads >= 1 and q_heads % kv_heads == 0 \
            and l_max * (q_heads // kv_heads) <= r:
        return q_heads // kv_heads
    return 1 if l_max <= r else None


def rows_for(rows: int) -> int:
    """The R_MAX define for ``rows`` query rows per workgroup: the next power of two
    (1, 2, 4 or 8). The shader's per-row work is unrolled R_MAX times and runs
    predicated for rows past the real count, so R_MAX is kept tight."""
    return 1 << max(rows - 1, 0).bit_length()


def use_decode(info, l_max: int, q_heads: int, kv_heads: int, d_max: int) -> bool:
    """Whether a node that sdpa.glsl would run (not prefill) runs sdpa_decode.glsl on
    device ``info``: GPUs only (on llvmpipe its barriers cost more than the idle
    invocations of sdpa.glsl do) and rows that fit (``pack``)."""
    return info.type != "cpu" and pack(l_max, q_heads, kv_heads, d_max) is not None


def lanes_for(info, rows: int, d_max: int) -> "int | None":
    """The lanes form's LANES for ``rows`` query rows per workgroup at head-dim bucket
    ``d_max`` on device ``info`` (a DeviceInfo), or None where it does not apply: off
    (LANES_FORM), more than one row, no subgroup shuffles, a smallest subgroup (the
    lanes' bound) that leaves a lane more than 2 * LANES_DL4 vec4s of the head dim or
    is not a power of two dividing LANES_WG, or shared memory short of
    ``lanes_shared_bytes``."""
    caps = info.capabilities
    if not LANES_FORM or rows != 1 or "shuffle" not in info.subgroup_ops:
        return None
    shape = lanes_shape(d_max, caps.min_subgroup_size or caps.subgroup_size)
    if shape is None or (info.max_shared_memory
                         and lanes_shared_bytes(d_max, shape[1]) > info.max_shared_memory):
        return None
    return shape[0]


def lanes_shape(d_max: int, smallest: int) -> "tuple[int, int] | None":
    """(LANES, MAX_SG) of the lanes form at head-dim bucket ``d_max`` on a device whose
    smallest subgroup has ``smallest`` invocations, or None (see ``lanes_for``). Both
    depend on ``d_max`` alone, so that the variants are few enough to declare: LANES
    = D_MAX / 4 / LANES_DL4 lanes, at most LANES_MAX, and MAX_SG = LANES_WG /
    LANES_MAX subgroups (any subgroup of at least LANES_MAX invocations fits); a
    device whose smallest subgroup is below LANES_MAX (or not a power of two
    dividing LANES_WG) keeps the workgroup form."""
    if smallest < LANES_MAX or smallest & (smallest - 1) or LANES_WG % smallest:
        return None
    lanes = min(max(1, d_max // 4 // LANES_DL4), LANES_MAX)
    if d_max // 4 // lanes > 2 * LANES_DL4:
        return None
    return lanes, LANES_WG // LANES_MAX


def lanes_shared_bytes(d_max: int, max_sg: int) -> int:
    """sdpa_decode_lanes.glsl's shared memory in bytes for ``max_sg`` subgroups a
    workgroup: each subgroup's merged accumulator (d_max floats) and its (m, l), and
    LAST_MERGE's flag."""
    return max_sg * (4 * d_max + 8) + 4


def lanes_defines(out, q, k, v, mask, *, lanes: int, max_sg: int, last_merge: bool = False,
                  **form) -> dict:
    """The sdpa_decode_lanes.glsl defines: ``defines``' (one row, no R_MAX or SUBGROUP)
    with WG = LANES_WG, LANES, KB = LANES_KB and MAX_SG (LANES_WG / the device's
    smallest subgroup size); ``last_merge``: LAST_MERGE (the form's ``split`` is then
    False: the output is the attention's own)."""
    d = defines(out, q, k, v, mask, subgroup=False, rows=1, **form)
    del d["R_MAX"]
    d.update(WG=str(LANES_WG), LANES=str(lanes), KB=str(LANES_KB), MAX_SG=str(max_sg))
    if last_merge:
        d["LAST_MERGE"] = "1"
    return d


def lanes_iterations(s_max: int, lanes: int) -> int:
    """Loop iterations of one lanes-form invocation on llvmpipe (worst case, one split):
    a chunk per LANES_WG / lanes * LANES_KB keys, the subgroups' merge."""
    chunk = LANES_WG // lanes * LANES_KB
    return -(-s_max // chunk) + LANES_WG


def splits_for(groups: int, s_max: int, keys: int = 0) -> int:
    """Key splits for ``groups`` workgroups (query-head groups x batch) over ``s_max``
    keys: 1 unless the groups alone are few, else one per ``keys`` keys (0:
    SPLIT_KEYS; at most MAX_SPLITS, attention.py's bound of the combine pass)."""
    if groups >= SPLIT_BELOW:
        return 1
    return max(1, min(at.MAX_SPLITS, -(-s_max // (keys or SPLIT_KEYS))))


def iterations(s_max: int, d_max: int) -> int:
    """Loop iterations of one invocation on llvmpipe (worst case, one split): per chunk
    of WG keys the P V loop (D4 / 4), the reduction (a tree of log2 WG steps, or one
    slot per subgroup) and the head-dim loop when not unrolled; the final sums."""
    d4 = d_max // 4
    per_chunk = d4 // 4 + WG + (d4 if d4 > 32 else 0) + 1
    return -(-s_max // WG) * per_chunk + rows_max(d_max) * (WG // d4 + 1)


def defines(out, q, k, v, mask, *, causal: bool, window: bool, d_max: int, skip: bool,
            subgroup: bool, nan_rows: bool = False, seq_first: bool = False,
            split: bool = False, start=None, rows: "int | None" = None) -> dict:
    """The sdpa_decode.glsl defines of one form: sdpa.glsl's (``attention.defines``)
    without its tiling, with WG, R_MAX (``rows_for(rows)``; None: rows_max),
    K4_T / V4_T and SUBGROUP."""
    d = at.defines(out, q, k, v, mask, causal=causal, window=window, d_max=d_max,
                   cpu=False, skip=skip, nan_rows=nan_rows, seq_first=seq_first,
                   split=split, start=start)
    # TILE_MAP: sdpa_decode.glsl reads its mask per key in chunks, without a block map.
    for name in ("D_STEP", "BLOCK_M", "BLOCK_N", "Q_HALF", "TILE_MAP"):
        d.pop(name, None)
    d.update(WG=str(WG), R_MAX=str(rows_max(d_max) if rows is None else rows_for(rows)))
    for name in ("K", "V"):
        d[f"{name}4_T"] = "f16vec4" if d[f"{name}_T"] == "float16_t" else "vec4"
    if subgroup:
        d["SUBGROUP"] = "1"
    return d


def dispatch(b, a, *, d_max: int, scale: float, l_max: int, s_max: int, heads: int,
             batch: int, params_for) -> None:
    """Record sdpa_decode.glsl for attention ``a`` (an attention.Attention; the caller
    checked ``use_decode``), with the split-K partial pass and sdpa_combine.glsl when
    the keys are split. ``params_for(splits, per_split, pack)``: the sdpa_block
    parameters (updated on resize by the caller's closure)."""
    q, k, v, out = a.q, a.k, a.v, a.out
    head = -2 if a.seq_first else -3
    group = pack(l_max, heads, k.max_shape[head], d_max)
    groups = heads // group * batch
    lanes = lanes_for(b.device.info, l_max * group, d_max)
    last_merge = lanes is not None and LAST_MERGE
    chunk = WG if lanes is None else LANES_WG // lanes * LANES_KB
    # LAST_MERGE: splits of whole chunks of about LANES_SPLIT_KEYS keys.
    splits = splits_for(groups, s_max,
                        max(chunk, LANES_SPLIT_KEYS // chunk * chunk) if last_merge else 0)
    chunks = -(-s_max // chunk)
    per_split = -(-chunks // splits)
    loop_limit.check(b, iterations(min(s_max, per_split * WG), d_max) if lanes is None
                     else lanes_iterations(min(s_max, per_split * chunk), lanes),
                     f"{s_max} keys of head dim {d_max}")
    target = out
    if splits > 1 and not last_merge:
        target = b.temporary((batch * heads * l_max * splits, d_max + 4), "float32")
    mask = a.mask
    metas = [target.meta, q.meta, k.meta, v.meta] + ([mask.meta] if mask else [])
    form = dict(causal=a.causal, window=a.window > 0, d_max=d_max,
                skip=bool(b.option(at.SKIP_OPTION, True)), nan_rows=a.nan_rows,
                seq_first=a.seq_first, split=splits > 1 and not last_merge, start=a.start)
    inputs = [q, k, v] + ([mask] if mask else []) + ([a.start] if a.start is not None else [])
    params = metas + [params_for(splits, per_split, group)]
    if lanes is not None:
        caps = b.device.info.capabilities
        max_sg = lanes_shape(d_max, caps.min_subgroup_size or caps.subgroup_size)[1]
        outputs = [target]
        if last_merge:
            # The splits' rows, and one counter per query row, zero at load and
            # returned to zero by the split that merges.
            outputs += [b.temporary((batch * heads * splits, d_max + 4), "float32"),
                        b.zeroed((batch * heads,), "int32")]
        b.dispatch(LANES_SHADER, lanes_defines(target, q, k, v, mask, lanes=lanes,
                                               max_sg=max_sg, last_merge=last_merge,
                                               **form),
                   outputs=outputs, inputs=inputs, params=params,
                   global_size=(splits * LANES_WG, heads, batch),
                   local_size=(LANES_WG, 1, 1))
    else:
        d = defines(target, q, k, v, mask, subgroup=has_subgroup_arithmetic(b.device.info),
                    rows=l_max * group, **form)
        b.dispatch(SHADER, d, outputs=[target], inputs=inputs, params=params,
                   global_size=(splits * WG, heads // group, batch), local_size=(WG, 1, 1))
    if splits > 1 and not last_merge:
        at.dispatch_combine(b, out, target, d_max=d_max, splits=splits, l_max=l_max,
                            rows=batch * heads, nan_rows=a.nan_rows,
                            seq_first=a.seq_first)
