"""LLM decode speed: vkdelegate.llm (KV cache on the GPU, sampling on the device) vs
HF transformers eager ``generate`` (CUDA when present, else CPU), same model, same
prompt, greedy, in one run.

The model is transformers' LlamaForCausalLM with seeded random weights, shaped like
Llama-3.2-1B by default (hidden 2048, 16 layers, 32 heads / 8 KV heads, FFN 8192,
vocab 128256, tied embeddings), fp16 (``--dtype``). ``--layers``/``--hidden``/
``--vocab`` shrink it (lavapipe). Decode tokens/s: ours from ``generate``'s timings
(decode calls only, host round trip of each step included); HF's from the time of
``generate`` with N new tokens minus the time with 1 (its prefill), both with a static
number of tokens (min_new_tokens). "GB read / token": the linear weights (the LM head
too) at the format's bytes per weight plus K and V up to the mean decode position, the
least a decode step must read; "HBM share": that x tokens/s over ``--hbm-tbps`` (H200:
4.8 TB/s). "host B / step": bytes the last decode step moved between host and device
(asserted: no cache state, at most token + position + sampling vector + next id).
Each format also prints the median split of an unprofiled step's time (``step_breakdown``:
wall, fence wait, delegate host work, interpreter glue). ``--profile N`` adds one profiled decode step per format (its N costliest ops). Prints
each format's row as it is measured, a table, and writes JSON after each format.

    python benchmarks/llm_decode.py [--new-tokens 64] [--prompt 32] [--layers 16]
        [--dtype float16] [--max-seq-len 256] [--quantization none int8 int4]
        [--profile 12] [--sampled] [--prefill 2048 --max-seq-len 2112]
        [--option NAME=VALUE ...] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
from tabulate import tabulate

import forms as kernel_forms
from vkdelegate.llm import generate
from vkdelegate.runtime.device import default_device


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.ffn, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=max(args.max_seq_len, 2048),
                         rope_theta=500000.0, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    # Random weights: no end-of-sequence id, so that every run makes the same number
    # of tokens (vkdelegate.llm.generate stops at the one lower records, as HF does).
    model.generation_config.eos_token_id = None
    with torch.no_grad():  # seeded weights at a scale that keeps fp16 finite
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    return model.to(getattr(torch, args.dtype))


def add_model_args(ap, max_seq_len: int = 256) -> None:
    """``build``'s arguments on parser ``ap`` (the Llama-3.2-1B shape by default)."""
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--max-seq-len", type=int, default=max_seq_len)


def hf_decode_tps(model, prompt, new_tokens: int, device: str, runs: int) -> tuple:
    """(decode tokens/s, token ids) of HF eager generate on ``device`` (on a copy of
    ``model`` there; the model itself stays on the CPU for lowering)."""
    import copy

    model = copy.deepcopy(model).to(device)
    ids = torch.tensor([prompt], device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def gen(n):
        sync()
        t0 = time.perf_counter()
        # attention_mask given: else generate masks prompt ids equal to pad_token_id.
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0)
        sync()
        return time.perf_counter() - t0, out[0, len(prompt):].tolist()

    with torch.no_grad():
        gen(new_tokens)  # warm-up
        one = statistics.median(gen(1)[0] for _ in range(runs))
        full = [gen(new_tokens) for _ in range(runs)]
    t = statistics.median(x[0] for x in full)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return (new_tokens - 1) / max(t - one, 1e-9), full[-1][1]


