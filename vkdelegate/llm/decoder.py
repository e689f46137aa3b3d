"""The exportable modules behind the LLM methods: embed_text, prefill, decode,
decode_next.

A decoder (``HFDecoder`` here, or ``reference_decoder.ReferenceDecoder``) has
``embed(tokens) -> embeds``, ``logits(embeds, start_pos) -> [V]`` and a ``kv_cache``
submodule (``KVCache``); ``EmbedText``/``Prefill``/``Decode``/``DecodeNext`` wrap one
decoder each and hold it as ``decoder`` (and prefill and the decodes one
``DecodeLoopState`` as ``loop``), so the cache's and the loop state's FQNs are the
same in every method.

The decode loop on the device: prefill and decode also record, as program state, the
token they sampled (``loop.token``), the position it will be fed at (``loop.pos``) and
``loop.history[pos] = token``; ``decode_next(sampling, draws)`` is decode on that state
(its draw ``draws[pos]``). Every input of ``decode_next`` is the same at each step, so the host can run N steps in ONE submit
(``LoweredProgram.run_repeated``) and read the N tokens from ``loop.history``: no host
round trip, and no idle GPU, between the steps (``vkdelegate.llm.generate``).

``HFDecoder`` runs a HF transformers causal LM (Llama, Qwen2, Mistral, Gemma, Gemma2,
...) on input embeddings with a static KV cache of ``max_seq_len`` positions that is
ours: ``KVCache`` registers one key and one value buffer per layer, [1, kv_heads,
max_seq_len, head_dim] (the layout of transformers' ``StaticLayer``), so torch.export
sees them as mutable buffers and the program keeps them (one per FQN,
``decoder.kv_cache.k_0``, shared by prefill and decode: ``backend/program_state``).
Each call points transformers' ``StaticCache`` layers at these buffers and at the
call's position, and the layers write the new keys/values with ``index_copy_`` at
``start_pos + arange(T)``. Sliding-window layers become full-length ``StaticLayer``s
(as in transformers' own export recipe).

Attention without a mask: where it is equivalent (``uses_position_attention``), the
model runs, while HFDecoder calls it, with the attention implementation ATTENTION
registered in transformers' ``AttentionInterface``. transformers builds no mask for an
implementation that ``masking_utils.ALL_MASK_ATTENTION_FUNCTIONS`` does not know, so
the arange / compare / expand prelude of every step is gone, and each layer calls
``vkdelegate.sdpa_at(query, key, value, start_pos, window)`` over the whole static
cache: causal at the call's ``start_pos`` (a tensor: the program's input or the decode
loop's ``loop.pos`` state, read on the device), with the layer's ``sliding_window``
(the keyword transformers passes each layer's attention for flash attention, which has
no mask either). Its Vulkan kernels skip the key tiles past the position, so a decode
step costs what the position needs, not ``max_seq_len``. Other models (attention logit
soft-capping as Gemma 2, bidirectional or image-token masks as Gemma 3's VLM, no flash
attention support, chunked attention) keep transformers' mask and "sdpa"/"eager".
"""
from __future__ import annotations

import torch
from torch import nn

import contextlib
import inspect
import threading

from vkdelegate.errors import VkDelegateError
from vkdelegate.llm import sampler

