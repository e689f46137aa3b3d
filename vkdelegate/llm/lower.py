"""``lower``: a causal LM (and optionally a vision tower) -> a 3- or 4-method program.

The methods (the contract of docs/LLM.md):
  embed_text(tokens int64[1, T]) -> float[1, T, D]
  prefill(inputs_embeds float[1, T, D], start_pos int64[1], sampling float32[4]) -> int64[1]
  decode(tokens int64[1, 1], start_pos int64[1], sampling float32[4]) -> int64[1]
  decode_next(sampling float32[4], draws float32[max_seq_len + 1]) -> int64[1]
      (decode on the token and position kept as state: vkdelegate.llm.decoder)
  vision_encoder(pixel_values float[1, P, C*p*p], pixel_position_ids int64[1, P, 2])
      -> (image_embeds float[1, S, D], pooler_mask bool[1, S])      (with vision=)
Each is exported with torch.export and all go through ONE ``to_backend`` call with a
dict of ExportedPrograms, which is how any multi-method program is built: the KV
cache buffers (``decoder.kv_cache.k_<i>``/``v_<i>``) have the same FQN in prefill
and decode, so the program holds one cache that both update.
"""
from __future__ import annotations

import contextlib

import torch
from torch.export import Dim

from vkdelegate.errors import VkDelegateError
from vkdelegate.llm.generate import cache_length  # noqa: F401 (public here since issue 14)
from vkdelegate.llm.decoder import (Decode, DecodeLoopState, DecodeNext, EmbedText,
                                    HFDecoder, Prefill)
from vkdelegate.llm.reference_decoder import ReferenceDecoder
from vkdelegate.llm.vision import VisionEncoder



def _export(module, args, dynamic_shapes, name: str, rewritten=()):
    """``torch.export.export(module, args, strict=False)`` under no_grad, the dead
    length reads dropped. Raises VkDelegateError of a few lines (the method, the
    error's first line, where in the model's code it was raised, a hint) with
    torch's whole error chained (``raise ... from exc``): torch's own message ran to
    65 lines of its internals. A plain attribute that the trace left holding a fake
    tensor on one of ``module``'s submodules is put back as it was (``_fake_assigned``),
    so the next method's export and the eager model do not see it. ``rewritten``:
    FQNs of buffers whose writes are dead (``drop_dead_buffer_writes``)."""
    try:
        with torch.no_grad(), _fake_assigned(module):
            program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes,
                                          strict=False)
    except Exception as exc:
        raise VkDelegateError(export_failure(name, exc)) from exc
    drop_dead_length_reads(program)
    drop_dead_buffer_writes(program, rewritten)
    return program


def drop_dead_buffer_writes(program, fqns) -> list:
    """Drop ``program``'s in-place writes (``copy_``) of the buffers ``fqns`` whose
    value before the call the graph never reads (each read comes after a write, and
    reads what that write copied in); the FQNs dropped. LongRoPE's rotary modules
    overwrite ``inv_freq`` at every forward before reading it
    (``decoder.init_lazy_rotary_state``): kept, that write was a state the delegate
    wrote and nothing read, which stayed on the host and kept decode_next from
    looping on the device."""
    from torch.export.graph_signature import InputKind

    fqns = set(fqns)
    if not fqns:
        return []
    graph = program.graph_module.graph
    placeholder = {n.name: n for n in graph.find_nodes(op="placeholder")}
    buffers = {placeholder[spec.arg.name]: spec.target
               for spec in program.graph_signature.input_specs
               if spec.kind == InputKind.BUFFER and spec.target in fqns}
    dropped = []
    for buffer, fqn in buffers.items():
        plan, current = [], None  # (node, the value it reads or None: erase), last copy
        order = {n: i for i, n in enumerate(graph.nodes)}
        for user in sorted(buffer.users, key=order.get):
            src = user.args[1] if user.op == "call_function" \
                and user.target == torch.ops.aten.copy_.default and user.args[0] is buffer \
                and len(user.args) == 2 else None
            if src is not None and _same_meta(src, buffer):
                plan.append((user, src))
                current = src
            elif current is None:
                plan = None  # the value before the call is read: the write is live
                break
            else:
                plan.append((user, current))
        if not plan:
            continue
        for user, value in plan:
            if user.target == torch.ops.aten.copy_.default and user.args[0] is buffer:
                user.replace_all_uses_with(value)
                graph.erase_node(user)
            else:
                user.replace_input_with(buffer, value)
        dropped.append(fqn)
    if dropped:
        graph.lint()
        program.graph_module.recompile()
    return dropped


