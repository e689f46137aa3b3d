"""Host-side checks of the inputs of an LLM program's methods (``vkdelegate.llm.lower``).

The shaders cannot tell a user what was wrong with an LLM call: a cache write at
``start_pos = -1`` is a valid negative index to ``index_copy`` on the device (it
wraps to the last slot, and the row then sees no key), and an id past the vocabulary
is flagged by the embedding node ("node 2 (aten.embedding.default): ..."). So a
program with the methods and state ``lower`` makes gets, per method, a
``MethodGuard`` (``MethodRunner.guard``) that checks the values the host holds
before anything runs, and raises VkDelegateError naming the method, the argument,
the value and the valid range:

- ``embed_text(tokens)``, ``decode(tokens, ...)``: every id in 0..V-1 (V: the
  vocabulary size ``lower`` records in the plan, ``plan["llm"]["vocab_size"]``;
  without it, e.g. a file saved before it, only negative ids are caught here).
- ``prefill(inputs_embeds [1, T, D], start_pos, ...)``: 0 <= start_pos and
  start_pos + T <= max_seq_len; ``decode``: 0 <= start_pos <= max_seq_len - 1.
- ``sampling``: finite values (``decode_next`` ignores sampling[3]: not checked);
  every finite value is valid (``custom_ops_llm.sample_reference``: temperature <= 0
  is greedy, top_k <= 0 or >= V keeps all, top_p <= 0 keeps one and >= 1 all, the
  draw is clamped to [0, 1]); ``decode_next``'s ``draws``: finite.

These are a few reads of small host arrays per call (``run_repeated``: per submit,
not per step). ``decode_next`` keeps its position on the device (``loop.pos``), so
the host does not know it without a download; the device flags a step fed at
position max_seq_len or later (the cache write's index check; the write is skipped)
and ``MethodGuard.explain`` turns that error into one that says so (reading
``loop.pos`` back, on the error path only). ``vkdelegate.llm.generate`` refuses a
``max_new_tokens`` that would run past the cache before it starts.
"""
from __future__ import annotations

import math

import numpy as np

from vkdelegate.errors import VkDelegateError, printable

#: FQN prefix of the KV cache state (vkdelegate.llm.decoder.KVCache).
CACHE_PREFIX = "decoder.kv_cache."
#: FQN prefix of the decode loop's state (vkdelegate.llm.decoder.DecodeLoopState).
LOOP_PREFIX = "loop."
#: The plan key where ``lower`` records what the host checks and ``generate`` need:
#: ``{"vocab_size": V, "eos_token_ids": [ids], "recompute_cache_at": P}`` (the ids
#: optional: files saved before they were recorded, models without one; P only for
#: a model whose HF generation recomputes its cache at position P: ``recompute_cache_at``).
PLAN_KEY = "llm"
#: The most end-of-sequence ids a plan may record (Llama 3 has 3).
MAX_EOS_IDS = 64
#: The methods checked here.
METHODS = ("embed_text", "prefill", "decode", "decode_next")
SAMPLING = ("temperature", "top_k", "top_p", "draw")


def cache_length(store) -> "int | None":
    """Positions of the KV cache of a program's state store, or None without one."""
    for fqn, value in store.initial.items():
        if fqn.startswith(CACHE_PREFIX) and len(getattr(value, "shape", ())) == 4:
            return int(value.shape[2])
    return None


def vocab_size(plan: dict) -> "int | None":
    """The vocabulary size ``lower`` recorded in ``plan`` (None: not recorded).
    Raises VkDelegateError for a malformed record (a plan is untrusted data)."""
    record = plan.get(PLAN_KEY)
    if record is None:
        return None
    v = record.get("vocab_size") if isinstance(record, dict) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise VkDelegateError(f"plan.{PLAN_KEY}.vocab_size must be an int >= 1, got "
                              f"{v!r}")
    return v


