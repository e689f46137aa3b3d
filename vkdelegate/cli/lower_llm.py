"""``vkdelegate lower-llm FOLDER -o PROGRAM --max-seq-len N [--dtype D] [--quantization
Q [--group-size G]]``: lower a local HF causal-LM checkpoint folder (what
``save_pretrained`` writes: config.json and the weights; nothing is downloaded) to one
program file with the methods embed_text, prefill, decode and decode_next
(``vkdelegate.llm.lower``), and save it. Prints each method's partition summary (what
stays on the CPU, if anything), the file's size, the end-of-sequence ids it records and
the ``vkdelegate generate`` command that runs it.
"""
from __future__ import annotations

import os
import sys
import time

from vkdelegate.cli import help_description
from vkdelegate.errors import VkDelegateError

DTYPES = ("auto", "float32", "float16", "bfloat16")
SCHEMES = ("none", "int8", "int4", "8da4w")


def register(sub) -> None:
    p = sub.add_parser("lower-llm", help="lower a local HF causal-LM checkpoint folder "
                                         "to a program file",
                       description=help_description(__doc__))
    p.add_argument("folder", metavar="FOLDER", help="HF checkpoint folder (config.json, "
                                                    "weights)")
    p.add_argument("-o", "--output", required=True, metavar="PROGRAM",
                   help="program file to write")
    p.add_argument("--max-seq-len", type=int, required=True, metavar="N",
                   help="KV cache positions (prompt + new tokens), >= 2")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weights' dtype (default: the checkpoint's; bfloat16 computes "
                        "as float32 on the device)")
    p.add_argument("--quantization", choices=SCHEMES, default="none",
                   help="weight quantization with torchao (needs the quant extra)")
    p.add_argument("--group-size", type=int, choices=(32, 64, 128, 256), default=None,
                   help="input features per scale for int4 / 8da4w (default 32); a "
                        "linear whose input features are not a multiple stays in float")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.max_seq_len < 2:
        raise VkDelegateError(f"--max-seq-len must be >= 2, got {args.max_seq_len}")
    if args.group_size is not None and args.quantization not in ("int4", "8da4w"):
        raise VkDelegateError(f"--group-size applies to --quantization int4 and 8da4w, "
                              f"not {args.quantization}")
    if not os.path.isdir(args.folder):
        raise VkDelegateError(f"{args.folder}: not a folder")
    # Said before the slow steps, not after them.
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise VkDelegateError(f"cannot write {args.output}: folder {out_dir} does not exist")
    if os.path.isdir(args.output):
        raise VkDelegateError(f"cannot write {args.output}: it is a folder (give a file "
                              f"name, e.g. {os.path.join(args.output, 'program.vkp')})")
    from vkdelegate.serialization.program_file import check_overwrite

    check_overwrite(args.output)  # a checkpoint's own weights, say: before the slow steps
    import torch

    from vkdelegate.llm import eos_token_ids, lower
    from vkdelegate.llm.pretrained import load_causal_lm

    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    start = time.perf_counter()
    print(f"loading {args.folder} ...", file=sys.stderr, flush=True)
    model = load_causal_lm(args.folder, dtype)
    name = type(model).__name__
    if not name.endswith("ForCausalLM"):
        print(f"note: {name} is not a *ForCausalLM; vkdelegate.llm.lower takes "
              f"decoder-only causal LMs (Llama, Qwen2/3, Mistral, Gemma, ...)",
              file=sys.stderr)
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and args.max_seq_len > positions:
        print(f"note: --max-seq-len {args.max_seq_len} is past the model's "
              f"max_position_embeddings {positions}", file=sys.stderr)
    params = sum(p.numel() for p in model.parameters())
    print(f"lowering {type(model).__name__} ({params / 1e6:.1f} M parameters, "
          f"{next(model.parameters()).dtype}) with a cache of {args.max_seq_len} "
          f"positions ...", file=sys.stderr, flush=True)
    # A linear the group size does not divide stays in float: lower warns, naming it.
    program = lower(model, args.max_seq_len, quantization=args.quantization,
                    group_size=args.group_size)
    for name in program.method_names:
        report = program.methods[name].report
        print(f"  {name}: {report.summary() if report is not None else '-'}")
    program.save(args.output)
    size = os.path.getsize(args.output)
    eos = eos_token_ids(program)
    print(f"wrote {args.output} ({size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s; "
          f"end-of-sequence ids {eos or 'none'}")
    if os.path.isfile(os.path.join(args.folder, "tokenizer.json")):
        print(f"run it: vkdelegate generate {args.output} --prompt TEXT --tokenizer "
              f"{args.folder} [--chat]")
    else:  # a checkpoint without a tokenizer: token ids
        print(f"run it: vkdelegate generate {args.output} --prompt-ids 1,2,3 (the folder "
              f"has no tokenizer.json for --prompt TEXT)")
    program.close()
    return 0
