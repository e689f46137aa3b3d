"""The custom ops of LLM decoding: KV-cache writes, ExecuTorch's rotary embedding, the
on-device sampler and the decode loop's sampling step (declared through
``custom_ops.declare_custom_op``; imported by custom_ops, so ``CUSTOM_OPS`` always
holds them). Vulkan kernels:
``ops/families/cache_update.py``, ``rotary.py``, ``sample.py``.
"""
from __future__ import annotations

from vkdelegate.backend.custom_ops import declare_custom_op


def _slice_scatter_at(x, src, dim, start):
    import torch

    # index_copy keeps every size independent of start's value (fake tensors, export)
    # and raises for a row outside the tensor, as the Vulkan kernel does.
    rows = start.reshape(-1)[:1].to(torch.int64) + torch.arange(src.size(dim))
    return x.index_copy(dim, rows, src)


def _same_as_self(x, *_args):
    import torch

    return torch.empty_like(x)


#: ``self`` with ``src`` written at rows start[0] .. start[0] + src.size(dim) - 1 along
#: dim (every other size of src equal to self's). ``start`` is a one-element int
#: tensor: the position a decoder's ``start_pos`` input holds, which the Vulkan kernel
#: reads on the device. A row outside ``self`` raises (IndexError on the CPU, the
#: node's VkDelegateError on Vulkan). Created by ``passes/cache_positions`` from
#: ``cache[:, :, p:p + T] = k`` and ``llama.update_cache`` with ``p = pos[0].item()``.
SLICE_SCATTER_AT = declare_custom_op(
    "vkdelegate.slice_scatter_at.default",
    "slice_scatter_at(Tensor self, Tensor src, int dim, Tensor start) -> Tensor",
    _slice_scatter_at, meta=_same_as_self)


def sdpa_at_reference(query, key, value, start_pos, window=0, scale=None):
    """The definition of ``vkdelegate.sdpa_at`` (its CPU kernel): plain masked softmax
    attention in fp32, returned in query's dtype.

    query [B, Hq, L, E], key [Bk, Hk, S, E], value [Bk, Hk, S, Ev] (ATen's layout; Bk 1
    or B, Hq a multiple of Hk: query head h reads K/V head h // (Hq / Hk)); start_pos a
    one-element int64/int32 tensor, p = start_pos[0]. Query row i is at position p + i
    and sees key j (0 <= j < S) iff j <= p + i and (window == 0 or j > p + i - window):
    transformers' causal and sliding-window masks (masking_utils: ``kv_idx <= q_idx``,
    ``kv_idx > q_idx - sliding_window``). Any p is data, never an index: a row at a
    negative position sees no key, one at p + i >= S every key (without a window). A
    row that sees no key is NaN (0 / 0, as the other attention ops' references).
    scale: the score scale, default 1 / sqrt(E). ValueError for a negative window.
    """
    import torch

    if window < 0:
        raise ValueError(f"sdpa_at: window {window} (0: none, or a positive key count)")
    rep = query.size(-3) // key.size(-3)
    kf = key.float().repeat_interleave(rep, dim=-3)
    vf = value.float().repeat_interleave(rep, dim=-3)
    if scale is None:
        scale = 1.0 / (query.size(-1) ** 0.5)
    scores = torch.matmul(query.float(), kf.transpose(-2, -1)) * scale
    p = start_pos.reshape(-1)[:1].to(torch.int64)
    i = torch.arange(query.size(-2), device=query.device).unsqueeze(-1) + p
    j = torch.arange(key.size(-2), device=query.device).unsqueeze(0)
    allowed = j <= i
    if window:
        allowed = allowed & (j > i - window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), vf).to(query.dtype)


def _sdpa_at_meta(query, key, value, start_pos, window=0, scale=None):
    return query.new_empty(query.shape[:-1] + value.shape[-1:])


#: Causal (sliding-window) attention at a position held by a tensor:
#: ``sdpa_at(query, key, value, start_pos, window=0, scale=None)``, see
#: ``sdpa_at_reference`` (its definition). start_pos stays a tensor (an LLM's
#: ``start_pos`` input or the decode loop's ``loop.pos`` state, on the device), so no
#: mask is built on the host or the device: the Vulkan kernel reads the position and
#: visits only the key tiles some query row can see. Made by ``vkdelegate.llm.decoder``
#: (HFDecoder's attention); Vulkan: ``ops/families/sdpa_kv.py``.
SDPA_AT = declare_custom_op(
    "vkdelegate.sdpa_at.default",
    "sdpa_at(Tensor query, Tensor key, Tensor value, Tensor start_pos, int window=0, "
    "float? scale=None) -> Tensor", sdpa_at_reference, meta=_sdpa_at_meta)