def eos_token_ids(plan: dict) -> list:
    """The end-of-sequence token ids ``lower`` recorded in ``plan`` (the model's
    ``generation_config.eos_token_id``), [] where none were. Raises VkDelegateError
    for a malformed record (a plan is untrusted data): not a list of at most
    MAX_EOS_IDS ints in 0..vocab size - 1."""
    record = plan.get(PLAN_KEY)
    ids = record.get("eos_token_ids", []) if isinstance(record, dict) else []
    if not isinstance(ids, list) or len(ids) > MAX_EOS_IDS or any(
            isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise VkDelegateError(f"plan.{PLAN_KEY}.eos_token_ids must be a list of at most "
                              f"{MAX_EOS_IDS} ints, got {printable(repr(ids)[:80])}")
    text = token_id_error(np.asarray(ids, dtype=np.int64), vocab_size(plan),
                          f"plan.{PLAN_KEY}.eos_token_ids")
    if text is not None:
        raise VkDelegateError(text)
    return list(ids)


def recompute_cache_at(plan: dict) -> "int | None":
    """The position P ``lower`` recorded in ``plan`` for a model whose HF generation
    recomputes the whole KV cache when the sequence first grows past P tokens (Phi-3
    and PhiMoE with LongRoPE: ``original_max_position_embeddings``; the long-context
    rotary frequencies then apply to every cached position), None where none was.
    Raises VkDelegateError for a malformed record (not an int >= 1)."""
    record = plan.get(PLAN_KEY)
    value = record.get("recompute_cache_at") if isinstance(record, dict) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise VkDelegateError(f"plan.{PLAN_KEY}.recompute_cache_at must be an int >= 1, "
                              f"got {printable(repr(value)[:80])}")
    return value


def install(program) -> None:
    """Give each method of an LLM program (methods prefill and decode, a
    ``decoder.kv_cache.*`` state) its ``MethodGuard``; any other program is left
    alone. Idempotent (``lower`` calls it again after recording the vocabulary)."""
    names = program.method_names
    length = cache_length(program.store)
    if "prefill" not in names or "decode" not in names or length is None:
        return
    for name in METHODS:
        if name in names:
            runner = program.runner(name)
            runner.guard = MethodGuard(name, runner.plan, length, program.store)


def token_id_error(ids: np.ndarray, vocab: "int | None", label: str) -> "str | None":
    """What is wrong with the token ids ``ids`` (an integer array) for a vocabulary of
    ``vocab`` ids (None: unknown, only negatives are caught), naming the first bad one
    as ``label[index]``; None when they are all valid. The message of the methods'
    checks and of ``vkdelegate.llm.generate``'s prompt check."""
    ids = np.asarray(ids)
    if ids.size == 0:
        return None
    valid = f"0..{vocab - 1}" if vocab is not None else "0..vocab size - 1"
    low = int(ids.argmin())
    if ids.flat[low] < 0:
        return (f"token id {int(ids.flat[low])} at {label}[{_at(ids.shape, low)}] is "
                f"negative (ids are {valid})")
    high = int(ids.argmax())
    if vocab is not None and ids.flat[high] >= vocab:
        return (f"token id {int(ids.flat[high])} at {label}[{_at(ids.shape, high)}] >= "
                f"vocab size {vocab} (ids are {valid})")
    return None


def _array(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (check_inputs made sure it is dense)
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _at(shape, flat_index: int) -> str:
    return ", ".join(str(int(i)) for i in np.unravel_index(flat_index, shape))


class MethodGuard:
    """The checks of one LLM method (see the module docstring): ``check(flat
    inputs)`` before the run, ``explain(exc)`` after a device error (a better
    VkDelegateError, or None to raise ``exc`` as it is)."""

    def __init__(self, method: str, plan: dict, max_seq_len: int, store):
        self.method, self.max_seq_len, self.store = method, max_seq_len, store
        self.vocab = vocab_size(plan)
        eos_token_ids(plan)  # a malformed record is refused at load, not at generate
        recompute_cache_at(plan)
        self.index = {spec.get("name"): i for i, spec in enumerate(plan["inputs"])}

    def _error(self, text: str) -> VkDelegateError:
        return VkDelegateError(f"{self.method}: {text}")

    def check(self, flat: list) -> None:
        index = self.index
        # Integer inputs only: a crafted program file may declare other dtypes.
        if "tokens" in index:
            tokens = _array(flat[index["tokens"]])
            if np.issubdtype(tokens.dtype, np.integer):
                self._tokens(tokens)
        if "start_pos" in index:
            count = 1
            if "inputs_embeds" in index:
                shape = tuple(flat[index["inputs_embeds"]].shape)
                count = int(shape[1]) if len(shape) > 1 else 1
            pos = _array(flat[index["start_pos"]])
            if pos.size and np.issubdtype(pos.dtype, np.integer):
                self._start_pos(pos, count)
        if "sampling" in index:
            n = 3 if self.method == "decode_next" else 4
            values = _array(flat[index["sampling"]]).reshape(-1)[:n]
            for i, v in enumerate(values.tolist()):
                if not math.isfinite(v):
                    ignored = "; decode_next ignores sampling[3]" if n == 3 else ""
                    raise self._error(
                        f"sampling[{i}] ({SAMPLING[i]}) is {v}; sampling must be "
                        f"float32[4] = (temperature, top_k, top_p, draw), finite values "
                        f"(temperature 0: greedy; top_k 0 and top_p 1: all tokens; the "
                        f"draw uniform in [0, 1){ignored})")
        if "draws" in index:
            draws = _array(flat[index["draws"]]).reshape(-1)
            bad = np.flatnonzero(~np.isfinite(draws))
            if bad.size:
                raise self._error(f"draws[{int(bad[0])}] is {draws[bad[0]]}; the draws "
                                  f"must be finite (uniform in [0, 1))")

    def _tokens(self, tokens: np.ndarray) -> None:
        text = token_id_error(tokens, self.vocab, "tokens")
        if text is not None:
            raise self._error(text)

    def _start_pos(self, value: np.ndarray, count: int) -> None:
        pos, size = int(value.reshape(-1)[0]), self.max_seq_len
        if 0 <= pos <= size - count:
            return
        if count == 1:
            raise self._error(f"start_pos {pos} out of range 0..{size - 1} for "
                              f"max_seq_len {size}")
        raise self._error(f"start_pos {pos} with T = {count} tokens (inputs_embeds dim 1) "
                          f"writes cache positions {pos}..{pos + count - 1}, outside "
                          f"0..{size - 1} for max_seq_len {size}: start_pos must be in "
                          f"0..{size - count} for T = {count}")

    def explain(self, exc: VkDelegateError) -> "VkDelegateError | None":
        """For decode_next: the error of a step fed past the cache, from ``loop.pos``
        (read back; this runs only after a failure). None: ``exc`` as it is."""
        if self.method != "decode_next":
            return None
        try:
            pos = int(_array(self.store.get(LOOP_PREFIX + "pos")).reshape(-1)[0])
        except (KeyError, VkDelegateError):
            return None
        size = self.max_seq_len
        if pos <= size:
            return None
        return type(exc)(
            f"decode_next: the decode loop ran past the KV cache (max_seq_len {size}): a "
            f"step was fed position {size} or later, and loop.pos is now {pos}. At most "
            f"max_seq_len - loop.pos steps fit after prefill or decode; the steps past "
            f"the cache wrote nothing to it or to loop.history (the rest is as the steps "
            f"inside it left it). Call prefill or decode with a start_pos, or "
            f"reset_state(), to go on. (The first of the device's errors it raised, "
            f"for the record; a graph's tables such as the rotary one hold 2 x "
            f"max_seq_len rows: {exc})")
