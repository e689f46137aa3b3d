"""Conversations that keep the KV cache between turns (prefix reuse).

``generate`` prefills its whole prompt from position 0 every call. A chat sends the
whole conversation each turn, of which all but the new message is already in the
cache from the turn before. ``Session`` remembers which token ids the program's cache
holds, position by position, and each ``generate(ids, ...)`` prefills only what
follows the longest prefix of ``ids`` the cache already holds (at least the last id:
prefill's output is the next token), then decodes as ``generate`` does. A prompt that
differs from the cached tokens at position p (an edited message, a reply re-encoded
differently) rewinds to p: cache positions past it are overwritten before any query
can see them (causal attention reads only positions before the one fed). The tokens
are those of ``generate(program, ids, ...)`` from an empty cache, up to the summation
order of a prefill split in two (tests/llm/test_session.py). Torch-free.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.llm.generate import (_check_length, _check_sampling, _prompt_list,
                                     cache_length, generate, recompute_cache_at)


class Session:
    """A conversation with ``program`` (a ``LoweredProgram`` of ``vkdelegate.llm.lower``,
    or one loaded from its file). Another caller of the program (``generate``, a second
    session, a method call, ``reset_state``) changes its cache behind the session's
    back: the session sees that (the program state's ``version``) and prefills its next
    turn's whole conversation, so its tokens stay those of ``generate``.

    ``cached``: the token ids whose keys and values the cache holds, in position
    order (a copy). ``reused``: how many positions the last ``generate`` did not
    prefill again.
    """

    def __init__(self, program):
        self.program = program
        self._cached: list = []
        self.reused = 0
        program.reset_state()
        self._version = self._state_version()

    def _state_version(self):
        store = getattr(self.program, "store", None)
        return getattr(store, "version", None)

    @property
    def cached(self) -> list:
        return list(self._cached)

    def reset(self) -> None:
        """Forget the cached tokens and empty the program's state."""
        self._cached = []
        self.reused = 0
        self.program.reset_state()
        self._version = self._state_version()

    def generate(self, ids, max_new_tokens: int, **kwargs) -> list:
        """The new token ids after the whole conversation ``ids`` (a list of ints or a
        1-D tensor: every token so far, the replies included, then the new message),
        as ``vkdelegate.llm.generate(program, ids, max_new_tokens, **kwargs)`` gives
        them from an empty cache, prefilling only the part of ``ids`` past the longest
        prefix the cache holds (see the module docstring). kwargs: generate's
        (temperature, top_k, top_p, seed, eos_token_id, on_token, timings,
        decode_chunk; timings' prompt_tokens counts the prefilled ids only); not
        ``image`` (its soft tokens are not ids the session could match).
        Raises VkDelegateError as ``generate`` does (empty ids, a conversation past
        the cache, sampling settings out of range: refused before anything runs, the
        session kept as it was), or for max_new_tokens 0 (nothing would be cached) or
        an image; after an error while running, the next call prefills its whole
        conversation."""
        if "image" in kwargs or "image_token_id" in kwargs:
            raise VkDelegateError("Session.generate takes no image: call "
                                  "vkdelegate.llm.generate for a turn with one")
        if isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) \
                and max_new_tokens == 0:
            raise VkDelegateError("Session.generate needs max_new_tokens >= 1")
        ids = _prompt_list(ids)
        if not ids:
            raise VkDelegateError("Session.generate needs at least one token id")
        if self._state_version() != self._version:
            self._cached = []  # someone else ran the program: its cache is not ours
        same = 0
        for a, b in zip(self._cached, ids):
            if a != b:
                break
            same += 1
        start = min(same, len(ids) - 1)  # prefill at least the last id
        switch = recompute_cache_at(self.program)
        if switch is not None and (len(self._cached) > switch) != (len(ids) > switch):
            # Phi-3 / PhiMoE (generate's recompute_cache_at): the cache was computed
            # with the other rotary frequencies than this conversation's prefill uses.
            start = 0
        # Refused before anything runs: the cache and the session stay as they were.
        _check_sampling(max_new_tokens, kwargs.get("temperature", 0.0),
                        kwargs.get("top_k", 0), kwargs.get("top_p", 1.0))
        _check_length(len(ids), max_new_tokens, cache_length(self.program),
                      " (the whole conversation)")
        self._cached = []  # unknown if generate fails: the next call prefills it all
        out = generate(self.program, ids[start:], max_new_tokens, _start=start,
                       _context=ids[:start], **kwargs)
        # Only now (generate checked everything first): the cache holds ids and every
        # new token but the last (never fed back).
        self._cached = ids + out[:-1]
        self.reused = start
        self._version = self._state_version()
        return out
