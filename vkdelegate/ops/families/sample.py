"""vkdelegate.sample: the next token id from a row of logits, on the device.

Schema (backend/custom_ops_llm.py, whose torch kernel is the definition):
``sample(Tensor logits, Tensor sampling) -> Tensor``; logits float32/float16 of sizes
[1, V] or [V] (V < 2^24), sampling float32[4] = (temperature, top_k, top_p, draw), the
result int64[1]. Temperature <= 0 is greedy (argmax, first maximum, as torch.argmax);
else top-k, then top-p, then the first token whose cumulative probability exceeds the
draw (uniform in [0, 1), made by the host's seeded generator, so a run is reproducible).
Only the id crosses to the host.

``vkdelegate.sample_record(logits, sampling, draws, pos, token, token_pos, history) ->
(id, token', pos', history')`` (custom_ops_llm.sample_record_reference) is the decode
loop's step (vkdelegate.llm.decoder.DecodeLoopState.sample): the same pick, with the
draw ``draws[pos]`` when a table is given (decode_next), and invocation 0 also writes
the id as token', pos + 1 as pos' and the id at history'[pos + 1] (sample.glsl's RECORD
form). history' starts as a copy of history marked as a whole copy, so where the
history is device state the copy is dropped and the row goes straight into the state
(runtime/device_state.py): the record costs no dispatch of its own. pos outside the
draws or pos + 1 outside the history sets the node's error flag (that history row is
not written; the id, token' and pos' are).

One workgroup (sample.glsl), after a first pass over many (sample_max.glsl, V > SPAN
= 2048: each workgroup's maximum key of 2048 logits, which sample.glsl then reduces;
on the H200 a greedy step's sampler over 128256 logits was 54.7 us in one workgroup,
docs/PERF.md). Greedy (and top_k = 1, top_p <= 0) is one pass, the
maximum key. Otherwise the masses are 64-bit fixed point (w * 2^40, truncated), summed
exactly by shared-memory integer atomics, so results do not depend on the order of the
additions. Each threshold (the k-th token, the top-p cut, the drawn token) is a radix
search: a pass builds a 256-bin histogram (count or mass) of the candidates, the bin
where the test first passes is kept; level 0 bins by max z - z in steps of 1/8, later
levels by 8 bits of the key, until one token is left (usually 2 levels; tokens tied in z
are then split by index, 8 bits a level). top_k in [1, KMAX] (or V <= KMAX): one count
search for the k-th key, the k tokens compacted into shared memory, bitonic-sorted, and
top-p and the draw by binary searches on their masses' prefix sums (a fixed scan).
Otherwise (top_k 0 or > KMAX): a count search (top_k < V), a mass search for top-p,
one for the draw, each above the previous threshold. About 4 passes over the logits
for top-k 50 + top-p 0.9 (was 150: bit-by-bit searches), 3 for temperature alone, 5-7
for top-p alone.

On lavapipe (2 cores shared with other work, so ranges over 3-4 runs), V = 151,936,
median GPU ms (benchmarks/sample.py), before -> after: greedy 0.5-0.9 both, temperature
only 22-35 -> 5-7.5, top-k 50 + top-p 0.9 66-97 -> 6.5-7.3, top-p 0.9 alone 45-67 ->
8.3-10, top-k 2000 + top-p 0.9 69-101 -> 14-17. Level 0 (a shared atomic a token) is
much of a search on a CPU driver. On the H200, V = 128256: greedy 0.036 ms, temperature
only 0.147, top-k 50 + top-p 0.9 0.176, top-p 0.9 alone 0.280 (the bit-by-bit searches
cost about 3.7 ms a sampled token; docs/PERF.md, "The H200, 2026-12-04").
"""
from __future__ import annotations

import math

