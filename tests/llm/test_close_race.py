"""``program.close()`` from another thread while an LLM program generates: the close
waits for the call in flight and a call waits for a close in progress
(ProgramState.calling / closing), so every generate gives HF's tokens. Before, the
close freed the shared KV-cache buffers while a call was binding or running on them:
a segfault in vkFreeMemory one run in four, and "input 3 has dtype object" on nearly
every generate (a new-user trial's finding)."""
import threading
import time

import pytest

from tests.llm.models import hf_greedy, make_model
from tests.vulkan_skip import vulkan_unavailable


@pytest.mark.parametrize("chunk", [1, 16], ids=["per_token", "decode_next"])
def test_generate_while_another_thread_closes(chunk):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("transformers")
    from vkdelegate.llm import generate, lower

    model = make_model("llama")
    prompt = [1, 5, 9, 42, 7]
    want = hf_greedy(model, prompt, 12)
    program = lower(model, 64)
    stop = threading.Event()
    closes = []

    def closer():
        while not stop.is_set():
            time.sleep(0.002)
            program.close()
            closes.append(1)

    thread = threading.Thread(target=closer)
    thread.start()
    got = []
    try:  # until the closes have interleaved with the calls (each forces a rebuild)
        while len(got) < 6 or (len(closes) < 8 and len(got) < 40):
            got.append(generate(program, prompt, 12, decode_chunk=chunk))
    finally:
        stop.set()
        thread.join()
    assert len(closes) >= 8
    assert got == [want] * len(got)
    program.close()
    assert generate(program, prompt, 12) == want  # built again after the last close
    program.close()
