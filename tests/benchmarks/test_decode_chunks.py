"""benchmarks/decode_chunks.py times the real decode loop: the ids its chunk read from
the history are generate's greedy ids one decode call a token, and every part it
reports is a positive time."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import decode_chunks  # noqa: E402
import llm_decode  # noqa: E402

from tests.vulkan_skip import vulkan_unavailable  # noqa: E402
from vkdelegate.llm import generate, lower  # noqa: E402

pytestmark = pytest.mark.skipif(bool(vulkan_unavailable()), reason="no Vulkan device")

TINY = ["--layers", "1", "--hidden", "64", "--ffn", "128", "--heads", "2", "--kv-heads",
        "1", "--vocab", "100", "--dtype", "float32", "--max-seq-len", "128"]


def test_a_chunk_reads_the_loops_own_ids():
    import argparse

    ap = argparse.ArgumentParser()
    llm_decode.add_model_args(ap)
    args = ap.parse_args(TINY)
    program = lower(llm_decode.build(args), args.max_seq_len)
    want = generate(program, decode_chunks.PROMPT, 6, decode_chunk=1)
    r = decode_chunks.time_chunk(program, 5, 1, args.max_seq_len)
    assert r["ids"] == want[1:]  # the prefill's id is want[0]
    assert all(r[k] > 0 for k in ("wall", "fence", "history", "generate")), r


@pytest.mark.parametrize("bad, named", [(["--chunks", "100"], "--chunks"),
                                        (["--max-seq-len", "64"], "--max-seq-len")])
def test_main_rejects_what_does_not_fit_the_cache(capsys, bad, named):
    with pytest.raises(SystemExit):
        decode_chunks.main(TINY + bad)
    assert named in capsys.readouterr().err