from vkdelegate.kernels import loop_limit
from vkdelegate.kernels.affine_copy import copy_destination
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "sample"
LOGIT_DTYPES = frozenset({"float32", "float16"})
#: The shader's shared arrays hold this many invocations at most (a power of two).
MAX_WORKGROUP = 1024
#: CPU drivers' workgroup (doubled where a vocabulary would pass llvmpipe's loop
#: budget): llvmpipe runs a workgroup's invocations as SIMD-wide fibers on one thread,
#: switching all of them at every barrier, so the searches' many barriers cost with
#: the workgroup's size while fewer invocations do not make the work larger. On
#: llvmpipe (2 cores, ``benchmarks/sample.py``, GPU ms) 1024 -> 128 invocations: greedy
#: V = 1000 0.76 -> 0.12, 32000 1.01 -> 0.49, 128256 1.76 -> 0.78; temperature alone at
#: 128256 5.7 -> 4.1, top-p 0.9 10.9 -> 8.5; 64 and fewer within noise of 128
#: (docs/PERF.md, "lavapipe, 2026-12-07 (nineteenth session)"). At least 128 (Vulkan's
#: minimum maxComputeWorkGroupInvocations): the top-k list's scan holds KMAX / 128
#: sums an invocation (sample.glsl).
CPU_WORKGROUP = 128
#: The top-k path's shared list (sample.glsl KMAX): top_k in [1, KMAX] sorts the kept
#: tokens in shared memory; a larger top_k takes the general path.
KMAX = 1024
#: V must be below this: the token counts and 64-bit fixed-point mass sums (2^40 per
#: token) of sample.glsl.
MAX_VOCAB = 1 << 24
#: x: V; sample_record: y: the history's rows, z: the node's error-flag word, w: the
#: draws' rows (0: no table).
SAMPLE_PARAMS = ParamBlock("sample_block", [("info", "ivec4")])
POS_DTYPES = frozenset({"int64", "int32"})
#: The first pass (sample_max.glsl): WGM invocations a workgroup, SPAN logits each
#: (16 an invocation). V > SPAN takes it: ceil(V / SPAN) workgroups find their
#: maximum keys, and sample.glsl's PARTIALS form reduces those instead of every logit
#: (a greedy step's one pass, V = 128256: 63 workgroups rather than one).
MAX_SHADER = "sample_max"
WGM = 128
SPAN = 16 * WGM


@shader_bindings(SHADER)
def _bindings(defines) -> Bindings:
    parts = ("part_data",) if "PARTIALS" in defines else ()
    if "RECORD" not in defines:
        return Bindings(outputs=("out_data",), inputs=("logits", "sampling") + parts,
                        params=(SAMPLE_PARAMS,))
    draws = ("draws",) if "DRAWS" in defines else ()
    return Bindings(outputs=("out_data", "token_out", "pos_out", "history_out",
                             "error_flags"),
                    inputs=("logits", "sampling") + parts + draws + ("pos_data",),
                    params=(SAMPLE_PARAMS,))


@shader_bindings(MAX_SHADER)
def _max_bindings(_defines) -> Bindings:
    return Bindings(outputs=("part_data",), inputs=("logits", "sampling"),
                    params=(SAMPLE_PARAMS,))


def _defines(out_ddt: str, logits, sampling, pos=None, draws: bool = False,
             partials: bool = False) -> dict:
    """pos: the position's (graph, device) dtypes for sample_record's RECORD form;
    partials: the PARTIALS form (after sample_max.glsl)."""
    # int64 ids are int32 on the device (converted at the staging boundary).
    d = storage_defines(OUT=("int32", out_ddt), IN=logits, SAMP=sampling,
                        **({"POS": pos} if pos is not None else {}))
    if pos is not None:
        d.update(flag_defines(RECORD=True, DRAWS=draws))
    if partials:
        d.update(PARTIALS="1", SPAN=str(SPAN))
    return d


def _max_defines(logits, sampling) -> dict:
    d = storage_defines(IN=logits, SAMP=sampling)
    d.update(WGM=str(WGM), SPAN=str(SPAN))
    return d


