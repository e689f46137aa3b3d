"""``generate``: prompt -> new token ids, through the methods ``lower`` makes.

embed_text on the prompt; with an image, vision_encoder and the splice (one image
placeholder per VALID soft token, padded rows skipped); prefill at start_pos 0; then
the decode steps, start_pos = the number of tokens already in the cache: with the
program's ``decode_next`` method (``vkdelegate.llm.decoder``: the token and position are
program state on the device), ``decode_chunk`` steps per submit
(``LoweredProgram.run_repeated``), the new ids read from ``loop.history`` after each
chunk; else (``decode_chunk=1``, or a program saved without it) one ``decode`` call
per token.
The random draw of each sampled token is ``torch.rand((), generator=g,
dtype=torch.float64)`` of a ``torch.Generator`` seeded with ``seed``, one per generated
token (also under greedy decoding, where it is ignored), so that a run is reproducible
and host-side sampling with the same draws gives the same tokens; ``draws`` computes
those numbers with numpy's MT19937 (torch's CPU generator), so generate, like the
programs it runs, needs no torch.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from vkdelegate.backend.interpreter import to_numpy
from vkdelegate.backend import llm_checks
from vkdelegate.backend.llm_checks import LOOP_PREFIX
from vkdelegate.errors import VkDelegateError


#: generate's default decode steps per submit (decode_next).
DECODE_CHUNK = 16
_HISTORY = LOOP_PREFIX + "history"


def cache_length(program) -> int:
    """Positions of the KV cache of a program ``lower`` made (from its state).
    Raises VkDelegateError for a program without one."""
    from vkdelegate.backend.llm_checks import cache_length as length

    found = length(program.store)
    if found is not None:
        return found
    raise VkDelegateError("the program has no KV cache state (not made by "
                          "vkdelegate.llm.lower)")


def _has_loop(program) -> bool:
    """Whether ``program`` has ``decode_next`` and its loop state (lower() since the
    decode loop; a program file saved before it has neither) and decode_next can
    repeat on the device: one delegate alone (a model whose decode step keeps a CPU
    op, such as OPT's runtime assert on a position read back with ``.item()``, takes
    the per-token loop instead)."""
    names = getattr(getattr(program, "store", None), "names", ())
    return "decode_next" in program.method_names and _HISTORY in names \
        and program.runner("decode_next").repeat_blocker() is None


def _on_device(program) -> bool:
    """Whether the program's delegates run on the Vulkan runtime (compile option
    executor "vulkan"): decode_next repeats in one submit only there; the reference
    executor (torch on the CPU, for debugging) takes the per-token loop."""
    options = getattr(program, "options", None)
    return getattr(options, "executor", "vulkan") == "vulkan"


def eos_token_ids(program) -> list:
    """The end-of-sequence token ids ``lower`` recorded for ``program``'s model (its
    ``generation_config.eos_token_id``: a list of ints, sorted), [] where none were
    (a model without one, a file saved before they were recorded). ``generate``
    stops at them unless given its own ``eos_token_id``."""
    plan = program.methods["decode"].plan if "decode" in getattr(
        program, "method_names", ()) else {}
    return llm_checks.eos_token_ids(plan)


def _decode_loop(program, first, out, max_new_tokens, eos, on_token, chunk, params,
                 rand, switch=None, recompute=None) -> None:
    """The decode steps on the device after prefill (which left ``out[-1]`` in the
    loop state for position ``first``, the cache positions prefill filled): ``chunk``
    decode_next steps per submit, until max_new_tokens or an eos id; appends to
    ``out``. The step feeding position p uses draw number p - first + 1 (prefill used
    number 0), as the per-token loop. The step feeding position ``switch`` (None:
    none) is ``recompute(draw)`` instead (a prefill of the whole sequence, which
    leaves the loop state where decode_next left it), a chunk stopping before it."""
    table = np.zeros(cache_length(program) + 1, dtype=np.float32)
    if params[0] > 0:  # greedy ignores the draws
        for i in range(max_new_tokens - len(out)):
            table[first + i] = next(rand)
    sampling = np.array([*params, 0.0], dtype=np.float32)
    while len(out) < max_new_tokens and out[-1] not in eos:
        k = min(chunk, max_new_tokens - len(out))
        position = first + len(out) - 1  # where out[-1] is fed
        if position == switch:
            out.append(recompute(float(table[position])))
            if on_token is not None:
                on_token(out[-1])
            continue
        if switch is not None and position < switch:
            k = min(k, switch - position)
        program.run_repeated("decode_next", k, sampling, table)
        new = to_numpy(program.store.get(_HISTORY, rows=slice(position + 1, position + 1 + k)))
        for token in new.tolist():
            out.append(int(token))
            if on_token is not None:
                on_token(int(token))
            if out[-1] in eos:
                break


def recompute_cache_at(program) -> "int | None":
    """The position P at which ``generate`` recomputes the cache of ``program``'s model
    (``vkdelegate.llm.lower.recompute_cache_at``: Phi-3 / PhiMoE as HF generates
    them), None for other models and files saved before it was recorded."""
    plan = program.methods["prefill"].plan if "prefill" in getattr(
        program, "method_names", ()) else {}
    return llm_checks.recompute_cache_at(plan)


def draws(seed: int):
    """The draws ``generate`` uses: an endless iterator of floats in [0, 1), equal bit
    for bit to ``torch.rand((), generator=torch.Generator().manual_seed(seed),
    dtype=torch.float64)`` called again and again. Torch's CPU generator is MT19937
    seeded with the low 32 bits of the seed (the reference ``init_genrand``, as numpy's
    legacy RandomState seeds it); a float64 draw takes two 32-bit outputs, the first
    as the high word, and keeps its low 53 bits times 2**-53 (ATen's
    ``uniform_real_distribution``)."""
    rng = np.random.RandomState(int(seed) & 0xFFFFFFFF)
    while True:
        hi, lo = (int(v) for v in rng.randint(0, 2 ** 32, size=2, dtype=np.uint32))
        yield float(((hi << 32) | lo) & ((1 << 53) - 1)) * 2.0 ** -53


def splice(text_embeds, ids: list, image_embeds, pooler_mask, image_token_id: int):
    """(embeds [1, N, D], token ids [N]) with the valid image rows in place of the
    prompt's image placeholders: one ``image_token_id`` in ``ids`` is expanded to one
    placeholder per valid soft token (``pooler_mask`` true); a prompt that already
    holds exactly that many placeholders has them replaced in order. Raises
    VkDelegateError for any other number of placeholders."""
    mask = to_numpy(pooler_mask).reshape(-1).astype(bool)
    rows = to_numpy(image_embeds).reshape(mask.shape[0], -1)[mask]
    text = to_numpy(text_embeds)[0]
    where = [i for i, t in enumerate(ids) if t == image_token_id]
    n = int(rows.shape[0])
    if len(where) == 1:
        at = where[0]
        ids = ids[:at] + [image_token_id] * n + ids[at + 1:]
        text = np.concatenate([text[:at], rows.astype(text.dtype), text[at + 1:]])
    elif len(where) == n:
        text = text.copy()
        text[where] = rows.astype(text.dtype)
    else:
        raise VkDelegateError(f"the prompt holds {len(where)} image placeholders "
                              f"({image_token_id}); give one, or one per valid soft "
                              f"token ({n})")
    return text[None], ids


def _check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    """VkDelegateError naming the first argument outside its range."""
    import math

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 0:
        raise VkDelegateError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature >= 0):
        raise VkDelegateError(f"temperature must be a finite number >= 0 (0: greedy), "
                              f"got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise VkDelegateError(f"top_k must be an int >= 0 (0: all tokens), got {top_k!r}")
    if not (isinstance(top_p, (int, float)) and 0 <= top_p <= 1):
        raise VkDelegateError(f"top_p must be a number in [0, 1] (1: all tokens), "
                              f"got {top_p!r}")


def _check_length(prompt: int, max_new_tokens: int, max_seq_len: int, note: str) -> None:
    """VkDelegateError, before anything runs, unless ``prompt`` tokens and
    ``max_new_tokens`` new ones fit the cache: prefill writes the prompt's positions,
    each new token but the last is fed back at the next one (the last is never fed),
    so they need prompt + max_new_tokens - 1 <= max_seq_len positions. Checked up
    front because the decode loop on the device keeps its position there
    (``decode_next``), where the host does not see it step by step."""
    need = prompt + max_new_tokens - 1
    if need <= max_seq_len:
        return
    if prompt > max_seq_len:
        raise VkDelegateError(f"the prompt's {prompt} tokens{note} do not fit the KV "
                              f"cache: {prompt} prompt tokens + {max_new_tokens} new need "
                              f"{need} cache positions (the last new token is not "
                              f"stored); the program has {max_seq_len} (max_seq_len)")
    raise VkDelegateError(f"max_new_tokens {max_new_tokens} does not fit the KV cache: "
                          f"{prompt} prompt tokens{note} + {max_new_tokens} new need "
                          f"{need} cache positions (the last new token is not stored); "
                          f"the program has {max_seq_len} (max_seq_len), so at most "
                          f"{_tokens(max_seq_len - prompt + 1)} fit this prompt")


def _tokens(n: int) -> str:
    """``n`` new token(s), in words: "1 new token", "5 new tokens"."""
    return f"{n} new token" + ("" if n == 1 else "s")


def _prompt_list(prompt_ids) -> list:
    """prompt_ids (a list, tuple or range of ints, or a 1-D integer tensor; [1, T] is taken as
    its one row) as a list of Python ints; VkDelegateError for anything else (floats,
    bools, strings, a batch of several rows), which int() would silently truncate or
    split."""
    torch = sys.modules.get("torch")
    is_tensor = torch is not None and isinstance(prompt_ids, torch.Tensor)
    if is_tensor or isinstance(prompt_ids, np.ndarray):
        what = f"{prompt_ids.dtype} {'tensor' if is_tensor else 'array'}"
        array = to_numpy(prompt_ids)
        if array.dtype.kind not in "iu":
            raise VkDelegateError(f"prompt_ids must be integer token ids, got a {what}")
        if array.ndim == 2 and array.shape[0] == 1:
            array = array[0]
        if array.ndim != 1:
            raise VkDelegateError(f"prompt_ids must be one sequence (a 1-D tensor or "
                                  f"[1, T]), got sizes {list(array.shape)}")
        return array.tolist()
    return _int_ids(prompt_ids, "prompt_ids")


def _int_ids(values, name: str) -> list:
    """``values`` (a list, tuple or range of ints) as a list of Python ints;
    VkDelegateError naming ``name`` and the first item that is not an int (a bool, a
    float, a string)."""
    import operator

    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
        raise VkDelegateError(f"{name} must be a list of int token ids"
                              f"{' or a 1-D tensor' if name == 'prompt_ids' else ''}, "
                              f"got {type(values).__name__}")
    ids = []
    for i, t in enumerate(values):
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))
        except TypeError:
            raise VkDelegateError(f"{name}[{i}] = {t!r} is not an int token id") from None
    return ids


def _check_token_ids(program, ids: list, name: str = "prompt_ids",
                     single: bool = False) -> None:
    """VkDelegateError naming the first id of ``ids`` (``name`` in the message, with
    its index unless ``single``: one id given as an int) outside the vocabulary (when
    the program records its size, ``backend.llm_checks.vocab_size``; else negatives),
    before anything runs."""
    plan = program.methods["embed_text"].plan if hasattr(program, "methods") else {}
    text = llm_checks.token_id_error(np.asarray(ids, dtype=np.int64),
                                     llm_checks.vocab_size(plan), name)
    if text is not None and single:
        text = text.replace(f" at {name}[0]", f" ({name})")
    if text is not None:
        raise VkDelegateError(text)


def generate(program, prompt_ids, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             eos_token_id=None, image=None, image_token_id=None,
             on_token=None, timings: "dict | None" = None,
             decode_chunk: int = DECODE_CHUNK, _start: int = 0,
             _context: "list | None" = None) -> list:
    """The NEW token ids (a list of ints, at most ``max_new_tokens``, ending at the
    first end-of-sequence id if one is generated).

    eos_token_id: an int or a collection of ints; None (the default), as in HF
    ``generate``: the model's own (``eos_token_ids(program)``: its
    ``generation_config.eos_token_id``, recorded by ``lower``; none for a file
    saved before they were recorded); an empty collection: never stop early.

    program: a ``LoweredProgram`` from ``vkdelegate.llm.lower`` (or loaded from its
    file). prompt_ids: a list of ints or a 1-D tensor (not empty).
    temperature 0: greedy; else sampled with top_k (0: all) and top_p (see
    ``vkdelegate.llm.sampler``) and draws from ``draws(seed)``.
    image: (pixel_values float[1, P, C*p*p], pixel_position_ids int64[1, P, 2]) for
    the program's vision_encoder; image_token_id: the placeholder it replaces (see
    ``splice``). on_token: called with each new id as it is made (streaming; with
    ``decode_chunk`` > 1, the ids of a chunk come together after it has run).
    decode_chunk: decode steps per submit (int >= 1); a chunk that makes an
    ``eos_token_id`` stops there, its later steps' tokens discarded (their cache
    positions are past the returned sequence).
    timings: a dict to fill with prefill_s, decode_s, prompt_tokens, decode_tokens
    (seconds of the calls alone: the program's delegates are built first).
    A program whose model's HF generation recomputes its KV cache when the sequence
    first grows past P tokens (Phi-3 / PhiMoE with LongRoPE, P its
    ``original_max_position_embeddings``; ``recompute_cache_at``) does so too: the
    step that feeds position P is a prefill of the whole sequence from position 0
    (with LongRoPE's long-context frequencies, as every later step), not a decode.
    Raises VkDelegateError for a program without the methods ``lower`` makes, an
    empty prompt, a negative max_new_tokens, sampling settings outside their ranges
    (temperature >= 0, top_k >= 0, 0 <= top_p <= 1), a prompt id or an
    ``eos_token_id`` outside the vocabulary, a prompt + max_new_tokens longer than the
    cache (prompt + max_new_tokens - 1 > max_seq_len: checked before anything runs, so the decode
    loop never runs past the cache), an image without image_token_id or a program
    without vision_encoder.
    """
    missing = [m for m in ("embed_text", "prefill", "decode")
               if m not in getattr(program, "method_names", ())]
    if missing:
        raise VkDelegateError(
            f"not a program of vkdelegate.llm.lower: it has no {', '.join(missing)} "
            f"method{'s' if len(missing) > 1 else ''} (its methods: "
            f"{', '.join(getattr(program, 'method_names', ())) or 'none'})")
    _check_sampling(max_new_tokens, temperature, top_k, top_p)
    if isinstance(decode_chunk, bool) or not isinstance(decode_chunk, int) \
            or decode_chunk < 1:
        raise VkDelegateError(f"decode_chunk must be an int >= 1, got {decode_chunk!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise VkDelegateError(f"seed must be an int, got {seed!r}")
    if eos_token_id is not None:
        single = isinstance(eos_token_id, (int, np.integer)) and \
            not isinstance(eos_token_id, bool)
        eos_token_id = int(eos_token_id) if single else _int_ids(eos_token_id,
                                                                   "eos_token_id")
    ids = _prompt_list(prompt_ids)
    if not ids:
        raise VkDelegateError("generate() needs at least one prompt token")
    _check_token_ids(program, ids)
    if timings is not None:
        timings.update(prefill_s=0.0, decode_s=0.0, prompt_tokens=0, decode_tokens=0)
    if max_new_tokens == 0:
        return []
    if hasattr(program, "build"):
        # Every delegate built before the clock starts: the first call would
        # otherwise count shader compilation and weight upload as prefill / decode.
        program.build()
    # _start (Session): the cache already holds that many positions of this sequence;
    # the prompt goes in after them.
    cached = " (with the conversation's cached tokens)" if _start else ""
    if image is None:
        _check_length(_start + len(ids), max_new_tokens, cache_length(program), cached)
    if eos_token_id is None:
        eos = set(eos_token_ids(program))
    else:
        eos = {int(eos_token_id)} if isinstance(eos_token_id, int) \
            else set(map(int, eos_token_id))
    if eos:  # an id no step can make would never stop the loop: a mistake, said now
        _check_token_ids(program, sorted(eos), "eos_token_id",
                         single=isinstance(eos_token_id, int))
    start = time.perf_counter()
    embeds = program.embed_text(np.array([ids], dtype=np.int64))
    if image is not None:
        if image_token_id is None:
            raise VkDelegateError("an image needs image_token_id (its placeholder)")
        if "vision_encoder" not in program.method_names:
            raise VkDelegateError("the program has no vision_encoder method")
        image_embeds, pooler_mask = program.vision_encoder(*image)
        embeds, ids = splice(embeds, ids, image_embeds, pooler_mask, int(image_token_id))
    _check_length(_start + len(ids), max_new_tokens, cache_length(program),
                  (" (image soft tokens included)" if image is not None else "") + cached)
    rand = draws(seed)

    def sampling():
        return np.array([temperature, top_k, top_p, next(rand)], dtype=np.float32)

    token = int(program.prefill(embeds, np.array([_start], dtype=np.int64), sampling())[0])
    prefill_s = time.perf_counter() - start
    out = [token]
    if on_token is not None:
        on_token(token)
    # Phi-3 / PhiMoE: the step that feeds position `switch` prefills the whole sequence
    # (HF's prepare_inputs_for_generation drops the cache there); a prefill that
    # already went past it computed every position with the long frequencies.
    switch = recompute_cache_at(program)
    if switch is not None and _start + len(ids) > switch:
        switch = None
    context = list(_context or [])
    if switch is not None and len(context) != _start:
        raise VkDelegateError(f"generate: {_start} cached positions but {len(context)} "
                              f"context ids")

    def recompute(draw: float) -> int:
        parts = [to_numpy(program.embed_text(np.array([context], dtype=np.int64)))] \
            if context else []
        parts += [to_numpy(embeds),
                  to_numpy(program.embed_text(np.array([out], dtype=np.int64)))]
        return int(program.prefill(np.concatenate(parts, axis=1),
                                   np.zeros(1, dtype=np.int64),
                                   np.array([temperature, top_k, top_p, draw],
                                            dtype=np.float32))[0])

    start = time.perf_counter()
    if decode_chunk > 1 and _has_loop(program) and _on_device(program):
        _decode_loop(program, _start + len(ids), out, max_new_tokens, eos, on_token,
                     decode_chunk, (temperature, top_k, top_p), rand, switch, recompute)
    while len(out) < max_new_tokens and out[-1] not in eos:
        position = _start + len(ids) + len(out) - 1
        if position == switch:
            token = recompute(float(sampling()[3]))
        else:
            token = int(program.decode(np.array([[out[-1]]], dtype=np.int64),
                                       np.array([position], dtype=np.int64),
                                       sampling())[0])
        out.append(token)
        if on_token is not None:
            on_token(token)
    if timings is not None:
        timings.update(prefill_s=prefill_s, decode_s=time.perf_counter() - start,
                       prompt_tokens=len(ids), decode_tokens=len(out) - 1)
    return out
