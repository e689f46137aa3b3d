"""vkdelegate.llm: causal LMs (and VLMs) on Vulkan through a 4-method program.

``lower(model, max_seq_len, vision=None, options=None)`` exports and lowers a HF
transformers causal LM (and a vision tower + projector) to a LoweredProgram with the
methods embed_text, prefill, decode (and vision_encoder); ``generate(program,
prompt_ids, max_new_tokens, ...)`` runs them. The KV cache is program state shared
by prefill and decode, kept on the GPU. docs/LLM.md has the contract and an example.
Importing this package imports torch (transformers only when ``lower`` runs).
"""
try:
    import torch  # noqa: F401
except ModuleNotFoundError as exc:  # one clear line, not a traceback from deep inside
    raise ModuleNotFoundError(
        "vkdelegate.llm needs the Python package 'torch' (pip install "
        "'vkdelegate[torch]'): lower exports with torch.export, and generate draws its "
        "random numbers with torch.Generator so that a run equals host-side sampling. "
        "Without torch a saved LLM program still runs through its methods "
        "(program.run('prefill', ...), docs/LLM.md)", name="torch") from exc
from vkdelegate.llm.generate import draws, generate, splice
from vkdelegate.llm.lower import cache_length, export_methods, lower
from vkdelegate.llm.pretrained import from_pretrained, load_causal_lm
from vkdelegate.llm.reference_decoder import ReferenceDecoder
from vkdelegate.llm.sampler import sample

__all__ = ["lower", "export_methods", "generate", "draws", "splice", "sample",
           "cache_length", "from_pretrained", "load_causal_lm",
           "ReferenceDecoder"]