def _same_meta(a, b) -> bool:
    """Whether FX nodes ``a`` and ``b`` hold tensors of one dtype and shape."""
    va, vb = a.meta.get("val") if hasattr(a, "meta") else None, b.meta.get("val")
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) \
        and va.dtype == vb.dtype and tuple(va.shape) == tuple(vb.shape)


def export_failure(name: str, exc: BaseException) -> str:
    """The message for method ``name``'s failed export: ``exc``'s type and first line
    (cut at 300 characters), the innermost frame of the model's code it came from
    (outside torch and vkdelegate), and a hint."""
    from vkdelegate.errors import first_line

    line = first_line(exc)
    if len(line) > 300:
        line = line[:297] + "..."
    where = _model_frame(exc)
    where = f" (raised at {where})" if where else ""
    return (f"exporting method {name!r} failed: {type(exc).__name__}: {line}{where}\n"
            f"  torch.export could not trace the model as vkdelegate.llm.lower calls it "
            f"(docs/LLM.md lists the families it is tested on); the full error is this "
            f"exception's __cause__ (Python: vkdelegate.llm.lower's traceback)")


def _model_frame(exc: BaseException) -> str:
    """``path:line in function`` of the innermost traceback frame of ``exc`` outside
    torch, vkdelegate and the standard library (the model's code, e.g.
    ``transformers/models/phi3/modeling_phi3.py:107 in forward``); "" if none."""
    import os
    import sysconfig
    import traceback

    import vkdelegate

    skip = [os.path.dirname(torch.__file__), os.path.dirname(vkdelegate.__file__),
            sysconfig.get_paths()["stdlib"]]
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if any(path.startswith(root + os.sep) for root in skip) or "<" in frame.filename:
            continue
        parts = path.split(os.sep)
        short = os.sep.join(parts[parts.index("site-packages") + 1:]) \
            if "site-packages" in parts else path
        found = f"{short}:{frame.lineno} in {frame.name}"
    return found


@contextlib.contextmanager
def _fake_assigned(module):
    """Inside the block, export may assign plain attributes (not parameters or
    buffers) of ``module``'s submodules; on exit each that holds a FakeTensor gets
    its value from before the block back (or is deleted if it had none): a traced
    tensor outlives its trace otherwise (transformers' LongRoPE set ``long_inv_freq``
    on the first forward, and the next method's export failed on a fake tensor of
    another fake mode)."""
    from torch._subclasses.fake_tensor import FakeTensor

    before = [(m, dict(m.__dict__)) for m in module.modules()]
    try:
        yield
    finally:
        for m, attrs in before:
            for key, value in list(m.__dict__.items()):
                if isinstance(value, FakeTensor):
                    if key in attrs:
                        m.__dict__[key] = attrs[key]
                    else:
                        del m.__dict__[key]


_SCALAR_READS = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)


def drop_dead_length_reads(program) -> bool:
    """Erase each ``.item()`` of ``program`` whose value nothing but SymInt arithmetic,
    comparisons and runtime assertions reads once dead tensors are gone (and what it
    alone read); True if any.

    OPT and BioGPT compute ``seq_length = cache.get_seq_length() + T`` (the cache
    length is ``start_pos``, a tensor) and ``torch.ones(1, seq_length)``, a mask they
    use only for position ids when none are given (HFDecoder gives them). The mask is
    dead, but the ``.item()`` of its size and export's assertion ``u0 >= 0`` on it
    stayed: CPU glue in prefill, decode and decode_next (the value read back from the
    device every step, and decode_next barred from ``run_repeated``). What the assertion
    checked (start_pos + T >= 0) the host checks before every call
    (``backend/llm_checks``: 0 <= start_pos), and decode_next's position only grows
    from a checked one."""
    from vkdelegate.backend.passes.cache_positions import erase_checks

    graph = program.graph_module.graph
    reads = [n for n in graph.nodes if n.op == "call_function" and n.target in _SCALAR_READS]
    if not reads:
        return False
    graph.eliminate_dead_code()  # the dead mask: asserts are impure and stay
    dropped = False
    for node in reads:
        if node.graph is graph and node in graph.nodes:
            dropped |= erase_checks(node)
    if dropped:
        graph.eliminate_dead_code()
    program.graph_module.recompile()
    return dropped


