"""Mutated and truncated blobs: the reader raises VkDelegateError and nothing else."""
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from vkdelegate.errors import VkDelegateError
from vkdelegate.serialization.blob import read_blob, write_blob

from .graphs import every_kind_graph

VALID = write_blob(every_kind_graph(), bytes(range(256)) * 2)
FB_END = 32 + int.from_bytes(VALID[14:18], "little")
# Blobs written by ExecuTorch (flatc lays tables out differently from our Builder).
ET_BLOBS = sorted((Path(__file__).resolve().parents[1] / "data" / "et_vk").glob("*.bin"))


def _read(data: bytes) -> str:
    """'ok' or 'error'; any exception other than VkDelegateError fails the test."""
    try:
        blob = read_blob(data)
    except VkDelegateError as exc:
        assert str(exc), "error without a message"
        return "error"
    for i in range(len(blob.graph.constants)):  # what a loader does next
        try:
            blob.constant_bytes(i, {})
        except VkDelegateError:
            pass
    return "ok"


def _mutations(seed: int, count: int, valid: bytes = VALID):
    rng = random.Random(seed)
    fb_end = 32 + int.from_bytes(valid[14:18], "little")
    for _ in range(count):
        data = bytearray(valid)
        kind = rng.randrange(4)
        if kind == 0:      # truncate anywhere
            yield bytes(data[:rng.randrange(len(data))])
            continue
        if kind == 1:      # flip bytes inside the flatbuffer, where the offsets are
            positions = [rng.randrange(32, fb_end) for _ in range(rng.randint(1, 6))]
        else:              # anywhere in the blob
            positions = [rng.randrange(len(data)) for _ in range(rng.randint(1, 6))]
        for p in positions:
            data[p] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        if kind == 3:      # and write a large 32-bit value (a wild offset or count)
            p = rng.randrange(32, fb_end - 4)
            data[p:p + 4] = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 0x10000, len(data)]).to_bytes(4, "little")
        yield bytes(data)


def test_seeded_mutations_raise_only_our_error():
    outcomes = [_read(d) for d in _mutations(seed=20261130, count=4000)]
    # Most mutations must be caught; an all-"ok" run would mean the reader checks nothing.
    assert outcomes.count("error") > 1500
    assert _read(VALID) == "ok"


@pytest.mark.parametrize("path", ET_BLOBS, ids=lambda p: p.stem)
def test_mutated_et_blobs_raise_only_our_error(path):
    valid = path.read_bytes()
    assert _read(valid) == "ok"
    outcomes = [_read(d) for d in _mutations(seed=7, count=800, valid=valid)]
    assert outcomes.count("error") > 300


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=len(VALID)))
def test_arbitrary_bytes_spliced_into_a_blob(junk, at):
    _read(VALID[:at] + junk + VALID[at + len(junk):])


@pytest.mark.parametrize("data", [b"", b"\0" * 30, VALID[:32], VALID[:FB_END], b"\xff" * 64])
def test_degenerate_inputs(data):
    with pytest.raises(VkDelegateError):
        read_blob(data)
