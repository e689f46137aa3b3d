"""vkdelegate.llm: causal LMs (and VLMs) on Vulkan through a 4-method program.

``lower(model, max_seq_len, vision=None, options=None)`` exports and lowers a HF
transformers causal LM (and a vision tower + projector) to a LoweredProgram with the
methods embed_text, prefill, decode (and vision_encoder); ``generate(program,
prompt_ids, max_new_tokens, ...)`` runs them. The KV cache is program state shared
by prefill and decode, kept on the GPU. docs/LLM.md has the contract and an example.
``Session(program).generate(ids, n)`` keeps the cache between the turns of a
conversation. ``generate``, ``Session``, ``draws``, ``splice`` and ``cache_length``
need no torch (a saved program runs without it); the rest (``lower``, ``export_methods``, ``sample``,
``from_pretrained``, ...) need torch (transformers only when ``lower`` runs), and
without it say so in one line when used.
"""
from vkdelegate.llm.generate import cache_length, draws, eos_token_ids, generate, splice
from vkdelegate.llm.session import Session

#: What needs torch: name -> its module in this package.
_NEEDS_TORCH = {"lower": "lower", "export_methods": "lower", "from_pretrained": "pretrained",
                "load_causal_lm": "pretrained", "ReferenceDecoder": "reference_decoder",
                "sample": "sampler"}

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError:
    _torch = None

if _torch is not None:
    from vkdelegate.llm.lower import export_methods, lower
    from vkdelegate.llm.pretrained import from_pretrained, load_causal_lm
    from vkdelegate.llm.reference_decoder import ReferenceDecoder
    from vkdelegate.llm.sampler import sample
else:
    def __getattr__(name):
        if name not in _NEEDS_TORCH:
            raise AttributeError(f"module 'vkdelegate.llm' has no attribute {name!r}")
        raise ModuleNotFoundError(
            f"vkdelegate.llm.{name} needs the Python package 'torch', which is not "
            f"installed (pip install 'vkdelegate[torch]'); generate() and the methods "
            f"of a saved program run without it (docs/LLM.md)", name="torch")

__all__ = ["lower", "export_methods", "generate", "draws", "splice", "sample",
           "cache_length", "eos_token_ids", "Session", "from_pretrained", "load_causal_lm",
           "ReferenceDecoder"]
