"""Where a chunked decode loop's time goes: ``generate``'s decode loop runs
``decode_next`` N steps per submit (``LoweredProgram.run_repeated``) and reads the new
ids from the loop's history state after each submit. This times, per chunk size, one
run_repeated + history read as generate does them (wall per step, the delegate's fence
wait per step, the history read) and generate's time a token for 64 new tokens, so
that the host's share of a token's time is seen apart from the GPU's (docs/PERF.md,
"An H100, 2026-12-06 (fourteenth session)": the history read took 1.1 ms a chunk).

    python benchmarks/decode_chunks.py [--quantization none int4] [--chunks 1 4 16 63]
        [--runs 5] [model args as llm_decode.py: --layers, --hidden, ...]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np

from llm_decode import add_model_args, build
from vkdelegate.backend.interpreter import to_numpy
from vkdelegate.llm import generate
from vkdelegate.llm.generate import _HISTORY

PROMPT = list(range(3, 35))
NEW_TOKENS = 64


def time_chunk(program, k: int, runs: int, max_seq_len: int) -> dict:
    """Median us of ``runs`` rounds, each after a prefill of PROMPT: ``wall`` and
    ``fence`` (run_repeated of ``k`` greedy steps, per step), ``history`` (one read of
    the chunk's rows of the history state, as generate reads them), ``generate`` (per
    token of NEW_TOKENS at ``k`` steps a submit); ``ids``: the last round's ``k`` ids
    read from the history."""
    graph = program.runner("decode_next").delegates[0].loaded
    table = np.zeros(max_seq_len + 1, dtype=np.float32)
    sampling = np.zeros(4, dtype=np.float32)  # greedy
    rows = {"wall": [], "fence": [], "history": [], "generate": []}
    ids = []
    for _ in range(runs):
        generate(program, PROMPT, 1)  # prefill: the loop state at the prompt's end
        t0 = time.perf_counter()
        program.run_repeated("decode_next", k, sampling, table)
        t1 = time.perf_counter()
        new = to_numpy(program.store.get(_HISTORY, rows=slice(len(PROMPT) + 1,
                                                             len(PROMPT) + 1 + k)))
        t2 = time.perf_counter()
        ids = new.tolist()
        rows["wall"].append((t1 - t0) / k)
        rows["fence"].append(graph.last_timing["fence_wait_s"] / k)
        rows["history"].append(t2 - t1)
        timings: dict = {}
        generate(program, PROMPT, NEW_TOKENS, decode_chunk=k, timings=timings)
        rows["generate"].append(timings["decode_s"] / timings["decode_tokens"])
    out = {n: 1e6 * statistics.median(v) for n, v in rows.items()}
    out["ids"] = ids
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--quantization", nargs="+", default=["none"],
                    choices=["none", "int8", "int4", "8da4w"])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 16, 63])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    if args.max_seq_len < len(PROMPT) + NEW_TOKENS:
        ap.error(f"--max-seq-len {args.max_seq_len}: at least {len(PROMPT) + NEW_TOKENS} "
                 f"(a {len(PROMPT)}-token prompt and {NEW_TOKENS} new tokens)")
    if any(not 1 <= k <= args.max_seq_len - len(PROMPT) - 1 for k in args.chunks):
        ap.error(f"--chunks: each in 1..{args.max_seq_len - len(PROMPT) - 1} "
                 f"(the cache after the {len(PROMPT)}-token prompt)")
    from vkdelegate.llm import lower

    base = build(args)
    for scheme in args.quantization:
        program = lower(copy.deepcopy(base), args.max_seq_len,
                        quantization=None if scheme == "none" else scheme)
        program.build()
        generate(program, PROMPT, 8)  # binds the states, compiles
        for k in args.chunks:
            r = time_chunk(program, k, args.runs, args.max_seq_len)
            print(f"{scheme} chunk {k}: run_repeated {r['wall']:.1f} us/step (fence wait "
                  f"{r['fence']:.1f}), history read {r['history']:.1f} us, generate "
                  f"{NEW_TOKENS} tokens {r['generate']:.1f} us/token", flush=True)


if __name__ == "__main__":
    main()