def export_methods(model, max_seq_len: int, vision=None) -> dict:
    """Method name -> ExportedProgram for ``model`` (a HF ``*ForCausalLM``; put in
    eval mode) and ``vision``.

    max_seq_len: positions of the static KV cache (the most tokens a generation may
    hold: prompt, image soft tokens and new tokens). Raises VkDelegateError for a
    max_seq_len below 2 or a model or vision tower that does not export.
    """
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise VkDelegateError(f"max_seq_len must be an int >= 2, got {max_seq_len!r}")
    model.eval()
    if isinstance(model, ReferenceDecoder):
        if model.kv_cache.max_seq_len != max_seq_len:
            raise VkDelegateError(f"the ReferenceDecoder's cache has "
                                  f"{model.kv_cache.max_seq_len} positions, not "
                                  f"max_seq_len {max_seq_len}")
        decoder, hidden, dtype = model, model.embed_tokens.weight.shape[1], torch.float32
    elif hasattr(model, "get_input_embeddings") and hasattr(model, "config"):
        decoder = HFDecoder(model, max_seq_len)
        hidden = model.get_input_embeddings().weight.shape[1]
        dtype = model.dtype
    else:
        raise VkDelegateError(f"lower() takes a transformers *ForCausalLM or a "
                              f"vkdelegate.llm ReferenceDecoder, got {type(model).__name__}")
    seq = Dim("T", min=1, max=max_seq_len)
    sampling = torch.tensor([0.0, 0.0, 1.0, 0.5])
    start = torch.zeros(1, dtype=torch.int64)
    loop = DecodeLoopState(max_seq_len)
    rewritten = ["decoder." + n for n in getattr(decoder, "rewritten_buffers", ())]
    programs = {
        "embed_text": _export(EmbedText(decoder), (torch.zeros(1, 2, dtype=torch.int64),),
                              ({1: seq},), "embed_text"),
        "prefill": _export(Prefill(decoder, loop), (torch.zeros(1, 2, hidden, dtype=dtype),
                                                    start, sampling), ({1: seq}, None, None),
                           "prefill", rewritten),
        "decode": _export(Decode(decoder, loop), (torch.zeros(1, 1, dtype=torch.int64), start,
                                                  sampling), None, "decode", rewritten),
        "decode_next": _export(DecodeNext(decoder, loop),
                               (sampling, torch.zeros(max_seq_len + 1)), None, "decode_next",
                               rewritten),
    }
    if vision is not None:
        encoder = VisionEncoder(vision).eval()
        if encoder.max_patches < 2:
            raise VkDelegateError("the vision tower's max_patches must be >= 2")
        patches = Dim("P", min=1, max=encoder.max_patches)
        n = min(4, encoder.max_patches)
        example = (torch.zeros(1, n, encoder.patch_dim, dtype=dtype),
                   torch.zeros(1, n, 2, dtype=torch.int64))
        programs["vision_encoder"] = _export(encoder, example, ({1: patches}, {1: patches}),
                                             "vision_encoder")
    return programs