#: The name under which HFDecoder registers its attention with transformers.
ATTENTION = "vkdelegate_sdpa"
#: What the attention function reads while HFDecoder runs the model: start_pos.
_CALL = threading.local()


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
               sliding_window=None, softcap=None, **kwargs):
    """transformers' attention interface (``sdpa_attention_forward``'s signature):
    query [B, Hq, L, E], key/value [B, Hk, S, E] (the whole static cache) -> (out
    [B, L, Hq, E] contiguous, None), by ``vkdelegate.sdpa_at`` at the position
    HFDecoder.logits set (``_CALL.start_pos``), with the layer's ``sliding_window``.
    A mask the model passes anyway (a 4-D mask it built itself) goes to transformers'
    sdpa with it. VkDelegateError outside HFDecoder, and for non-causal attention,
    dropout, attention sinks or logit soft-capping, which ``uses_position_attention``'s
    choice of models excludes."""
    from vkdelegate.backend import custom_ops

    start_pos = getattr(_CALL, "start_pos", None)
    if start_pos is None:
        raise VkDelegateError(f"attention {ATTENTION!r} runs only inside HFDecoder.logits")
    if attention_mask is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, softcap=softcap,
                                      sliding_window=sliding_window, **kwargs)
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    unsupported = [name for name, bad in (
        ("non-causal attention", not causal), (f"dropout {dropout}", bool(dropout)),
        ("attention sinks", any(kwargs.get(n) is not None for n in ("s_aux", "sinks"))),
        (f"logit soft-capping {softcap}", softcap is not None))
        if bad]
    if unsupported:
        raise VkDelegateError(f"{type(module).__name__}: {', '.join(unsupported)} without "
                              f"a mask ({ATTENTION})")
    window = int(sliding_window) if sliding_window else 0
    custom_ops.ensure_defined()
    out = torch.ops.vkdelegate.sdpa_at(query, key, value, start_pos, window, scaling)
    return out.transpose(1, 2).contiguous(), None


def _attention_overrides(model: nn.Module) -> dict:
    """{attention module: its ``_attn`` while HFDecoder runs it}, for attention modules
    that mask by the key length rather than through transformers' attention interface.

    GPT-Neo (``GPTNeoSelfAttention._attn``) slices its causal / local (sliding window
    ``config.window_size``) mask out of a ``[max_pos, max_pos]`` table at rows
    ``key_length - query_length .. key_length``, which puts the queries at the end of
    the keys: right for a cache that grows, wrong for the static cache of
    ``max_seq_len`` positions (a prefill's queries sat at the cache's last rows, so a
    local layer saw none of the prompt and a global one the unwritten rows; the greedy
    tokens differed from HF's from the first). Its ``_attn`` becomes
    ``vkdelegate.sdpa_at`` at the call's position, unscaled as GPT-Neo's scores are,
    with the layer's window (GPT-Neo's local rows see the ``window_size`` keys up to
    their own, as sdpa_at's ``window``)."""
    overrides = {}
    for m in model.modules():
        if type(m).__name__ == "GPTNeoSelfAttention" and hasattr(m, "_attn") \
                and getattr(m, "attention_type", None) in ("global", "local"):
            window = int(m.config.window_size) if m.attention_type == "local" else 0
            overrides[m] = _sdpa_at_attn(window, 1.0)
    return overrides


def _sdpa_at_attn(window: int, scale: float):
    """A GPT-Neo ``_attn(query, key, value, attention_mask=None)``: query [B, H, L, E],
    key / value [B, H, S, E] (the static cache) -> ([B, H, L, E], None) by
    ``vkdelegate.sdpa_at`` at HFDecoder's position (no mask is built: ATTENTION)."""
    from vkdelegate.backend import custom_ops

    def attn(query, key, value, attention_mask=None):
        start_pos = getattr(_CALL, "start_pos", None)
        if start_pos is None or attention_mask is not None:
            raise VkDelegateError("GPT-Neo attention runs mask-free only inside "
                                  "HFDecoder.logits")
        custom_ops.ensure_defined()
        return torch.ops.vkdelegate.sdpa_at(query, key, value, start_pos, window,
                                            scale), None
    return attn


#: The experts implementation HFDecoder registers with transformers (``_dense_experts``).
EXPERTS = "vkdelegate_dense"


