"""``vkdelegate generate PROGRAM (--prompt TEXT --tokenizer tokenizer.json [--chat
[--system TEXT]] | --prompt-ids 1,2,3)``: generate tokens with a program
``vkdelegate.llm.lower`` saved. ``--chat`` makes the prompt a user message under the
checkpoint's chat template (vkdelegate/llm/chat.py), as an instruct model expects.

Tokens are streamed as they are made: the text (decoded with the tokenizer) with
``--prompt``, the new ids on one line, space-separated, with ``--prompt-ids``, up to
the model's end-of-sequence id (``--eos-token-id`` names others, ``--ignore-eos``
none). Then the prefill and decode rates (tokens/s) go to stderr. ``--image PATH`` (with
``--image-token-id``) runs the program's vision_encoder on the picture, cut into
square RGB patches of the size its pixel_values input has, and splices the soft
tokens in place of the placeholder (see ``vkdelegate.llm.generate``).
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from vkdelegate.cli import device_index, help_description
from vkdelegate.errors import VkDelegateError

#: --max-new-tokens when not given.
DEFAULT_MAX_NEW = 32


def _ids(text: str) -> list[int]:
    """Token ids separated by commas and/or spaces ("1,2,3", "1, 2, 3", "1 2 3"); one
    trailing comma is harmless. Each is an optionally signed decimal integer (int()'s
    underscores and the like are not ids)."""
    parts = re.split(r"\s*,\s*|\s+", text.strip())
    if parts and parts[-1] == "":
        parts.pop()
    if not parts or parts == [""]:
        raise VkDelegateError("--prompt-ids: no token ids given")
    if not all(re.fullmatch(r"[+-]?[0-9]+", t) for t in parts):
        raise VkDelegateError(f"--prompt-ids {text!r}: expected integers separated by "
                              f"commas or spaces, e.g. 1,2,3")
    return [int(t) for t in parts]


def load_tokenizer(path: Path):
    """The HF ``tokenizers.Tokenizer`` of tokenizer.json ``path`` (or of a folder
    holding one); VkDelegateError naming the path when there is none or it is not a
    tokenizers file."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise VkDelegateError(f"--tokenizer {path}: " + (
            "the folder has no tokenizer.json" if path.is_dir() else "no such file"))
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises its own Exception type
        raise VkDelegateError(f"--tokenizer {file}: not a HF tokenizers file; give "
                              f"tokenizer.json or the checkpoint folder holding it "
                              f"({exc})") from exc


class TokenStream:
    """Prints new token ids as they come (``add``): with a tokenizer the text they
    decode to so far (the part not printed yet: a token may change how the ones
    before it decode), else the ids, space-separated. ``ids``: those added."""

    def __init__(self, tokenizer=None):
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def add(self, token: int) -> None:
        self.ids.append(token)
        if self.tokenizer is None:
            print(("" if len(self.ids) == 1 else " ") + str(token), end="", flush=True)
        else:
            text = self.tokenizer.decode(self.ids)
            print(text[len(self.shown):], end="", flush=True)
            self.shown = text


def _eos(args):
    """generate's eos_token_id: [] with --ignore-eos, None (the model's) without
    --eos-token-id, else the one id (an int, so that a bad one is named as given) or
    the list."""
    if args.ignore_eos:
        return []
    ids = args.eos_token_id
    return ids[0] if ids and len(ids) == 1 else ids


