"""``vkdelegate chat PROGRAM --tokenizer FOLDER [--system TEXT]``: a conversation with a
program ``vkdelegate.llm.lower`` saved, one message per line of stdin.

Each message is added to the conversation, the checkpoint's chat template
(vkdelegate/llm/chat.py) renders the whole conversation with the assistant's header,
and the reply streams as it is made, up to the model's end-of-sequence id (or
``--max-new-tokens``); it joins the conversation for the next turn. The KV cache
stays on the device between turns (``vkdelegate.llm.Session``): a turn prefills only
what follows the tokens the cache already holds. ``/reset`` starts a new conversation,
``/exit`` (or the end of stdin) ends. After each reply a line on stderr gives the
tokens prefilled (and reused from the cache), the decode rate and how full the cache
is. A reply stops at ``--max-new-tokens`` or where the cache (the program's
max_seq_len) is full (without ``--max-new-tokens``: at 256 tokens or half the room
left, whichever is less); a message that leaves no room, or that the template refuses, is
dropped with the reason, and the chat goes on.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from vkdelegate.cli import device_index, help_description
from vkdelegate.errors import VkDelegateError

#: --max-new-tokens when not given: a reply's length at most (and at most half the
#: cache's room left, so that the next message fits too).
DEFAULT_MAX_NEW = 256


def register(subparsers) -> None:
    p = subparsers.add_parser("chat", help="chat with a lowered LLM (one message a line)",
                              description=help_description(__doc__))
    p.add_argument("program", help="program file of vkdelegate.llm.lower, saved")
    p.add_argument("--tokenizer", required=True, metavar="FOLDER",
                   help="the checkpoint folder: tokenizer.json and the chat template "
                        "(chat_template.jinja or tokenizer_config.json)")
    p.add_argument("--system", metavar="TEXT", help="a system message first")
    p.add_argument("--device", type=device_index, help="Vulkan device index (vkdelegate devices)")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help=f"tokens of a reply at most, and at most the cache's room "
                        f"(default: {DEFAULT_MAX_NEW}, and at most half the room left, so "
                        f"that the conversation can go on)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 (default): all tokens")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus mass to keep, 0..1 (default 1: all tokens)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the first reply's draws (the n-th reply: seed + n)")
    p.set_defaults(func=run)


def run(args) -> int:
    import vkdelegate
    from vkdelegate.cli.generate import TokenStream, load_tokenizer, note_vocab_mismatch
    from vkdelegate.llm import Session
    from vkdelegate.llm.chat import load_template, render

    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise VkDelegateError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    folder = Path(args.tokenizer)
    tokenizer = load_tokenizer(folder)
    template, specials = load_template(folder)
    from vkdelegate.llm import cache_length

    program = vkdelegate.load(args.program, device=args.device)
    note_vocab_mismatch(tokenizer, program)
    session = Session(program)
    max_seq_len = cache_length(program)
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    messages = list(system)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"chatting with {args.program} ({max_seq_len} cache positions); one message "
              f"a line, /reset starts over, /exit or Ctrl-D ends", file=sys.stderr)
    turn = 0
    try:
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() == "/exit":
                break
            text = line.rstrip("\n")
            if text.strip() == "/reset":
                messages = list(system)
                session.reset()
                print("(a new conversation)", file=sys.stderr, flush=True)
                continue
            if not text.strip():
                continue
            messages.append({"role": "user", "content": text})
            try:
                prompt = render(template, messages, specials,
                                where=f"chat template of {folder}")
            except VkDelegateError as exc:  # the template refused this conversation
                messages.pop()
                print(f"vkdelegate chat: {exc}; the message was dropped", file=sys.stderr,
                      flush=True)
                continue
            ids = tokenizer.encode(prompt, add_special_tokens=False).ids
            # A reply gets what is left of the cache (the last new token is not stored);
            # without --max-new-tokens, half of it, so that the chat can go on.
            left = max_seq_len - len(ids) + 1
            room = min(args.max_new_tokens, left) if args.max_new_tokens is not None \
                else min(DEFAULT_MAX_NEW, max(1, left // 2), left)
            if room < 1:
                messages.pop()
                print(f"vkdelegate chat: the conversation ({len(ids)} tokens with this "
                      f"message) does not fit the KV cache ({max_seq_len} positions, the "
                      f"program's max_seq_len); the message was dropped; /reset starts a "
                      f"new conversation", file=sys.stderr, flush=True)
                continue
            stream = TokenStream(tokenizer)
            timings: dict = {}
            start = time.perf_counter()
            session.generate(ids, room, temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, seed=args.seed + turn, on_token=stream.add,
                             timings=timings)
            print(flush=True)
            messages.append({"role": "assistant", "content": tokenizer.decode(stream.ids)})
            turn += 1
            rate = (f", {timings['decode_tokens'] / max(timings['decode_s'], 1e-9):.1f} "
                    f"tokens/s decode" if timings["decode_tokens"] else "")
            print(f"[{timings['prompt_tokens']} tokens prefilled, {session.reused} reused; "
                  f"{len(stream.ids)} new{rate}; {time.perf_counter() - start:.2f} s; "
                  f"cache {len(ids) + len(stream.ids) - 1} of {max_seq_len}]",
                  file=sys.stderr, flush=True)
    finally:
        program.close()
    return 0