def hf_prefill_ms(model, prompt, device: str, runs: int) -> float:
    """Median ms of one HF eager forward over ``prompt`` (a prefill, no generate) on
    ``device`` (on a copy of ``model`` there)."""
    import copy

    model = copy.deepcopy(model).to(device)
    ids = torch.tensor([prompt], device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    with torch.no_grad():
        for i in range(runs + 1):  # the first is a warm-up
            sync()
            t0 = time.perf_counter()
            model(ids, use_cache=True)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(times[1:])


def linear_params(model) -> int:
    """Weights of every nn.Linear (the LM head too, also when tied to the embedding:
    decode reads it whole, the embedding table one row)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


#: Weight bytes per linear weight read by a decode step (scales and zero points not
#: counted: 2 / group_size bytes more for int4, 2 / K for int8).
WEIGHT_BYTES = {"int8": 1.0, "int4": 0.5, "8da4w": 0.5}

#: Host <-> device bytes a decode step may move: up the token (int64[1, 1]), the
#: position (int64[1]) and the sampling vector (float32[4]); down the next id (int64).
STEP_HOST_BYTES = 8 + 8 + 16 + 8


def decode_profile(program, prompt, top: int) -> tuple:
    """(rows of (op, dispatches, GPU us, share) for the ``top`` ops by GPU time, total
    GPU us, dispatches) of one profiled decode step after a prefill of ``prompt``."""
    from collections import defaultdict

    generate(program, prompt, 2)
    program.set_profiling(True)
    try:
        program.decode(torch.tensor([[1]]), torch.tensor([len(prompt) + 1]),
                       torch.tensor([0.0, 0.0, 1.0, 0.5]))
    finally:
        program.set_profiling(False)
    by_op, count = defaultdict(float), defaultdict(int)
    n, trace = 0, []
    for _, profile in program.last_profiles("decode"):
        for d in profile.dispatches:
            by_op[d.op] += d.duration_ns / 1e3
            count[d.op] += 1
            n += 1
            trace.append((d.node_id, d.op, d.shader, round(d.duration_ns / 1e3, 2)))
    total = sum(by_op.values()) or 1.0
    rows = sorted(((op, count[op], round(us, 1), f"{100 * us / total:.1f}%")
                   for op, us in by_op.items()), key=lambda r: -r[2])[:top]
    return rows, total, n, trace


def device_memory(program, param_bytes: int) -> dict:
    """GiB of device memory of the built program (``LoweredProgram.device_memory``):
    the pooled constants all methods share, the state (KV cache), the methods' own
    blocks, and the model's parameter bytes beside them."""
    memory = program.device_memory()
    return {"constants_gib": round(memory.pop("constants") / 2**30, 3),
            "state_gib": round(memory.pop("state") / 2**30, 3),
            "graphs_gib": round(sum(memory.values()) / 2**30, 3),
            "params_gib": round(param_bytes / 2**30, 3)}


def unpooled_memory(model, max_seq_len, fmt, group_size, options, prompt,
                    param_bytes: int) -> dict:
    """``device_memory`` of the same program built with every delegate holding its own
    constants (the program's constant pool taken away before the first build)."""
    from vkdelegate.llm import lower

    program = lower(model, max_seq_len, quantization=None if fmt == "none" else fmt,
                    group_size=None if fmt in ("none", "int8") else group_size,
                    options=options or None)
    for name in program.method_names:
        for d in program.runner(name).delegates:
            d.shared = None
    try:
        program.build()
        generate(program, prompt, 2)
        return device_memory(program, param_bytes)
    finally:
        program.close()


def hold(program, prompt, new_tokens: int, seconds: float) -> None:
    """Generate back to back for ``seconds``: the GPU's clocks rise to their working
    level under load (the H200 idles at 345 MHz, docs/PERF.md), so the timed runs
    measure the program, not the clock ramp."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        generate(program, prompt, new_tokens)


def step_breakdown(program, prompt, steps: int) -> dict:
    """Median per-step split of ``steps`` unprofiled greedy ``decode`` calls (one per
    token: the host between steps) after a prefill
    of ``prompt`` (microseconds): "wall" (the ``program.decode`` call, as ``generate``
    times it), "fence wait" (the delegates' ``DelegateGraph.last_timing`` fence waits:
    the GPU working plus the submit's latency), "delegate host" (the rest of the
    delegates' execute: input writes, submit, output reads) and "glue" (wall minus the
    delegates: the method's plan interpreter, tensor conversions, ``int()`` of the id)."""
    generate(program, prompt, 2)
    delegates = program.runner("decode").delegates
    rows = {"wall": [], "fence wait": [], "delegate host": [], "glue": []}
    sampling = torch.tensor([0.0, 0.0, 1.0, 0.5])
    token = 1
    for i in range(steps):
        pos = torch.tensor([len(prompt) + 1 + i])
        t0 = time.perf_counter()
        token = int(program.decode(torch.tensor([[token]]), pos, sampling))
        wall = time.perf_counter() - t0
        timing = [d.loaded.last_timing for d in delegates
                  if getattr(d.loaded, "last_timing", None)]
        wait = sum(t["fence_wait_s"] for t in timing)
        host = sum(t["host_s"] for t in timing)
        for k, v in (("wall", wall), ("fence wait", wait), ("delegate host", host),
                     ("glue", wall - wait - host)):
            rows[k].append(v * 1e6)
    return {k: round(statistics.median(v), 1) for k, v in rows.items()}


def _json_value(item: str, value: str, flag: str, error):
    """VALUE of a NAME=VALUE item as JSON ("" and None: None); ``error`` otherwise."""
    if value in ("", "None"):
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        error(f"{flag} {item!r}: VALUE is not JSON (true, 132, \"text\")")


def _check_options(options: dict, flag: str, error) -> None:
    """The compile options' names and values checked before any work (``error``)."""
    from vkdelegate.backend.options import parse_options
    from vkdelegate.errors import VkDelegateError

    try:
        parse_options(options)
    except VkDelegateError as exc:
        error(f"{flag}: {exc}")


def _row_plan(scheme: str, options: dict, error) -> tuple:
    """(scheme, format, compile options, kernel forms) of one --quantization row
    ``FORMAT[+NAME=VALUE...]``: a NAME with a dot is a kernel form
    (benchmarks/forms.py), else a compile option; all checked before any work."""
    fmt, *extra = scheme.split("+")
    if fmt not in ("none", "int8", "int4", "8da4w"):
        error(f"--quantization {scheme!r}: unknown format {fmt!r}")
    row_options, forms = dict(options), {}
    for item in extra:
        name, eq, value = item.partition("=")
        if not eq:
            error(f"--quantization {scheme!r}: {item!r} is not NAME=VALUE")
        if "." in name:  # a kernel form: MODULE.CONSTANT of the row's build
            forms[name] = kernel_forms.parse([item], error, "--quantization")[name]
        else:
            row_options[name] = _json_value(item, value, "--quantization", error)
    _check_options(row_options, f"--quantization {scheme!r}", error)
    return scheme, fmt, row_options, forms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32, help="prompt length in tokens")
    add_model_args(ap)
    ap.add_argument("--quantization", nargs="+", default=["none"],
                    help="weight formats to run (none, int8, int4, 8da4w; each on a fresh "
                         "copy of the model; HF eager runs the unquantized model); "
                         "FORMAT+NAME=VALUE[+NAME=VALUE] adds compile options to that "
                         "row, e.g. none+rms_norm_prologue=false, to compare forms in "
                         "one run; a NAME with a dot sets a kernel form's module constant "
                         "for that row's build instead, e.g. "
                         "int4+quantized_linear.VSG_ROWS=true (consecutive rows that "
                         "differ only in kernel forms build one lowering again)")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile one decode step per format: its N costliest ops")
    ap.add_argument("--decode-chunk", type=int, default=16,
                    help="generate's decode steps per submit (decode_next)")
    ap.add_argument("--hold-s", type=float, default=2.0,
                    help="seconds of back-to-back generation before timing each format "
                         "(a GPU idles its clocks down between bursts)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a compile option for every lowering (e.g. "
                         "rms_norm_prologue=false); repeatable")
    ap.add_argument("--sampled", action="store_true",
                    help="also time sampled generation (temperature 0.8, top_k 50, top_p "
                         "0.9: the on-device sampler's search over the vocabulary)")
    ap.add_argument("--hbm-tbps", type=float, default=4.8,
                    help="memory bandwidth for the roofline share (H200 HBM3e: 4.8)")
    ap.add_argument("--memory-baseline", action="store_true",
                    help="also build the first row once with each method's delegates "
                         "holding their own constants (no program constant pool, as "
                         "before 2026-12-06) and print both device-memory totals")
    ap.add_argument("--prefill", type=int, default=0, metavar="N",
                    help="also time the prefill of an N-token prompt per format (ours: "
                         "generate's prefill_s with one new token, median of --runs; "
                         "HF: one eager forward); needs --max-seq-len > N")
    ap.add_argument("--json", default="out/llm_decode.json")
    args = ap.parse_args()
    if args.prefill < 0:
        ap.error(f"--prefill {args.prefill}: a token count, 0 or more")
    if args.prefill and args.prefill >= args.max_seq_len:
        ap.error(f"--prefill {args.prefill} needs --max-seq-len above it "
                 f"({args.max_seq_len} now)")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)

    import copy

    from vkdelegate.llm import lower

    options = {}
    for item in args.option:
        name, _, value = item.partition("=")
        options[name] = _json_value(item, value, "--option", ap.error)
    _check_options(options, "--option", ap.error)
    plans = [_row_plan(scheme, options, ap.error) for scheme in args.quantization]
    model = build(args)
    n_params = sum(p.numel() for p in model.parameters())
    n_linear = linear_params(model)
    itemsize = model.dtype.itemsize
    head_dim = args.hidden // args.heads
    # K and V of every layer up to the mean position of the decode steps.
    mean_pos = args.prompt + args.new_tokens / 2
    kv_bytes = 2 * args.layers * args.kv_heads * head_dim * mean_pos * itemsize
    prompt = torch.randint(1, args.vocab, (args.prompt,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    hbm = args.hbm_tbps * 1e12

    def step_bytes(scheme):
        return n_linear * WEIGHT_BYTES.get(scheme.split("+")[0], itemsize) + kv_bytes

    hf_device = "cuda" if torch.cuda.is_available() else "cpu"
    hf, hf_ids = hf_decode_tps(model, prompt, args.new_tokens, hf_device, args.runs)
    print(f"HF eager generate ({hf_device}): {hf:.1f} decode tokens/s", flush=True)
    long_prompt = torch.randint(1, args.vocab, (args.prefill,),
                                generator=torch.Generator().manual_seed(2)).tolist()
    hf_prefill = hf_prefill_ms(model, long_prompt, hf_device, args.runs) \
        if args.prefill else None
    if hf_prefill is not None:
        print(f"HF eager forward ({hf_device}) over {args.prefill} tokens: "
              f"{hf_prefill:.2f} ms", flush=True)
    device = default_device()
    result = {"machine": platform.node(), "vulkan_device": device.info.name,
              "torch": torch.__version__, "params": n_params, "dtype": args.dtype,
              "layers": args.layers, "new_tokens": args.new_tokens, "prompt": args.prompt,
              "max_seq_len": args.max_seq_len, "hf_tps": hf, "hf_device": hf_device,
              "ours_tps": {}, "lower_s": {}, "build_s": {}, "step_bytes": {},
              "host_bytes_per_step": {}, "cpu_nodes": {}, "tokens_equal_prefix": {},
              "profile": {}, "step_us": {}, "per_token_tps": {},
              "decode_chunk": args.decode_chunk, "hold_s": args.hold_s}
    rows = []
    # The last row's lowered program, kept for the next row when only kernel forms
    # differ (forms are read when a program is built: closed, it builds again).
    kept_key, kept = None, None
    for scheme, fmt, row_options, forms in plans:
        saved_forms = kernel_forms.apply(forms, ap.error, "--quantization")
        key = (fmt, json.dumps(row_options, sort_keys=True))
        t0 = time.perf_counter()
        if key == kept_key:
            program = kept
        else:
            kept = None
            program = lower(copy.deepcopy(model), args.max_seq_len,
                            quantization=None if fmt == "none" else fmt,
                            group_size=None if fmt in ("none", "int8") else args.group_size,
                            options=row_options or None)
            kept_key, kept = key, program
        result["lower_s"][scheme] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        program.build()
        generate(program, prompt, 4)  # warm-up: pipelines, first uploads
        result["build_s"][scheme] = round(time.perf_counter() - t0, 1)
        memory = device_memory(program, n_params * itemsize)
        result.setdefault("device_memory", {})[scheme] = memory
        print(f"device memory ({scheme}): {memory}", flush=True)
        if args.memory_baseline and len(result["device_memory"]) == 1:
            result["device_memory_unpooled"] = unpooled_memory(
                copy.deepcopy(model), args.max_seq_len, fmt, args.group_size,
                row_options, prompt,
                n_params * itemsize)
            print(f"device memory without the constant pool ({scheme}): "
                  f"{result['device_memory_unpooled']}", flush=True)
        hold(program, prompt, args.new_tokens, args.hold_s)
        tps, per_token = [], []
        for _ in range(args.runs):
            for chunk, into in ((args.decode_chunk, tps), (1, per_token)):
                timings: dict = {}
                ids = generate(program, prompt, args.new_tokens, timings=timings,
                               decode_chunk=chunk)
                into.append(timings["decode_tokens"] / timings["decode_s"])
        result["per_token_tps"][scheme] = per_token
        prefill = "-"
        if args.prefill:
            generate(program, long_prompt, 1)  # warm-up at the prompt's sizes
            runs = []
            for _ in range(args.runs):
                timings = {}
                generate(program, long_prompt, 1, timings=timings)
                runs.append(timings["prefill_s"] * 1e3)
            result.setdefault("prefill_ms", {})[scheme] = runs
            prefill = f"{statistics.median(runs):.2f}"
        sampled = "-"
        if args.sampled:
            runs = []
            for _ in range(args.runs):
                timings = {}
                generate(program, prompt, args.new_tokens, temperature=0.8, top_k=50,
                         top_p=0.9, seed=0, timings=timings,
                         decode_chunk=args.decode_chunk)
                runs.append(timings["decode_tokens"] / timings["decode_s"])
            result.setdefault("sampled_tps", {})[scheme] = runs
            sampled = f"{statistics.median(runs):.1f}"
        looped = program.last_transfer("decode_next")
        assert looped["state_upload_bytes"] == looped["state_download_bytes"] == 0, looped
        moved = program.last_transfer("decode")
        host = moved["upload_bytes"] + moved["download_bytes"]
        # No host copy of the cache (or of the logits) in a decode step.
        assert moved["state_upload_bytes"] == moved["state_download_bytes"] == 0, moved
        assert host <= STEP_HOST_BYTES, moved
        ours = statistics.median(tps)
        if fmt == "none":  # greedy fp16 tokens vs HF's on the same weights
            result["tokens_equal_prefix"][scheme] = next(
                (i for i, (a, b) in enumerate(zip(ids, hf_ids)) if a != b), len(ids))
        result["ours_tps"][scheme] = tps
        result["step_bytes"][scheme] = step_bytes(scheme)
        result["host_bytes_per_step"][scheme] = host
        result["cpu_nodes"][scheme] = {k: len(program.methods[k].report.cpu_nodes)
                                       for k in program.method_names}
        name = scheme.replace("none", args.dtype, 1) if fmt == "none" else scheme
        single = statistics.median(per_token)
        rows.append((f"vkdelegate (Vulkan), {name}", f"{ours:.1f}", f"{single:.1f}",
                     sampled, f"{ours / hf:.2f}x",
                     f"{step_bytes(scheme) / 1e9:.3f}",
                     f"{100 * ours * step_bytes(scheme) / hbm:.1f}%", host, prefill))
        print(f"{rows[-1]}; lowering {result['lower_s'][scheme]} s, build "
              f"{result['build_s'][scheme]} s; per step {moved}", flush=True)
        split = step_breakdown(program, prompt, min(args.new_tokens, 48))
        result["step_us"][scheme] = split
        print(f"decode step split ({name}, median us): {split}", flush=True)
        if args.profile:
            prof, total, n, trace = decode_profile(program, prompt, args.profile)
            result["profile"][scheme] = {"gpu_us": total, "dispatches": n, "top": prof,
                                         "trace": trace}
            print(f"decode step ({name}): {n} dispatches, {total:.0f} us GPU time "
                  f"(profiled: a barrier between dispatches)")
            print(tabulate(prof, headers=("op", "dispatches", "GPU us", "share")),
                  flush=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        program.close()
        kernel_forms.apply(saved_forms, ap.error, "--quantization")
    rows.append((f"HF eager generate ({hf_device}), {args.dtype}", f"{hf:.1f}", "-", "-",
                 "1.00x",
                 f"{step_bytes('none') / 1e9:.3f}",
                 f"{100 * hf * step_bytes('none') / hbm:.1f}%", "-",
                 "-" if hf_prefill is None else f"{hf_prefill:.2f}"))
    print(f"\nLlama-shaped decoder, {n_params / 1e9:.2f} B params {args.dtype}, "
          f"{args.layers} layers, prompt {args.prompt}, {args.new_tokens} new tokens, "
          f"cache {args.max_seq_len}; Vulkan device {device.info.name}; torch "
          f"{torch.__version__}; lowering s {result['lower_s']}; build s "
          f"{result['build_s']}; nodes on the CPU per method {result['cpu_nodes']}")
    equal = ", ".join(f"{k.replace('none', args.dtype, 1)} {v} of {args.new_tokens}"
                      for k, v in result["tokens_equal_prefix"].items())
    print(f"roofline at {args.hbm_tbps} TB/s: {hbm / step_bytes('none'):.0f} tokens/s "
          f"({args.dtype}); greedy tokens equal to HF's for the first: "
          f"{equal or 'not checked (no unquantized row: quantized tokens differ from HF)'}")
    print(f"decode tokens/s: {args.decode_chunk} steps per submit (decode_next); "
          f"per-token: one decode call per token (the host between steps)")
    print(tabulate(rows, headers=("backend", "decode tokens/s", "per-token",
                                  "sampled (T 0.8, top-k 50, top-p 0.9)", "vs HF eager",
                                  "GB read / token", "HBM share", "host B / step",
                                  f"prefill {args.prefill} ms" if args.prefill
                                  else "prefill")))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
