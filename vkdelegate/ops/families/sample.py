"""vkdelegate.sample: the next token id from a row of logits, on the device.

Schema (backend/custom_ops_llm.py, whose torch kernel is the definition):
``sample(Tensor logits, Tensor sampling) -> Tensor``; logits float32/float16 of sizes
[1, V] or [V] (V < 2^24), sampling float32[4] = (temperature, top_k, top_p, draw), the
result int64[1]. Temperature <= 0 is greedy (argmax, first maximum, as torch.argmax);
else top-k, then top-p, then the first token whose cumulative probability exceeds the
draw (uniform in [0, 1), made by the host's seeded generator, so a run is reproducible).
Only the id crosses to the host.

One workgroup (sample.glsl). Greedy (and top_k = 1, top_p <= 0) is one pass, the
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
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "sample"
LOGIT_DTYPES = frozenset({"float32", "float16"})
#: The shader's shared arrays hold this many invocations at most (a power of two).
MAX_WORKGROUP = 1024
#: The top-k path's shared list (sample.glsl KMAX): top_k in [1, KMAX] sorts the kept
#: tokens in shared memory; a larger top_k takes the general path.
KMAX = 1024
#: V must be below this: the token counts and 64-bit fixed-point mass sums (2^40 per
#: token) of sample.glsl.
MAX_VOCAB = 1 << 24
SAMPLE_PARAMS = ParamBlock("sample_block", [("info", "ivec4")])  # x: V


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("logits", "sampling"),
                    params=(SAMPLE_PARAMS,))


def _defines(out_ddt: str, logits, sampling) -> dict:
    # int64 ids are int32 on the device (converted at the staging boundary).
    return storage_defines(OUT=("int32", out_ddt), IN=logits, SAMP=sampling)


def workgroup_size(info) -> int:
    """The largest power of two <= MAX_WORKGROUP within the device's limits."""
    limit = min(MAX_WORKGROUP, info.max_workgroup_size[0], info.max_workgroup_invocations)
    return 1 << (max(limit, 1).bit_length() - 1)


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
    wg = workgroup_size(b.device.info)
    v = logits.max_numel
    loop_limit.check(b, loop_iterations(v, wg), f"sampling over {v} logits")
    params = b.params(SAMPLE_PARAMS.pack(info=[logits.numel]))
    b.on_resize(lambda: params.write(SAMPLE_PARAMS.pack(info=[logits.numel])))
    b.dispatch(SHADER, _defines(out.device_dtype, logits, sampling), outputs=[out],
               inputs=[logits, sampling], params=[params], global_size=(wg,),
               local_size=(wg, 1, 1))


def _rule(node: NodeSpec):
    logits, sampling = node.args[:2]
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
                notes="greedy / temperature / top-k / top-p with the host's draw; one "
                      "workgroup, radix searches; int64[1] id"))


def _variant(profile, dtype: str) -> dict:
    return _defines(device_dtype("int64", profile), (dtype, device_dtype(dtype, profile)),
                    ("float32", "float32"))


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=LOGIT_DTYPES)