def _index_put_pair(x, x2, indices, values, values2):
    import torch

    return (torch.ops.aten.index_put.default(x, indices, values),
            torch.ops.aten.index_put.default(x2, indices, values2))


def _index_put_pair_meta(x, x2, indices, values, values2):
    import torch

    return torch.empty_like(x), torch.empty_like(x2)


#: ``(index_put(self, indices, values), index_put(self2, indices, values2))``
#: (accumulate=False): a decoder layer's K and V cache writes at one set of positions,
#: in one dispatch. self/self2 of one dtype and sizes, values/values2 too, one index
#: tensor in indices. Made by ``passes/pair_cache_updates``; Vulkan:
#: ``ops/families/cache_update.py``.
INDEX_PUT_PAIR = declare_custom_op(
    "vkdelegate.index_put_pair.default",
    "index_put_pair(Tensor self, Tensor self2, Tensor?[] indices, Tensor values, "
    "Tensor values2) -> (Tensor, Tensor)", _index_put_pair, meta=_index_put_pair_meta)


def _update_cache(value, cache, start_pos):
    import torch

    torch._check(start_pos >= 0)
    torch._check(start_pos + value.size(1) <= cache.size(1))
    cache.narrow(1, start_pos, value.size(1)).copy_(value)
    return torch.empty((1,), dtype=value.dtype, device=value.device)


def _update_cache_meta(value, cache, start_pos):
    import torch

    return torch.empty((1,), dtype=value.dtype, device=value.device)


#: ExecuTorch's KV-cache write (extension/llm/custom_ops/op_sdpa_aot.cpp, schema as
#: there): value [B, S, H, D] into cache [B, S_max, H, D] at rows start_pos ..
#: start_pos + S - 1 of dim 1, in place; returns a one-element dummy tensor. torch
#: defines it here only where ExecuTorch is not installed. Export wraps it in
#: auto_functionalized; ``passes/cache_positions.functional_update_cache`` makes it a
#: slice_scatter (or slice_scatter_at when start_pos is ``.item()`` of a tensor), so
#: no lowered program calls it: glue=False keeps this mutating op off the CPU glue's
#: allow-list (which admits no op that writes an argument).
UPDATE_CACHE = declare_custom_op(
    "llama.update_cache.default",
    "update_cache(Tensor value, Tensor(a!) cache, SymInt start_pos) -> Tensor",
    _update_cache, glue=False, meta=_update_cache_meta)


def _apply_rotary_emb(xq, xk, freqs_cos, freqs_sin):
    import torch

    def rotate(x):
        xr, xi = x.float().reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
        shape = [d if i in (1, x.dim() - 1) else 1 for i, d in enumerate(xr.shape)]
        c, s = freqs_cos.float().view(shape), freqs_sin.float().view(shape)
        return torch.stack([xr * c - xi * s, xr * s + xi * c], dim=-1).flatten(3) \
            .type_as(x)
    return rotate(xq), rotate(xk)


#: ExecuTorch's Vulkan rotary embedding (backends/vulkan/custom_ops_lib.py and
#: patterns/rope.py, whose 2-D freqs form this kernel is): interleaved (real, imag)
#: pairs of xq [B, S, Hq, D] and xk [B, S, Hk, D] rotated by freqs_cos/freqs_sin
#: [S, D/2], in fp32, returned in the inputs' dtype. Vulkan: ``ops/families/rotary.py``.
APPLY_ROTARY_EMB = declare_custom_op(
    "et_vk.apply_rotary_emb.default",
    "apply_rotary_emb(Tensor xq, Tensor xk, Tensor freqs_cos, Tensor freqs_sin) "
    "-> (Tensor, Tensor)", _apply_rotary_emb)