def _dense_experts(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts interface (``batched_mm_experts_forward``'s signature):
    hidden_states [T, H], top_k_index int64[T, k], top_k_weights [T, k] -> [T, H]. Every
    expert runs on every token and the routing weights, zero for the experts a token
    did not choose, sum the results: one linear over all experts' gate/up rows, the
    gate, one batched product with all down projections, a weighted sum.

    An exportable MoE with shapes that do not depend on the routing: transformers'
    default ("grouped_mm") counts tokens per expert with ``torch.histc`` and its
    "eager" form loops over the experts that were hit (data-dependent); "batched_mm"
    gathers one weight matrix per (token, choice), [T * k, 2I, H], which at the cache's
    T is far beyond a device's memory for a real checkpoint. This costs E / k times the
    chosen experts' arithmetic and reads every expert's weights at each step."""
    tokens, hidden = hidden_states.shape
    gate_up = self.gate_up_proj  # [E, 2I, H]
    experts, rows = gate_up.shape[:2]
    proj = nn.functional.linear(hidden_states, gate_up.reshape(experts * rows, hidden))
    act = self._apply_gate(proj.view(tokens, experts, rows))  # [T, E, I]
    out = torch.matmul(act.transpose(0, 1), self.down_proj.transpose(1, 2))  # [E, T, H]
    chosen = top_k_index.unsqueeze(-1) == torch.arange(experts, device=top_k_index.device)
    routing = (chosen.to(top_k_weights.dtype) * top_k_weights.unsqueeze(-1)).sum(1)
    out = out * routing.transpose(0, 1).unsqueeze(-1).to(out.dtype)  # [E, T, H]
    return out.sum(0).to(hidden_states.dtype)


def _dense_experts_configs(model: nn.Module) -> list:
    """The configs of ``model``'s experts modules (transformers'
    ``@use_experts_implementation`` classes) when ``_dense_experts`` computes every one
    of them (gate/up rows concatenated [E, 2I, H], down [E, H, I], no biases, no
    post-expert norm) and this transformers has the experts interface; else []."""
    experts = [m for m in model.modules()
               if hasattr(m, "gate_up_proj") and hasattr(m, "has_gate")
               and hasattr(m, "is_transposed") and hasattr(m, "config")]
    if not experts:
        return []
    for m in experts:
        if not m.has_gate or m.is_transposed or not getattr(m, "is_concatenated", True) \
                or getattr(m, "has_bias", False) or getattr(m, "has_post_expert_norm", False) \
                or getattr(m, "_is_expert_parallel", False) or m.gate_up_proj.dim() != 3 \
                or getattr(m, "down_proj", None) is None or m.down_proj.dim() != 3:
            return []
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return []
    ALL_EXPERTS_FUNCTIONS.register(EXPERTS, _dense_experts)
    return list({id(m.config): m.config for m in experts}.values())


@contextlib.contextmanager
def _set_on(configs: list, attr: str, value):
    """``attr`` of each config set to ``value`` inside the block, restored on exit."""
    saved = [getattr(c, attr) for c in configs]
    try:
        for c in configs:
            setattr(c, attr, value)
        yield
    finally:
        for c, old in zip(configs, saved):
            setattr(c, attr, old)


def _dense_experts_in(configs: list):
    """The experts of these configs run ``_dense_experts`` inside the block."""
    return _set_on(configs, "_experts_implementation_internal", EXPERTS)


@contextlib.contextmanager
def _overridden(overrides: dict):
    """Each module's ``_attn`` replaced (an instance attribute) inside the block."""
    try:
        for module, attn in overrides.items():
            module._attn = attn
        yield
    finally:
        for module in overrides:
            module.__dict__.pop("_attn", None)


def _register_attention() -> bool:
    """Register ATTENTION with transformers' AttentionInterface (idempotent); False
    where this transformers has no attention interface or mask registry."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    except ImportError:
        return False
    if ATTENTION in getattr(ALL_MASK_ATTENTION_FUNCTIONS, "_global_mapping", {ATTENTION: 0}):
        return False  # a mask would be built for it: not the mask-free path
    AttentionInterface.register(ATTENTION, _attention)
    return True


def uses_position_attention(model: nn.Module) -> bool:
    """Whether HFDecoder runs ``model`` with ATTENTION (no mask, ``vkdelegate.sdpa_at``)
    rather than its own implementation: in eval mode, with "sdpa" or "eager" chosen, a
    model class that supports flash attention (so each layer's attention gets its
    sliding window as a keyword, the masks are plain causal / sliding-window ones, and
    no layer relies on a mask flash attention would drop, e.g. Gemma 3's image tokens),
    no attention logit soft-capping, no bidirectional or chunked attention, every
    attention module causal and looking its attention up in transformers' attention
    interface (``_dispatches_attention``), and a transformers with that interface."""
    config = model.config.get_text_config()
    supports_flash = any(getattr(type(model), n, False)
                         for n in ("_supports_flash_attn", "_supports_flash_attn_2"))
    if model.training or not supports_flash:
        return False
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", "eager", None):
        return False
    for name in ("attn_logit_softcapping", "attention_chunk_size"):
        if getattr(config, name, None) is not None:
            return False
    if getattr(config, "use_bidirectional_attention", False):
        return False
    attention = [m for m in model.modules()
                 if hasattr(m, "layer_idx") and hasattr(m, "is_causal")]
    if not attention and not _attention_overrides(model):
        return False  # none found: nothing says that the mask can go
    if any(getattr(m, "is_causal", True) is not True for m in attention):
        return False
    if not all(_dispatches_attention(type(m)) for m in attention):
        return False
    return _register_attention()


def _dispatches_attention(cls: type) -> bool:
    """Whether ``cls.forward`` (decorators unwrapped) looks its attention up in
    transformers' ALL_ATTENTION_FUNCTIONS, so that ATTENTION runs in it. Not every
    version's every model does: transformers 5.x before the refactor of Falcon's
    attention picks between its own eager and sdpa code by ``_attn_implementation``,
    and would run its eager path without a mask."""
    forward = inspect.unwrap(cls.forward)
    code = getattr(forward, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


@contextlib.contextmanager
def _attention_at(model: nn.Module, start_pos: torch.Tensor):
    """Run ``model`` with ATTENTION at ``start_pos`` inside the block: its (and its
    text config's) attention implementation switched, restored on exit."""
    configs = list({id(c): c for c in (model.config, model.config.get_text_config())}
                   .values())
    _CALL.start_pos = start_pos
    try:
        with _set_on(configs, "_attn_implementation_internal", ATTENTION):
            yield
    finally:
        _CALL.start_pos = None


def check_cache_size(kv_heads: list, head_dims: list, max_seq_len: int,
                     dtype: torch.dtype) -> int:
    """The bytes of a KV cache of ``max_seq_len`` positions (layer i: a key and a value
    buffer of [1, kv_heads[i], max_seq_len, head_dim[i]] of ``dtype``), checked before
    anything is allocated: against ``vkdelegate.limits.DEFAULT_LIMITS`` (one buffer
    within ``max_tensor_bytes``, the cache within ``max_device_bytes``: what a saved
    program may ask for when it loads) and against this host's physical memory (export
    holds the cache twice: our buffers and transformers' ``StaticCache``). Raises
    VkDelegateError naming max_seq_len, the sizes and the limit (a cache of 100 M
    positions was killed by the kernel for memory, with no message)."""
    from vkdelegate.limits import DEFAULT_LIMITS, GiB

    itemsize = torch.empty((), dtype=dtype).element_size()
    buffers = [h * max_seq_len * d * itemsize for h, d in zip(kv_heads, head_dims)]
    total = 2 * sum(buffers)
    shape = f"{len(buffers)} layers x (key + value) x [{kv_heads[0]}, {max_seq_len}, " \
        f"{head_dims[0]}] x {itemsize} bytes"
    what = f"max_seq_len {max_seq_len}: the KV cache would take {total / GiB:.2f} GiB " \
        f"({shape})"
    if max(buffers, default=0) > DEFAULT_LIMITS.max_tensor_bytes:
        raise VkDelegateError(f"{what}; one buffer of {max(buffers) / GiB:.2f} GiB is over "
                              f"the {DEFAULT_LIMITS.max_tensor_bytes / GiB:.0f} GiB a "
                              f"program's tensor may have (vkdelegate.limits.LoadLimits."
                              f"max_tensor_bytes): lower with a smaller max_seq_len")
    if total > DEFAULT_LIMITS.max_device_bytes:
        raise VkDelegateError(f"{what}, over the {DEFAULT_LIMITS.max_device_bytes / GiB:.0f}"
                              f" GiB a program's device memory may have (vkdelegate."
                              f"limits.LoadLimits.max_device_bytes): lower with a smaller "
                              f"max_seq_len")
    host = _physical_memory()
    if host and 2 * total > host:
        raise VkDelegateError(f"{what}; exporting it needs twice that, more than this "
                              f"machine's {host / GiB:.1f} GiB of memory: lower with a "
                              f"smaller max_seq_len")
    return total


def _physical_memory() -> int:
    """This host's physical memory in bytes; 0 where the OS does not say."""
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


class KVCache(nn.Module):
    """Key and value buffers ``k_<i>``/``v_<i>`` of every layer: [1, kv_heads[i],
    max_seq_len, head_dim[i]], zeros, of ``dtype``. Raises VkDelegateError for a cache
    too large (``check_cache_size``)."""

    def __init__(self, kv_heads: list, head_dims: list, max_seq_len: int,
                 dtype: torch.dtype):
        super().__init__()
        check_cache_size(kv_heads, head_dims, max_seq_len, dtype)
        self.num_layers = len(kv_heads)
        self.max_seq_len = max_seq_len
        for i, (h, d) in enumerate(zip(kv_heads, head_dims)):
            self.register_buffer(f"k_{i}", torch.zeros(1, h, max_seq_len, d, dtype=dtype))
            self.register_buffer(f"v_{i}", torch.zeros(1, h, max_seq_len, d, dtype=dtype))


def _cache_kwarg(model: nn.Module) -> str:
    """The name under which ``model.forward`` takes its cache: ``cache`` (transformers
    5.24, which still accepts the old name with a deprecation warning until 5.40) or
    ``past_key_values`` (older 5.x, e.g. 5.17: there an unknown ``cache=`` is swallowed
    by ``**kwargs`` and the model makes its own DynamicCache, so the keys grow with the
    input and torch 2.11's export refuses the dynamic length on ``repeat_kv``'s guard
    ``min(d*T, n_rep*d*T) == d*T``)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _head_shapes(config):
    """(KV heads, head dim), each an int or a per-layer list: transformers'
    ``get_head_shapes`` where it has it (5.24), else from the config's fields (older
    transformers; one shape for every layer)."""
    try:
        from transformers.configuration_utils import get_head_shapes
    except ImportError:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or \
            config.hidden_size // config.num_attention_heads
        return heads, dim
    return get_head_shapes(config)


def init_lazy_rotary_state(model: nn.Module) -> list:
    """Assign, eagerly, the rotary state that transformers' LongRoPE sets on a model's
    first forward; the FQNs (in ``model``) of the LongRoPE rotary modules'
    ``inv_freq`` buffers.

    ``modeling_rope_utils.dynamic_rope_update``'s LongRoPE update (Phi-3-mini-128k,
    Phi-3.5, Phi-4-mini) computes the long-context inverse frequencies on the first
    forward and keeps them as a plain attribute (``long_inv_freq``, or
    ``<layer type>_long_inv_freq``). Under torch.export that first forward is a trace:
    the attribute became a fake tensor of prefill's export, which decode's export then
    mixed with its own ("fake mode ... doesn't match mode"), so a freshly built or
    loaded model did not lower. The rotary module is called here once, at position 0,
    under no_grad: that sets the attribute to the real tensor HF itself would set;
    the module's ``inv_freq`` buffer (which every forward overwrites from the position)
    is put back as it was, so nothing the model computes changes.

    Every forward of such a module computes ``inv_freq`` (long or short by the
    position) and writes it into the buffer before reading it: the exported methods'
    write of that state is dead (``lower.drop_dead_buffer_writes``), and a state
    written but never read would keep decode_next from looping on the device."""
    found = []
    for name, module in model.named_modules():
        rope = getattr(module, "rope_type", None)
        for layer_type, kind in (rope if isinstance(rope, dict) else {None: rope}).items():
            prefix = f"{layer_type}_" if layer_type is not None else ""
            inv_freq = getattr(module, f"{prefix}inv_freq", None)
            if kind != "longrope" or not isinstance(inv_freq, torch.Tensor):
                continue
            if getattr(module, f"{prefix}long_inv_freq", None) is None:  # not run yet
                saved = inv_freq.clone()
                x = torch.zeros(1, device=inv_freq.device)
                position = torch.zeros(1, 1, dtype=torch.int64, device=inv_freq.device)
                kwargs = {} if layer_type is None else {"layer_type": layer_type}
                with torch.no_grad():
                    module(x, position, **kwargs)
                    getattr(module, f"{prefix}inv_freq").copy_(saved)
            found.append(f"{name}.{prefix}inv_freq" if name else f"{prefix}inv_freq")
    return found


class HFDecoder(nn.Module):
    """A HF ``*ForCausalLM`` with our KVCache. ``logits(embeds [1, T, D], start_pos
    int64[1])`` -> float [V], the logits of the last position (final soft-capping
    included); ``embed(tokens int64[1, T])`` -> [1, T, D], the model's own input
    embedding (Gemma's sqrt(hidden) scale included).
    Raises ValueError (from transformers) for a model without a static cache, and
    VkDelegateError for one that ignores the cache it is given."""

    def __init__(self, model: nn.Module, max_seq_len: int):
        super().__init__()
        from transformers.cache_utils import StaticCache, StaticLayer

        self.model = model
        #: Buffers every forward overwrites before reading them (LongRoPE's inv_freq).
        self.rewritten_buffers = ["model." + n for n in init_lazy_rotary_state(model)]
        config = model.config.get_text_config()
        heads, dims = _head_shapes(config)
        n = config.num_hidden_layers
        heads = heads if isinstance(heads, list) else [heads] * n
        dims = dims if isinstance(dims, list) else [dims] * n
        self.kv_cache = KVCache(heads, dims, max_seq_len, model.dtype)
        cache = StaticCache(max_cache_len=max_seq_len, config=config)
        cache.layers = [StaticLayer(max_seq_len) for _ in cache.layers]
        cache.early_initialization(1, heads, dims, model.dtype, torch.device("cpu"))
        # Not a submodule: a Python object whose tensors are replaced at every call.
        self.__dict__["_static"] = cache
        self._cache_kwarg = _cache_kwarg(model)
        #: The model runs with ATTENTION (no mask, vkdelegate.sdpa_at; module docstring).
        self.position_attention = uses_position_attention(model)
        self._overrides = _attention_overrides(model)
        self._experts = _dense_experts_configs(model)
        if self._overrides and not self.position_attention:
            raise VkDelegateError(f"{type(model).__name__}: its attention masks by the "
                                  f"key length, which the static KV cache makes wrong, "
                                  f"and it cannot run mask-free here (eval mode, "
                                  f"\"eager\" or \"sdpa\" attention)")

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(tokens)

    def logits(self, embeds: torch.Tensor, start_pos: torch.Tensor) -> torch.Tensor:
        cache = self._static
        for i, layer in enumerate(cache.layers):
            layer.keys = getattr(self.kv_cache, f"k_{i}")
            layer.values = getattr(self.kv_cache, f"v_{i}")
            # StaticLayer.update adds T to it in place: a copy, never the input.
            layer.cumulative_length = start_pos[0].clone()
        positions = (torch.arange(embeds.shape[1], dtype=torch.int64)
                     + start_pos).unsqueeze(0)
        run = _attention_at(self.model, start_pos) if self.position_attention \
            else contextlib.nullcontext()
        with run, _overridden(self._overrides), _dense_experts_in(self._experts):
            out = self.model(inputs_embeds=embeds, position_ids=positions, use_cache=True,
                             logits_to_keep=1, **{self._cache_kwarg: cache})
        used = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        if used is not cache:  # the model made its own cache: ours would stay empty
            raise VkDelegateError(f"{type(self.model).__name__} did not use the static "
                                  f"cache passed as {self._cache_kwarg}= (transformers "
                                  f"cache interface not supported)")
        return out.logits[0, -1]


class DecodeLoopState(nn.Module):
    """The state of the decode loop on the device (buffers, so that the program keeps
    them across calls and methods): ``token`` int64[1, 1], the last sampled token;
    ``pos`` int64[1], the cache position it is fed at; ``history`` int64[S + 1],
    ``history[p]`` the token sampled to be fed at position p (S = max_seq_len; S + 1
    since a prefill of S tokens samples one for position S)."""

    def __init__(self, max_seq_len: int):
        super().__init__()
        self.register_buffer("token", torch.zeros(1, 1, dtype=torch.int64))
        self.register_buffer("pos", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("history", torch.zeros(max_seq_len + 1, dtype=torch.int64))

    def sample(self, logits: torch.Tensor, sampling: torch.Tensor, pos: torch.Tensor,
               draws: "torch.Tensor | None" = None) -> torch.Tensor:
        """The token int64[1] sampled from ``logits`` (``sampler.sample``; with
        ``draws``, its draw is ``draws[pos]``) after the step that fed position ``pos``
        int64[1], recorded for position pos + 1: ``token``, ``pos`` and
        ``history[pos + 1]``. One op, ``vkdelegate.sample_record`` (one dispatch); it
        takes every state it writes as an argument, so that every method reads the
        states it writes: a state the delegate reads is kept on the device in place
        (``backend.state_bindings``), a write-only one would cross to the host."""
        token, new_token, new_pos, history = sampler.sample_record(
            logits, sampling, draws, pos, self.token, self.pos, self.history)
        self.token.copy_(new_token)
        self.pos.copy_(new_pos)
        self.history.copy_(history)
        return token


class EmbedText(nn.Module):
    """embed_text(tokens int64[1, T]) -> float[1, T, D]."""

    def __init__(self, decoder: HFDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, tokens):
        return self.decoder.embed(tokens)


class Prefill(nn.Module):
    """prefill(inputs_embeds float[1, T, D], start_pos int64[1], sampling float32[4])
    -> int64[1]: writes positions start_pos .. start_pos + T - 1 of the cache and
    samples the token after the last (``sampler.sample``), recorded in ``loop`` for
    position start_pos + T."""

    def __init__(self, decoder: HFDecoder, loop: DecodeLoopState):
        super().__init__()
        self.decoder = decoder
        self.loop = loop

    def forward(self, inputs_embeds, start_pos, sampling):
        logits = self.decoder.logits(inputs_embeds, start_pos)
        # start_pos + T - 1 as a tensor op (arange's last): a SymInt read outside the
        # delegate would put this add on the CPU.
        last = torch.arange(inputs_embeds.shape[1], dtype=torch.int64)[-1:] + start_pos
        return self.loop.sample(logits, sampling, last)


class Decode(nn.Module):
    """decode(tokens int64[1, 1], start_pos int64[1], sampling float32[4]) -> int64[1]:
    one token at position start_pos; the next is recorded in ``loop`` for
    start_pos + 1."""

    def __init__(self, decoder: HFDecoder, loop: DecodeLoopState):
        super().__init__()
        self.decoder = decoder
        self.loop = loop

    def forward(self, tokens, start_pos, sampling):
        embeds = self.decoder.embed(tokens)
        return self.loop.sample(self.decoder.logits(embeds, start_pos), sampling, start_pos)


class DecodeNext(nn.Module):
    """decode_next(sampling float32[4], draws float32[S + 1]) -> int64[1]:
    ``decode(loop.token, loop.pos, sampling with its draw replaced by draws[loop.pos])``,
    which records the next token in ``loop``: the same inputs at every step (the
    host's draws of a whole generation in one table; see the module docstring)."""

    def __init__(self, decoder: HFDecoder, loop: DecodeLoopState):
        super().__init__()
        self.decoder = decoder
        self.loop = loop

    def forward(self, sampling, draws):
        pos = self.loop.pos.clone()
        embeds = self.decoder.embed(self.loop.token.clone())
        return self.loop.sample(self.decoder.logits(embeds, pos), sampling, pos, draws)
