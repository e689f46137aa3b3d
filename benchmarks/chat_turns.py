"""Multi-turn chat latency: ``vkdelegate.llm.Session`` (the KV cache kept between
turns: each turn prefills only its new tokens) against ``generate`` on the whole
conversation each turn (what a caller without the session does) and HF transformers
eager ``generate`` on the whole conversation (CUDA when present, else CPU), same
model, greedy, in one run.

The model is llm_decode.py's seeded Llama (``--layers`` ... shrink it for lavapipe).
Each turn appends ``--message`` new tokens to the conversation (and the previous
reply), then makes ``--reply`` tokens. Per turn: the conversation's length, the tokens
each way prefills, and the median time to the first new token (prefill) and to the
whole reply (ms), over ``--runs`` repetitions of the whole conversation.

    python benchmarks/chat_turns.py [--turns 4] [--message 48] [--reply 16]
        [--layers 16] [--dtype float16] [--max-seq-len 512] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from tabulate import tabulate

from llm_decode import add_model_args, build
from vkdelegate.llm import Session, generate, lower
from vkdelegate.runtime.device import default_device


def _turn_ids(turn: int, n: int, vocab: int) -> list:
    g = torch.Generator().manual_seed(100 + turn)
    return torch.randint(1, vocab, (n,), generator=g).tolist()


def _hf_times(model, conversation: list, reply: int, device: str) -> tuple:
    """(ms to the first token, ms to the whole reply) of HF eager generate."""
    ids = torch.tensor([conversation], device=device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    times = []
    for n in (1, reply):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return tuple(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--message", type=int, default=48, help="new tokens a turn")
    ap.add_argument("--reply", type=int, default=16, help="tokens a reply")
    add_model_args(ap, max_seq_len=512)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    need = args.turns * (args.message + args.reply)
    if need > args.max_seq_len:
        ap.error(f"{args.turns} turns of {args.message} + {args.reply} tokens need "
                 f"{need} cache positions; --max-seq-len is {args.max_seq_len}")

    model = build(args)
    program = lower(model, args.max_seq_len)
    program.build()
    generate(program, [1, 2, 3], 2)  # warm-up: pipelines, first uploads
    hf_device = "cuda" if torch.cuda.is_available() else "cpu"
    hf_model = model.to(hf_device)

    rows: list = [[] for _ in range(args.turns)]
    for run in range(args.runs):
        session = Session(program)
        conversation: list = []
        for turn in range(args.turns):
            conversation = conversation + _turn_ids(turn, args.message, args.vocab)
            timing: dict = {}
            start = time.perf_counter()
            reply = session.generate(conversation, args.reply, eos_token_id=[],
                                     timings=timing)
            whole = 1e3 * (time.perf_counter() - start)
            ours = (1e3 * timing["prefill_s"], whole, timing["prompt_tokens"])
            program.reset_state()
            timing = {}
            start = time.perf_counter()
            again = generate(program, conversation, args.reply, eos_token_id=[],
                             timings=timing)
            fresh = (1e3 * timing["prefill_s"], 1e3 * (time.perf_counter() - start))
            assert again == reply, f"turn {turn}: the session's reply differs"
            session.reset()  # the fresh run overwrote the cache: the next turn reuses
            session.generate(conversation, args.reply, eos_token_id=[])  # ... this one
            hf = _hf_times(hf_model, conversation, args.reply, hf_device) if run == 0 \
                else rows[turn][0][3]
            rows[turn].append((ours, fresh, len(conversation), hf))
            conversation = conversation + reply
    table = []
    for turn, samples in enumerate(rows):
        med = lambda f: statistics.median(f(s) for s in samples)  # noqa: E731
        table.append([turn + 1, samples[0][2], samples[0][0][2],
                      f"{med(lambda s: s[0][0]):.1f}", f"{med(lambda s: s[0][1]):.1f}",
                      f"{med(lambda s: s[1][0]):.1f}", f"{med(lambda s: s[1][1]):.1f}",
                      f"{samples[0][3][0]:.1f}", f"{samples[0][3][1]:.1f}"])
    print(f"{args.layers}-layer Llama-shaped model, {args.dtype}, hidden {args.hidden}, "
          f"vocab {args.vocab}; Vulkan device {default_device().info.name}; HF eager on "
          f"{hf_device}; {args.message} new tokens a turn, {args.reply}-token replies, "
          f"median of {args.runs} (HF: one run)")
    print(tabulate(table, headers=["turn", "conversation", "session prefills",
                                   "session first ms", "session reply ms",
                                   "whole first ms", "whole reply ms",
                                   "HF first ms", "HF reply ms"]))


if __name__ == "__main__":
    main()
