"""``vkdelegate demo minilm``: rank sentences by similarity to a query with
all-MiniLM-L6-v2 on Vulkan.

Steps: load the model and tokenizer (``vkdelegate.examples.minilm``), export it with a
dynamic batch and sequence length, lower it (every node on Vulkan, or the report says
which are not), save the program file, load it back, embed the query and the sentences
with the loaded program and with eager PyTorch, and print the ranking with both
scores and the cosine similarity of our embeddings to eager's.
"""
from __future__ import annotations

import os

from vkdelegate.errors import VkDelegateError

QUERY = "A cat is sleeping on the sofa."
SENTENCES = (
    "The kitten naps on the couch.",
    "A dog runs across the park.",
    "Stock markets fell sharply today.",
    "My cat loves sleeping in the sun.",
    "The GPU renders the frame in four milliseconds.",
    "Felines spend most of the day asleep.",
)


def run(args) -> int:
    """The demo; ``args``: the demo parser's namespace (out, device, runs)."""
    import numpy as np
    import torch
    from tabulate import tabulate
    from tqdm import tqdm

    import vkdelegate
    from vkdelegate.examples import minilm
    from vkdelegate.runtime.device import default_device

    device = default_device(args.device).info.name
    out = args.out
    steps = tqdm(total=4, desc="demo", unit="step", leave=False, disable=None)
    try:
        steps.set_description("exporting and lowering")
        lowered, report, model, tokenizer = minilm.lower()
        steps.update(1)
        steps.set_description("saving")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        lowered.save(out)
        lowered.close()
        steps.update(1)
        steps.set_description("loading and building")
        program = vkdelegate.load(out, device=args.device)
        steps.update(1)
        steps.set_description("embedding")
        texts = [QUERY, *SENTENCES]
        ids, mask = minilm.tokenize(tokenizer, texts)
        ours = program(ids, mask).numpy()
        with torch.no_grad():
            eager = model(ids, mask).numpy()
        steps.update(1)
    finally:
        steps.close()
    ranked = minilm.cosine_ranking(ours[0], ours[1:])
    rows = [(rank + 1, SENTENCES[i], f"{score:.5f}", f"{float(eager[1:][i] @ eager[0]):.5f}")
            for rank, (i, score) in enumerate(ranked)]
    cos = (ours * eager).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(eager, axis=1))
    print(f"all-MiniLM-L6-v2, program saved to {out} "
          f"({os.path.getsize(out) / 2**20:.1f} MiB)")
    print(report.summary())
    print(f"query: {QUERY}")
    print(tabulate(rows, headers=("#", "sentence", f"vkdelegate ({device})",
                                  "eager PyTorch (CPU)")))
    print(f"cosine(ours, eager) per sentence: min {cos.min():.7f}")
    program.close()
    if [i for i, _ in ranked] != [i for i, _ in minilm.cosine_ranking(eager[0], eager[1:])]:
        raise VkDelegateError("the ranking differs between vkdelegate and eager PyTorch")
    return 0
