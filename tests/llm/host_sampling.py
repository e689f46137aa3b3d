"""Host-side sampling, written independently of vkdelegate.llm.sampler (numpy,
float64) from the rule of issue 14: after temperature keep the top_k most likely
(0 = all), then the smallest set whose mass reaches top_p, renormalise, and take the
first token (descending probability) whose cumulative probability exceeds the draw."""
import numpy as np


def host_sample(logits, temperature: float, top_k: int, top_p: float, draw: float) -> int:
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    kept = p[order] / p[order].sum()
    reach = np.flatnonzero(np.cumsum(kept) >= top_p)
    n = int(reach[0]) + 1 if reach.size else kept.size
    order, kept = order[:n], kept[:n] / kept[:n].sum()
    above = np.flatnonzero(np.cumsum(kept) > draw)
    return int(order[above[0]] if above.size else order[-1])