def lower(model, max_seq_len: int, *, vision=None, options=None,
          quantization: "str | None" = None, group_size: "int | None" = None):
    """Lower a causal LM to a ``LoweredProgram`` with the methods embed_text, prefill,
    decode (and vision_encoder with ``vision=``; see the module docstring and
    docs/LLM.md). Run it with ``vkdelegate.llm.generate``; ``save`` it like any
    program (the cache is state: ``program.reset_state()`` empties it).

    model: a transformers ``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
    ``MistralForCausalLM`` (sliding window), ``GemmaForCausalLM``,
    ``Gemma2ForCausalLM`` or another ``*ForCausalLM`` whose layers use transformers'
    cache interface (tests/llm checks float32 weights), or a ``ReferenceDecoder``
    (``vkdelegate.llm.reference_decoder``, whose cache has max_seq_len positions).
    max_seq_len: static KV cache positions (int >= 2).
    vision: a vision tower + projector (``vkdelegate.llm.vision.VisionEncoder``).
    options: compile options for ``VulkanPartitioner`` (dict or CompileOptions).
    quantization: None or "none" (the model's own dtype), or "int8" (per-channel
        weight-only),
        "int4" (group-wise weight-only) or "8da4w" (dynamic int8 activations x int4
        weights): applied with torchao to the model's ``nn.Linear`` layers IN PLACE
        before export (``vkdelegate.backend.quantize.quantize_for_vulkan``; needs the
        ``quant`` extra), so the eager model afterwards is the quantized one the
        program matches; each quantized linear lowers to one fused ExecuTorch op
        (docs/LOWERING.md, "Quantized models"). A model quantized already (by an
        earlier ``lower`` with ``quantization=``) is refused: lower it without
        ``quantization=``. group_size: input features per scale for int4 / 8da4w
        (32, 64, 128 or 256; None: 32); refused with "int8" (per output channel) and
        without a quantization. Linears whose in_features the group size does not
        divide stay in floating point with a warning naming them; when that is every
        linear, VkDelegateError.
    A bfloat16 model (and vision tower) is converted to float32 IN PLACE first
    (exactly: every bf16 value is a float32 value; the device computes bf16 in
    float32 anyway), so that its KV cache is float32 state kept on the GPU; afterwards
    the eager model is that float32 model. The model is put in eval mode (in place,
    as ``model.eval()``: dropout off), which the exported methods need.
    The program's methods check the values of their inputs on the host before they
    run (``vkdelegate.backend.llm_checks``: start_pos and T + start_pos within the
    cache, token ids within the vocabulary, whose size is recorded in the plans,
    finite sampling values) and raise VkDelegateError naming the argument.
    Raises VkDelegateError when a method does not export or lower, for an unknown
    quantization scheme or group size, or for an end-of-sequence id outside the
    vocabulary (before the slow steps).
    """
    from vkdelegate.backend.partitioner import VulkanPartitioner
    from vkdelegate.backend.to_backend import to_backend

    _check_causal_lm(model)
    # A bfloat16 model (most checkpoints' dtype) is exported in float32, which is how
    # the device computes bf16 anyway (passes/bfloat16.py): its KV cache is then
    # float32 state on the GPU. Lowered as bf16, the cache was bf16 state cast to and
    # from float32 by CPU glue around every call, so it crossed the host every step
    # and decode_next could not loop on the device.
    parts = [model] + (list(vision) if isinstance(vision, (tuple, list)) else [vision])
    bf16 = [m for m in parts if isinstance(m, torch.nn.Module)
            and any(p.dtype == torch.bfloat16 for p in m.parameters())]
    # In place, as quantization is: the exported program shares the module's
    # parameters until to_backend has packed them, so they cannot go back to bf16.
    for m in bf16:
        m.float()
    if quantization == "none":  # the CLI's spelling (vkdelegate lower-llm)
        quantization = None
    if group_size is not None and quantization in (None, "int8"):
        raise VkDelegateError(
            "group_size applies to quantization 'int4' and '8da4w'; " +
            ("no quantization was given" if quantization is None else
             "int8 weights are quantized per output channel"))
    _check_eos_ids(model)
    _check_learned_positions(model, max_seq_len)
    if quantization is not None:
        from vkdelegate.backend.quantize import quantize_for_vulkan

        quantize_for_vulkan(model, quantization, group_size)
    programs = export_methods(model, max_seq_len, vision)
    program = to_backend(programs, VulkanPartitioner(options))
    record_vocab_size(program, _vocab_size(model), _eos_token_ids(model),
                      recompute_cache_at(model))
    return program


def _check_causal_lm(model) -> None:
    """``model`` must be a module that generates: a transformers model whose
    ``can_generate()`` is False (``BertModel``, an encoder without an LM head) or
    anything that is not a module (a model's name) is refused by name, before the slow
    steps (they failed deep in export with a size mismatch or an AttributeError)."""
    if not isinstance(model, torch.nn.Module) or not (
            isinstance(model, ReferenceDecoder) or (hasattr(model, "get_input_embeddings")
                                                    and hasattr(model, "config"))):
        raise VkDelegateError(f"lower() takes a transformers *ForCausalLM or a "
                              f"vkdelegate.llm ReferenceDecoder, got "
                              f"{type(model).__name__} {model!r:.60}")
    rank = getattr(getattr(model, "config", None), "kv_lora_rank", None)
    if isinstance(rank, int) and not isinstance(rank, bool):
        raise VkDelegateError(f"{type(model).__name__} uses multi-head latent attention "
                              f"(config.kv_lora_rank {rank}: DeepSeek-V2/V3's compressed "
                              f"keys and values), which vkdelegate.llm's KV cache does not "
                              f"hold; docs/LLM.md lists the decoder families that lower")
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and not isinstance(model, ReferenceDecoder) \
            and not can_generate():
        raise VkDelegateError(f"{type(model).__name__} cannot generate (its can_generate() "
                              f"is False: no language-model head): vkdelegate.llm.lower "
                              f"takes a *ForCausalLM; lower an encoder with to_backend "
                              f"(docs/LOWERING.md)")