def _max_pass(b, logits, sampling, params) -> list:
    """Record sample_max.glsl where the logits may number more than SPAN: the list of
    the scratch tensor it writes (ceil(V / SPAN) keys of two words, for the largest
    V), for sample.glsl's PARTIALS form; else []. ``params``: the sample node's
    parameter buffer (info.x = V, kept current on resize)."""
    v = logits.max_numel
    if v <= SPAN:
        return []
    parts = -(-v // SPAN)
    keys = b.temporary((2 * parts,), "int32")
    b.dispatch(MAX_SHADER, _max_defines(logits, sampling), outputs=[keys],
               inputs=[logits, sampling], params=[params], global_size=(parts * WGM,),
               local_size=(WGM, 1, 1))
    return [keys]


def workgroup_size(info, vocab: int) -> int:
    """sample.glsl's invocations for ``vocab`` logits on device ``info``: the largest
    power of two <= MAX_WORKGROUP within the device's limits on GPUs; on CPU drivers
    CPU_WORKGROUP, doubled (up to that largest) while the loops of ``vocab`` logits
    (``loop_iterations``) would pass llvmpipe's loop budget."""
    limit = min(MAX_WORKGROUP, info.max_workgroup_size[0], info.max_workgroup_invocations)
    largest = 1 << (max(limit, 1).bit_length() - 1)
    if info.type != "cpu":
        return largest
    wg = min(CPU_WORKGROUP, largest)
    while wg < largest and loop_limit.over_budget(loop_iterations(vocab, wg)):
        wg *= 2
    return wg


def search_levels(v: int) -> int:
    """The most passes over the logits one threshold search makes (sample.glsl
    ``search``): level 0, then 8 bits of h a level (4 levels at most), then 8 bits of
    the index a level for tokens tied in h (V < 2^24: 3 at most). The shader stops a
    search at MAX_LEVELS (16) whatever the data, so a search always ends."""
    return 1 + 4 + -(-max(v - 1, 1).bit_length() // 8)


def loop_iterations(v: int, wg: int) -> int:
    """A worst-case count of one invocation's loop iterations (LOOP_LIMIT): the max
    pass and its tree, three searches (each level: its pass, the histogram clear, the
    sums by 16 bins and invocation 0's scans of them, two 32-step binary searches, the
    24-step tie split) and the top-k list (compaction pass, bitonic sort and scan of
    KMAX keys, binary searches)."""
    chunks = -(-v // (8 * wg))
    per_level = chunks + 5 * 256 // wg + 4 * 16 + 2 * 32 + 24 + 4
    sort = 55 * (KMAX // 2 // wg + 1) + 10 * 2 * (KMAX // wg + 1) + 2 * (KMAX // wg) + 40
    return chunks + 12 + 3 * search_levels(v) * per_level + chunks + sort


def _impl(b, node):
    logits_id, sampling_id, out_id = node.args
    logits, sampling, out = (b.tensor(i) for i in (logits_id, sampling_id, out_id))
    v = logits.max_numel
    wg = workgroup_size(b.device.info, v)
    loop_limit.check(b, loop_iterations(v, wg), f"sampling over {v} logits")
    params = b.params(SAMPLE_PARAMS.pack(info=[logits.numel]))
    b.on_resize(lambda: params.write(SAMPLE_PARAMS.pack(info=[logits.numel])))
    keys = _max_pass(b, logits, sampling, params)
    b.dispatch(SHADER, _defines(out.device_dtype, logits, sampling, partials=bool(keys)),
               outputs=[out], inputs=[logits, sampling] + keys, params=[params],
               global_size=(wg,), local_size=(wg, 1, 1))


def _rule(node: NodeSpec):
    logits, sampling = node.args[:2]
    return _sample_reason(logits, sampling)


def _sample_reason(logits, sampling):
    if logits.rank not in (1, 2) or (logits.rank == 2 and logits.shape[0] != 1):
        return f"logits of sizes {list(logits.shape)} (expected [1, V] or [V])"
    if math.prod(logits.shape) == 0:
        return "no logits"
    if math.prod(logits.shape) >= MAX_VOCAB:
        return f"{math.prod(logits.shape)} logits (fewer than {MAX_VOCAB} expected)"
    if tuple(sampling.shape) != (4,):
        return f"sampling of sizes {list(sampling.shape)} (expected [4])"
    return None


def _shape(args):
    return (1,)


register(OpSpec(name="vkdelegate.sample.default", dtypes=frozenset({"int64"}), impl=_impl,
                shape_fn=_shape, rules=(_rule,),
                arg_dtypes={0: LOGIT_DTYPES, 1: frozenset({"float32"})},
                notes="greedy / temperature / top-k / top-p with the host's draw; the "
                      "maximum over many workgroups, then one workgroup's radix "
                      "searches; int64[1] id"))


# ---- vkdelegate.sample_record(logits, sampling, draws, pos, token, token_pos, history) --
def _record_impl(b, node):
    logits_id, sampling_id, draws_id, pos_id, _tok_id, _tpos_id, hist_id, out_id = node.args
    logits, sampling, pos, history = (b.tensor(i) for i in (logits_id, sampling_id,
                                                            pos_id, hist_id))
    draws = b.value(draws_id)
    if draws is not None:
        draws = b.tensor(draws_id)
    outs = b.value(out_id)
    if not isinstance(outs, list) or len(outs) != 4:
        raise b.error("sample_record has four outputs")
    out, token_out, pos_out, history_out = (b.tensor(o) if isinstance(o, int) else o
                                            for o in outs)
    rows = history.max_numel
    draw_rows = draws.max_numel if draws is not None else 0

    def message():
        table = f" and pos in 0..{draw_rows - 1} (the draws' rows)" if draws is not None \
            else ""
        return (f"position out of range: pos + 1 must be in 0..{rows - 1} (the "
                f"history's rows){table}")
    flag = b.error_flag(message)
    v = logits.max_numel
    wg = workgroup_size(b.device.info, v)
    loop_limit.check(b, loop_iterations(v, wg), f"sampling over {v} logits")
    # history' starts as history (the rows the record does not write), marked as a
    # whole copy: bound in place to the loop's state, the copy is dropped (DeviceState).
    copy_destination(b, history_out, history)

    def pack():
        return SAMPLE_PARAMS.pack(info=[logits.numel, rows, flag.slot, draw_rows])
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    keys = _max_pass(b, logits, sampling, params)
    inputs = [logits, sampling] + keys + ([draws] if draws is not None else []) + [pos]
    b.dispatch(SHADER, _defines(out.device_dtype, logits, sampling, pos, draws is not None,
                                bool(keys)),
               outputs=[out, token_out, pos_out, history_out, flag], inputs=inputs,
               params=[params], global_size=(wg,), local_size=(wg, 1, 1))


def _one(t) -> bool:
    return math.prod(t.shape) == 1


def _record_rule(node: NodeSpec):
    logits, sampling, draws, pos, token, token_pos, history = node.args[:7]
    why = _sample_reason(logits, sampling)
    if why:
        return why
    if draws is not None and (draws.rank != 1 or draws.shape[0] == 0):
        return f"draws of sizes {list(draws.shape)} (expected [N], N > 0)"
    for name, t in (("pos", pos), ("token", token), ("token_pos", token_pos)):
        if not _one(t):
            return f"{name} of sizes {list(t.shape)} (one element expected)"
    if history.rank != 1 or history.shape[0] == 0:
        return f"history of sizes {list(history.shape)} (expected [N], N > 0)"
    return None


def _record_shape(args):
    return [(1,), tuple(args[4].shape), tuple(args[5].shape), tuple(args[6].shape)]


register(OpSpec(name="vkdelegate.sample_record.default", dtypes=frozenset({"int64"}),
                impl=_record_impl, shape_fn=_record_shape, rules=(_record_rule,),
                arg_dtypes={0: LOGIT_DTYPES, 1: frozenset({"float32"}),
                            2: frozenset({"float32"}), 3: POS_DTYPES},
                notes="the decode loop's step: sample (the draw from a table at pos, "
                      "optionally) and record the id as the loop's token, pos + 1 and "
                      "history[pos + 1], in sample's dispatch"))


def _variant(profile, dtype: str, record: "str | None", draws: bool,
             partials: bool) -> dict:
    if record is None and draws:
        return None
    logits = (dtype, device_dtype(dtype, profile))
    pos = (record, device_dtype(record, profile)) if record else None
    return _defines(device_dtype("int64", profile), logits, ("float32", "float32"), pos,
                    draws, partials)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=LOGIT_DTYPES,
             record=(None,) + tuple(sorted(POS_DTYPES)), draws=(False, True),
             partials=(False, True))
declare_grid(MAX_SHADER, lambda profile, dtype: _max_defines(
    (dtype, device_dtype(dtype, profile)), ("float32", "float32")),
    profile=STORAGE_PROFILES, dtype=LOGIT_DTYPES)
