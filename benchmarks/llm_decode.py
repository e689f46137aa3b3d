"""LLM decode speed: vkdelegate.llm (KV cache on the GPU, sampling on the device) vs
HF transformers eager ``generate`` (CUDA when present, else CPU), same model, same
prompt, greedy, in one run.

The model is transformers' LlamaForCausalLM with seeded random weights, shaped like
Llama-3.2-1B by default (hidden 2048, 16 layers, 32 heads / 8 KV heads, FFN 8192,
vocab 128256, tied embeddings), fp16 (``--dtype``). ``--layers``/``--hidden``/
``--vocab`` shrink it (lavapipe). Decode tokens/s: ours from ``generate``'s timings
(decode calls only); HF's from the time of ``generate`` with N new tokens minus the
time with 1 (its prefill), both with a static number of tokens (min_new_tokens).
"HBM share": weight bytes read per decode step x tokens/s over ``--hbm-tbps``
(H200: 4.8 TB/s); the KV cache read is added. Prints a table and writes JSON.

    python benchmarks/llm_decode.py [--new-tokens 64] [--prompt 32] [--layers 16]
        [--dtype float16] [--max-seq-len 256] [--quantization none int8 int4] [--json F]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from tabulate import tabulate

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
    with torch.no_grad():  # seeded weights at a scale that keeps fp16 finite
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    return model.to(getattr(torch, args.dtype))


def hf_decode_tps(model, prompt, new_tokens: int, device: str, runs: int) -> tuple:
    """(decode tokens/s, token ids) of HF eager generate on ``device``."""
    model = model.to(device)
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
    return (new_tokens - 1) / max(t - one, 1e-9), full[-1][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32, help="prompt length in tokens")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--quantization", nargs="+", default=["none"],
                    choices=["none", "int8", "int4", "8da4w"],
                    help="weight formats to run (each on a fresh copy of the model; HF "
                         "eager runs the unquantized model)")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hbm-tbps", type=float, default=4.8,
                    help="memory bandwidth for the roofline share (H200 HBM3e: 4.8)")
    ap.add_argument("--json", default="llm_decode.json")
    args = ap.parse_args()

    from vkdelegate.llm import generate, lower

    model = build(args)
    n_params = sum(p.numel() for p in model.parameters())
    weight_bytes = n_params * model.dtype.itemsize
    head_dim = args.hidden // args.heads
    # K and V of every layer up to the mean position of the decode steps.
    mean_pos = args.prompt + args.new_tokens / 2
    kv_bytes = 2 * args.layers * args.kv_heads * head_dim * mean_pos * model.dtype.itemsize
    step_bytes = weight_bytes + kv_bytes
    prompt = torch.randint(1, args.vocab, (args.prompt,),
                           generator=torch.Generator().manual_seed(1)).tolist()

    import copy

    rows, ours_all, ours_ids, cpu_nodes, lower_s = [], {}, None, {}, {}
    for scheme in args.quantization:
        m = model if scheme == "none" else copy.deepcopy(model)
        t0 = time.perf_counter()
        program = lower(m, args.max_seq_len,
                        quantization=None if scheme == "none" else scheme,
                        group_size=args.group_size)
        lower_s[scheme] = time.perf_counter() - t0
        program.build()
        generate(program, prompt, 4)  # warm-up: pipelines, first uploads
        tps = []
        for _ in range(args.runs):
            timings: dict = {}
            ids = generate(program, prompt, args.new_tokens, timings=timings)
            tps.append(timings["decode_tokens"] / timings["decode_s"])
        if scheme == "none":
            ours_ids = ids
        ours_all[scheme] = tps
        cpu_nodes[scheme] = {k: len(program.methods[k].report.cpu_nodes)
                             for k in program.method_names}
        program.close()
        del m
    hf_device = "cuda" if torch.cuda.is_available() else "cpu"
    hf, hf_ids = hf_decode_tps(model, prompt, args.new_tokens, hf_device, args.runs)
    same = None if ours_ids is None else next(
        (i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b), len(ours_ids))
    roof = args.hbm_tbps * 1e12 / step_bytes
    for scheme, tps in ours_all.items():
        ours = statistics.median(tps)
        # Weight bytes read per step shrink with the format (scales not counted).
        per_weight = {"none": model.dtype.itemsize, "int8": 1, "int4": 0.5, "8da4w": 0.5}
        scheme_bytes = n_params * per_weight[scheme] + kv_bytes
        rows.append((f"vkdelegate (Vulkan), {scheme if scheme != 'none' else args.dtype}",
                     f"{ours:.1f}", f"{ours / hf:.2f}x",
                     f"{100 * ours * scheme_bytes / (args.hbm_tbps * 1e12):.1f}%"))
    rows.append((f"HF eager generate ({hf_device}), {args.dtype}", f"{hf:.1f}", "1.00x",
                 f"{100 * hf / roof:.1f}%"))
    device = default_device()
    print(f"\nLlama-shaped decoder, {n_params / 1e9:.2f} B params {args.dtype}, "
          f"{args.layers} layers, prompt {args.prompt}, {args.new_tokens} new tokens; "
          f"Vulkan device {device.info.name}; lowering s {lower_s}; nodes on the CPU "
          f"per method {cpu_nodes}")
    print(f"bytes per decode step ({args.dtype}) {step_bytes / 1e9:.3f} GB -> roofline "
          f"{roof:.0f} tokens/s at {args.hbm_tbps} TB/s; greedy tokens ({args.dtype}) equal "
          f"to HF for the first {same} of {args.new_tokens}")
    print(tabulate(rows, headers=("backend", "decode tokens/s", "vs HF eager",
                                  "share of roofline")))
    with open(args.json, "w") as f:
        json.dump({"machine": platform.node(), "vulkan_device": device.info.name,
                   "params": n_params, "dtype": args.dtype, "layers": args.layers,
                   "ours_tps": ours_all, "hf_tps": hf, "hf_device": hf_device,
                   "step_bytes": step_bytes, "roofline_tps": roof,
                   "tokens_equal_prefix": same, "cpu_nodes": cpu_nodes,
                   "lower_s": lower_s}, f, indent=2)


if __name__ == "__main__":
    main()