def _check_learned_positions(model, max_seq_len) -> None:
    """A model with a learned position table (GPT-2's ``wpe`` of n_positions rows,
    OPT's ``embed_positions`` with its offset of 2, GPT-Neo, BioGPT) has no embedding
    past its last row: a cache longer than that is refused before the slow steps
    (it lowered, then failed mid-generation with an index out of range; HF raises
    there too). Rotary models have no such table."""
    if not isinstance(max_seq_len, int) or isinstance(model, ReferenceDecoder):
        return
    inputs = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") \
        else None
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1].lower()
        if module is inputs or not isinstance(module, torch.nn.Embedding) or \
                not ("pos" in leaf or leaf == "wpe"):
            continue
        rows = module.num_embeddings - int(getattr(module, "offset", 0) or 0)
        if max_seq_len > rows:
            raise VkDelegateError(
                f"max_seq_len {max_seq_len} is past the model's learned position table "
                f"{name} of {rows} positions: positions past it have no embedding; "
                f"lower with max_seq_len <= {rows}")


def _check_eos_ids(model) -> None:
    """An end-of-sequence id outside the vocabulary (HF only warns; small test configs
    of Phi-3 or OLMoE keep their real eos id) is refused before the slow steps, naming
    the setting to fix."""
    vocab = _vocab_size(model)
    bad = [i for i in _eos_token_ids(model) if not 0 <= i < vocab]
    if bad:
        raise VkDelegateError(
            f"the model's end-of-sequence id {bad[0]} (generation_config.eos_token_id, "
            f"or config.eos_token_id) is outside its vocabulary of {vocab}: set "
            f"model.generation_config.eos_token_id to ids below {vocab} (or None) "
            f"before lowering")


def recompute_cache_at(model) -> "int | None":
    """P for a HF model whose ``generate`` recomputes the whole KV cache at the step
    where the sequence first grows past P tokens, else None: Phi-3, PhiMoE and
    Phi-4-multimodal (``prepare_inputs_for_generation`` drops the cache when the
    input reaches ``config.original_max_position_embeddings`` + 1 tokens with at most
    that many cached: with LongRoPE the long-context rotary frequencies then apply
    to every position, the cached ones included). ``generate`` does the same with
    the program (a prefill of the whole sequence at that step), so its tokens stay
    HF's past that position. Found by the method's code reading the config field."""
    import inspect

    if isinstance(model, ReferenceDecoder):
        return None
    value = getattr(getattr(model, "config", None), "original_max_position_embeddings",
                    None)
    method = getattr(type(model), "prepare_inputs_for_generation", None)
    code = getattr(inspect.unwrap(method), "__code__", None) if method else None
    if not isinstance(value, int) or value < 1 or code is None \
            or "original_max_position_embeddings" not in code.co_names:
        return None
    return value


def _vocab_size(model) -> int:
    embed = model.embed_tokens if isinstance(model, ReferenceDecoder) \
        else model.get_input_embeddings()
    return int(embed.weight.shape[0])


def _eos_token_ids(model) -> list:
    """The model's end-of-sequence ids, those HF ``generate`` stops at:
    ``generation_config.eos_token_id`` (``config.eos_token_id`` for a model without a
    generation config; an int, a list or None); [] for a model without one (a
    ReferenceDecoder)."""
    source = getattr(model, "generation_config", None) or getattr(model, "config", None)
    ids = getattr(source, "eos_token_id", None)
    if ids is None:
        return []
    ids = [ids] if isinstance(ids, int) else list(ids)
    return sorted({int(i) for i in ids})


def record_vocab_size(program, vocab_size: int, eos_token_ids=(),
                      recompute_at: "int | None" = None) -> None:
    """Record ``vocab_size``, the model's ``eos_token_ids`` (ints) and, if not None,
    ``recompute_at`` (``recompute_cache_at``) in the plans of
    ``program``'s LLM methods (plan key ``"llm"``, saved with the program) and
    (re)install the host-side input checks (``vkdelegate.backend.llm_checks``), so
    that a token id outside 0..vocab_size-1 raises VkDelegateError naming it before
    anything runs; ``generate`` stops at the recorded ids by default. Raises
    VkDelegateError for an end-of-sequence id outside the vocabulary."""
    from vkdelegate.backend import llm_checks

    record = {"vocab_size": int(vocab_size)}
    if eos_token_ids:
        record["eos_token_ids"] = [int(i) for i in eos_token_ids]
    if recompute_at is not None:
        record["recompute_cache_at"] = int(recompute_at)
    for name in llm_checks.METHODS:
        if name in program.methods:
            program.methods[name].plan[llm_checks.PLAN_KEY] = dict(record)
    llm_checks.install(program)


