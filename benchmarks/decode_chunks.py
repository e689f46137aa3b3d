"""Where a chunked decode loop's time goes: ``generate``'s decode loop runs
``decode_next`` N steps per submit (``LoweredProgram.run_repeated``) and reads the new
ids from the history state after each submit. This times, per chunk size, a loop of
run_repeated + history read as generate does it: wall per step, the delegate's fence
wait per step, the history read, the rest (host), so that the host's share of a
token's time is seen apart from the GPU's.

    python benchmarks/decode_chunks.py [--quantization int4] [--chunks 1 4 16 63]
        [model args as llm_decode.py]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import forms as kernel_forms
from llm_decode import add_model_args, build
from vkdelegate.llm import generate
from vkdelegate.llm.generate import _HISTORY
from vkdelegate.backend.interpreter import to_numpy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--quantization", nargs="+", default=["none"])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 16, 63])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--form", action="append", metavar="MODULE.CONSTANT=VALUE")
    args = ap.parse_args()
    kernel_forms.apply(kernel_forms.parse(args.form, ap.error), ap.error)
    from vkdelegate.llm import lower

    base = build(args)
    prompt = list(range(3, 35))
    for scheme in args.quantization:
        import copy
        model = copy.deepcopy(base)
        program = lower(model, args.max_seq_len,
                        quantization=None if scheme == "none" else scheme)
        program.build()
        generate(program, prompt, 8)  # binds the states, compiles
        runner = program.runner("decode_next")
        graph = runner.delegates[0].loaded
        table = np.zeros(args.max_seq_len + 1, dtype=np.float32)
        sampling = np.zeros(4, dtype=np.float32)
        for k in args.chunks:
            rows = {"wall": [], "fence": [], "history": [], "gen": []}
            for _ in range(args.runs):
                generate(program, prompt, 1)  # prefill: the loop state at the prompt's end
                t0 = time.perf_counter()
                program.run_repeated("decode_next", k, sampling, table)
                t1 = time.perf_counter()
                to_numpy(program.store.get(_HISTORY))
                t2 = time.perf_counter()
                rows["wall"].append((t1 - t0) / k)
                rows["fence"].append(graph.last_timing["fence_wait_s"] / k)
                rows["history"].append(t2 - t1)
                timings = {}
                generate(program, prompt, 64, decode_chunk=k, timings=timings)
                rows["gen"].append(timings["decode_s"] / timings["decode_tokens"])
            med = {n: 1e6 * statistics.median(v) for n, v in rows.items()}
            print(f"{scheme} chunk {k}: run_repeated {med['wall']:.1f} us/step (fence wait "
                  f"{med['fence']:.1f}), history read {med['history']:.1f} us, generate "
                  f"64 tokens {med['gen']:.1f} us/token", flush=True)


if __name__ == "__main__":
    main()