def image_patches(path: str, plan: dict):
    """(pixel_values [1, P, 3*p*p], pixel_position_ids [1, P, 2]) of the picture at
    ``path`` for a vision_encoder whose plan is ``plan``: resized to the largest
    square grid of p x p patches with at most the P the method allows, values in
    [0, 1], patches in row-major order, channels first within a patch."""
    import numpy as np
    from PIL import Image

    spec = plan["inputs"][0]
    patch_dim = spec["shape"][-1]
    side = math.isqrt(patch_dim // 3) if isinstance(patch_dim, int) else 0
    if side == 0 or 3 * side * side != patch_dim:
        raise VkDelegateError(f"vision_encoder takes patches of {patch_dim} values, not "
                              f"3 x p x p RGB")
    count = spec["shape"][1]
    if isinstance(count, dict):
        count = plan.get("ranges", {}).get(count.get("sym"), [0, None])[1]
    grid = math.isqrt(int(count or 1))
    try:
        picture = Image.open(path).convert("RGB").resize((grid * side, grid * side))
    except OSError as exc:
        raise VkDelegateError(f"--image {path}: cannot read it ({exc})") from exc
    pixels = np.asarray(picture, dtype=np.float32) / 255.0           # [H, W, 3]
    pixels = pixels.reshape(grid, side, grid, side, 3).transpose(0, 2, 4, 1, 3)
    values = np.ascontiguousarray(pixels.reshape(1, grid * grid, patch_dim))
    positions = np.array([[(r, c) for r in range(grid) for c in range(grid)]],
                         dtype=np.int64)
    return values, positions


def note_vocab_mismatch(tokenizer, program) -> None:
    """A note on stderr when the tokenizer's vocabulary differs in size from the
    program's (``lower`` recorded it): most likely another model's tokenizer, whose
    ids decode to the wrong text or to nothing. Only a note: a checkpoint's embedding
    table may be padded past its tokenizer's ids."""
    from vkdelegate.backend import llm_checks

    if tokenizer is None or "embed_text" not in program.method_names:
        return
    ours = llm_checks.vocab_size(program.methods["embed_text"].plan)
    theirs = tokenizer.get_vocab_size(with_added_tokens=True)
    if ours is not None and ours != theirs:
        print(f"note: the tokenizer has {theirs} ids and the program's vocabulary "
              f"{ours}: is it this model's tokenizer? (ids it does not know decode to "
              f"nothing)", file=sys.stderr)


def run(args) -> int:
    import vkdelegate
    from vkdelegate.llm import generate

    if (args.prompt is None) == (args.prompt_ids is None):
        raise VkDelegateError("give --prompt TEXT (with --tokenizer) or --prompt-ids")
    tokenizer = None
    if (args.chat or args.system is not None) and args.prompt is None:
        raise VkDelegateError("--chat and --system take --prompt TEXT (with --tokenizer)")
    if args.system is not None and not args.chat:
        raise VkDelegateError("--system needs --chat (it is a message of the chat template)")
    if args.prompt is not None:
        if not args.tokenizer:
            raise VkDelegateError("--prompt needs --tokenizer tokenizer.json")
        path = Path(args.tokenizer)
        tokenizer = load_tokenizer(path)
        if args.chat:
            from vkdelegate.llm.chat import chat_prompt

            text = chat_prompt(path, args.prompt, system=args.system)
            # The template wrote the special tokens (a BOS among them): none added.
            ids = tokenizer.encode(text, add_special_tokens=False).ids
        else:
            ids = tokenizer.encode(args.prompt).ids
        if not ids:
            raise VkDelegateError(f"--prompt {args.prompt!r} encodes to no tokens")
    else:
        ids = _ids(args.prompt_ids)
    if args.ignore_eos and args.eos_token_id:
        raise VkDelegateError("give --eos-token-id or --ignore-eos, not both")
    if args.image and args.image_token_id is None:
        raise VkDelegateError("--image needs --image-token-id (the placeholder id)")
    program = vkdelegate.load(args.program, device=args.device)
    note_vocab_mismatch(tokenizer, program)
    image = None
    if args.image:
        if "vision_encoder" not in program.method_names:
            raise VkDelegateError(f"{args.program} has no vision_encoder method")
        image = image_patches(args.image, program.methods["vision_encoder"].plan)
    stream = TokenStream(tokenizer)

    timings: dict = {}
    max_new = DEFAULT_MAX_NEW if args.max_new_tokens is None else args.max_new_tokens
    try:
        generate(program, ids, max_new, temperature=args.temperature,
                 top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                 eos_token_id=_eos(args), image=image,
                 image_token_id=args.image_token_id, on_token=stream.add, timings=timings,
                 **({} if args.decode_chunk is None else {"decode_chunk": args.decode_chunk}))
    except VkDelegateError as exc:
        if args.max_new_tokens is None and str(exc).startswith("max_new_tokens"):
            raise VkDelegateError(f"{exc} (--max-new-tokens was not given: its default "
                                  f"is {DEFAULT_MAX_NEW}; pass a smaller N)") from exc
        raise
    print(flush=True)
    if not timings["prompt_tokens"]:  # --max-new-tokens 0: nothing ran
        program.close()
        return 0
    prefill = timings["prompt_tokens"] / max(timings["prefill_s"], 1e-9)
    decode = timings["decode_tokens"] / max(timings["decode_s"], 1e-9)
    print(f"prefill: {timings['prompt_tokens']} tokens, {prefill:.1f} tokens/s; decode: "
          f"{timings['decode_tokens']} tokens, {decode:.1f} tokens/s", file=sys.stderr)
    program.close()
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate tokens with a lowered LLM",
                              description=help_description(__doc__))
    p.add_argument("program", help="program file of vkdelegate.llm.lower, saved")
    p.add_argument("--prompt", help="prompt text (needs --tokenizer)")
    p.add_argument("--tokenizer", metavar="tokenizer.json",
                   help="HF tokenizers file (or the checkpoint folder holding it) that "
                        "encodes --prompt and decodes the output")
    p.add_argument("--chat", action="store_true",
                   help="--prompt is a user message: apply the checkpoint's chat template "
                        "(chat_template.jinja or tokenizer_config.json beside the "
                        "tokenizer; needs jinja2)")
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    p.add_argument("--prompt-ids", metavar="1,2,3", help="prompt token ids")
    p.add_argument("--device", type=device_index,
                   help="Vulkan device index (vkdelegate devices)")
    p.add_argument("--image", metavar="PATH", help="a picture for the vision_encoder")
    p.add_argument("--image-token-id", type=int, help="the image placeholder token id")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help=f"tokens to generate at most (default {DEFAULT_MAX_NEW})")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 (default): all tokens")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus mass to keep, 0..1 (default 1: all tokens)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sampling draws (default 0; a sampled run with the "
                        "same seed gives the same tokens)")
    p.add_argument("--eos-token-id", type=int, action="append", metavar="ID",
                   help="stop after this token (repeatable; default: the model's "
                        "end-of-sequence ids, recorded by vkdelegate.llm.lower)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="make all --max-new-tokens, whatever ids come")
    p.add_argument("--decode-chunk", type=int, metavar="N",
                   help="decode steps per submit on the device (decode_next; tokens "
                        "stream N at a time; 1: one decode call per token; default: "
                        "generate's, 16)")
    p.set_defaults(func=run)