def _rotary_half(x, cos, sin):
    import torch

    xf = x.float()
    x1, x2 = xf[..., : x.shape[-1] // 2], xf[..., x.shape[-1] // 2:]
    return (xf * cos.float() + torch.cat((-x2, x1), dim=-1) * sin.float()).to(x.dtype)


#: HF transformers' rotary embedding (``apply_rotary_pos_emb``: ``x * cos +
#: rotate_half(x) * sin``, rotate_half(x) = cat(-x2, x1) over the halves of the last
#: dim), cos/sin broadcast to x, computed in fp32 and rounded once to x's dtype (the
#: unfused fp16 graph rounds after each op: at most an fp16 ulp or so apart). Made by
#: ``passes/fuse_rotary``; Vulkan: ``ops/families/rotary.py``.
ROTARY_HALF = declare_custom_op(
    "vkdelegate.rotary_half.default",
    "rotary_half(Tensor x, Tensor cos, Tensor sin) -> Tensor", _rotary_half)


def _rotary_half_pair(q, k, cos, sin):
    return _rotary_half(q, cos, sin), _rotary_half(k, cos, sin)


#: ``(rotary_half(q, cos, sin), rotary_half(k, cos, sin))``: a layer's two rotary
#: embeddings, which share cos/sin, in one dispatch (each output bitwise what
#: rotary_half gives it). Made by ``passes/fuse_rotary`` from two rotary_half nodes with
#: the same cos and sin; Vulkan: ``ops/families/rotary.py``.
ROTARY_HALF_PAIR = declare_custom_op(
    "vkdelegate.rotary_half_pair.default",
    "rotary_half_pair(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)",
    _rotary_half_pair)


def _rotary_index_put_pair(q, k, cos, sin, x, x2, indices, values2):
    q_rot, k_rot = _rotary_half_pair(q, k, cos, sin)
    cache, cache2 = _index_put_pair(x, x2, indices, k_rot, values2)
    return q_rot, cache, cache2


def _rotary_index_put_pair_meta(q, k, cos, sin, x, x2, indices, values2):
    import torch

    return torch.empty_like(q), torch.empty_like(x), torch.empty_like(x2)


#: ``(q', index_put(self, indices, k'), index_put(self2, indices, values2))`` with
#: ``q', k' = rotary_half_pair(q, k, cos, sin)``: a decoder layer's rotary embedding
#: and its K and V cache writes in one dispatch (the rotated keys go straight into the
#: cache; each output bitwise what the two ops give). Made by
#: ``passes/pair_cache_updates`` where k' has no other reader; Vulkan:
#: ``ops/families/cache_update.py``.
ROTARY_INDEX_PUT_PAIR = declare_custom_op(
    "vkdelegate.rotary_index_put_pair.default",
    "rotary_index_put_pair(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor self, "
    "Tensor self2, Tensor?[] indices, Tensor values2) -> (Tensor, Tensor, Tensor)",
    _rotary_index_put_pair, meta=_rotary_index_put_pair_meta)


def sample_reference(logits, sampling):
    """The definition of ``vkdelegate.sample`` (its CPU kernel).

    logits: float tensor of V elements ([1, V] or [V]; fp16 is widened to fp32).
    sampling: float32[4] = (temperature, top_k, top_p, draw). Returns int64[1].
    temperature <= 0: ``argmax`` (first maximum). Else z = logits / temperature (fp32),
    tokens ordered by z descending, ties by lower index (a stable sort); keep the first
    top_k (0 or >= V: all; top_p <= 0 keeps one); then the shortest prefix whose mass,
    w = exp(z - max z), reaches top_p of the kept mass (top_p >= 1: all); then the
    first token whose cumulative mass exceeds draw * (the kept mass), or the last kept
    one (draw clamped to [0, 1]). The issue-14 sampling rule. z is fp32 (as on the
    device), the masses are summed in fp64; the Vulkan kernel sums fp32 masses
    truncated to 64-bit fixed point (2^-40), exactly, so it may pick a neighbour only
    when the draw (or top_p) lies within about 1e-5 of the kept mass from a cumulative
    boundary (its exp is not correctly rounded; tests/ops/test_sample.py checks exact
    equality for every draw farther than that, the neighbour otherwise). With
    temperature > 0 the logits must be finite and the draw a number (an inf logit
    makes exp(z - max z) NaN here, and the device's pick undefined).
    """
    import torch

    x = logits.detach().reshape(-1).float()
    t, k, p, u = (float(v) for v in sampling.detach().reshape(-1)[:4].float())
    if not t > 0:
        return torch.argmax(x).reshape(1)
    z = x / t
    order = torch.sort(z, descending=True, stable=True).indices
    w = torch.exp((z[order] - z.max()).double())  # sums in fp64: the exact value
    n = x.numel()
    k = 1 if not p > 0 else int(k)
    if 0 < k < n:
        n = k
    if p < 1:
        c = torch.cumsum(w[:n], 0)
        hit = torch.nonzero(c >= p * c[-1])
        n = int(hit[0]) + 1 if hit.numel() else n
    c = torch.cumsum(w[:n], 0)
    hit = torch.nonzero(c > min(max(u, 0.0), 1.0) * c[-1])
    j = int(hit[0]) if hit.numel() else n - 1
    return order[j].reshape(1)


def _sample_meta(logits, sampling):
    import torch

    return torch.empty((1,), dtype=torch.int64, device=logits.device)


#: The on-device sampler: ``sample(Tensor logits, Tensor sampling) -> Tensor``
#: (``sample_reference`` is its definition). Vulkan: ``ops/families/sample.py``.
SAMPLE = declare_custom_op(
    "vkdelegate.sample.default", "sample(Tensor logits, Tensor sampling) -> Tensor",
    sample_reference, meta=_sample_meta)


def sample_record_reference(logits, sampling, draws, pos, token, token_pos, history):
    """The definition of ``vkdelegate.sample_record`` (its CPU kernel): the decode
    loop's sampling step and its record (``vkdelegate.llm.decoder.DecodeLoopState``).

    p = pos[0] (int64 or int32, one element): the position the step fed. The sampling
    vector is ``sampling`` (float32[4], as ``vkdelegate.sample``), or, with ``draws``
    (float32[N]), ``sampling`` with its draw replaced by ``draws[p]``. Returns
    ``(id, token', pos', history')``: id = ``sample_reference(logits, that vector)``,
    int64[1]; token' = id in ``token``'s sizes (one element); pos' = p + 1 in
    ``token_pos``'s sizes (one element); history' = ``history`` (rank 1) with
    ``history[p + 1] = id``. token, token_pos and history are the loop's state (int64):
    token and token_pos are read only for their sizes, so that a method that records
    also reads every state it writes (``backend.state_bindings`` keeps such a state on
    the device). A row outside ``draws`` (p) or ``history`` (p + 1) raises IndexError
    here; on Vulkan it sets the node's error flag (the run raises VkDelegateError),
    the draw is clamped into the table and the history row is not written, while id,
    token' and pos' are still written.
    """
    import torch

    p = pos.reshape(-1)[:1].to(torch.int64)
    if draws is not None:
        sampling = torch.cat([sampling.reshape(-1)[:3].float(),
                              draws.reshape(-1).index_select(0, p).float()])
    tok = sample_reference(logits, sampling)
    nxt = p + 1
    return (tok, tok.reshape(token.shape).clone(), nxt.reshape(token_pos.shape),
            history.index_copy(0, nxt, tok))


def _sample_record_meta(logits, sampling, draws, pos, token, token_pos, history):
    import torch

    return (torch.empty((1,), dtype=torch.int64, device=logits.device),
            torch.empty_like(token), torch.empty_like(token_pos), torch.empty_like(history))


#: The decode loop's sampler and its record in one op:
#: ``sample_record(logits, sampling, draws, pos, token, token_pos, history) -> (id,
#: token', pos', history')`` (``sample_record_reference`` is its definition): what
#: ``vkdelegate.llm.decoder`` calls at the end of prefill, decode and decode_next, so
#: the id, the loop's new state and the draw of decode_next's table are one dispatch
#: (sample.glsl with RECORD). Vulkan: ``ops/families/sample.py``.
SAMPLE_RECORD = declare_custom_op(
    "vkdelegate.sample_record.default",
    "sample_record(Tensor logits, Tensor sampling, Tensor? draws, Tensor pos, "
    "Tensor token, Tensor token_pos, Tensor history) -> (Tensor, Tensor, Tensor, Tensor)",
    sample_record_reference, meta=_sample_record_meta)


def _narrow_last(x, start, length):
    import torch

    return x.narrow(-1, start, length).clone(memory_format=torch.contiguous_format)


#: ``x[..., start:start + length]`` as a new contiguous tensor (``narrow`` of the last
#: dim). Made by ``passes/merge_linears`` for the parts of a merged linear's output.
#: Where its rows are statically 1 the part is a contiguous byte range of ``x``:
#: there the runtime binds the output inside ``x``'s memory and records no copy
#: (runtime/values.py); elsewhere (a prefill's several rows) it is one affine copy. Vulkan:
#: ``ops/families/movement.py``.
NARROW_LAST = declare_custom_op(
    "vkdelegate.narrow_last.default",
    "narrow_last(Tensor x, int start, int length) -> Tensor", _narrow_last)
