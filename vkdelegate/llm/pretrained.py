"""``from_pretrained``: lower a local HF checkpoint folder (config.json + weights).

Nothing is downloaded: ``local_files_only=True``. The folder is what
``model.save_pretrained(folder)`` writes (or a checkpoint copied from elsewhere);
its tokenizer.json, when present, is what ``vkdelegate generate --tokenizer`` takes.
"""
from __future__ import annotations

import os

from vkdelegate.errors import VkDelegateError


def load_causal_lm(folder, dtype=None):
    """The transformers ``AutoModelForCausalLM`` in ``folder`` (eval mode; ``dtype``:
    a torch dtype, None: the checkpoint's). Raises VkDelegateError for a folder
    without a config.json or a model transformers cannot load."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise VkDelegateError(f"{folder}: not a HF checkpoint folder (no config.json)")
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                     dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - a bad checkpoint is the user's input
        # OSError / ValueError / KeyError from transformers, safetensors'
        # SafetensorError for a truncated or corrupt weights file, ...
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise VkDelegateError(f"{folder}: cannot load the model ({type(exc).__name__}: "
                              f"{first[:300]})") from exc
    return model.eval()


def from_pretrained(folder, max_seq_len: int, *, dtype=None, vision=None, options=None,
                    quantization: "str | None" = None, group_size: "int | None" = None):
    """``lower(load_causal_lm(folder, dtype), max_seq_len, vision=, options=,
    quantization=, group_size=)``: a LoweredProgram with embed_text, prefill and decode
    (see ``vkdelegate.llm.lower``; ``vkdelegate lower-llm`` on the command line)."""
    from vkdelegate.llm.lower import lower

    return lower(load_causal_lm(folder, dtype), max_seq_len, vision=vision,
                 options=options, quantization=quantization, group_size=group_size)
