"""The decode loop on the device: ``decode_next`` runs decode on the token and position
prefill/decode left in the program state, so ``generate`` runs ``decode_chunk`` steps
per submit (``LoweredProgram.run_repeated``). Its tokens must equal HF eager greedy,
the one-call-per-token loop (greedy and sampled, chunk boundaries anywhere), and stop
at an eos inside a chunk."""
import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy
from vkdelegate.errors import VkDelegateError
from vkdelegate.llm import generate


def _prompt(seed=31, n=7):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("chunk", [16, 5])
def test_greedy_loop_matches_hf(lowered, chunk):
    model, program = lowered("llama")
    prompt = _prompt()
    expected = hf_greedy(model, prompt, 23)  # 22 decode steps: chunks 16 + 6, or 5 x 4 + 2
    assert generate(program, prompt, 23, decode_chunk=chunk) == expected
    assert program.num_delegates("decode_next") == 1
    assert not program.methods["decode_next"].report.cpu_nodes
    # The loop state: the last token, its position and the history of the run.
    state = program.state_dict()
    assert state["loop.token"].tolist() == [[expected[-1]]]
    assert state["loop.pos"].tolist() == [len(prompt) + 22]
    assert state["loop.history"][len(prompt):len(prompt) + 23].tolist() == expected


def test_sampled_loop_equals_per_token_loop(lowered):
    _, program = lowered("gemma")
    prompt = _prompt(9, 5)
    settings = dict(temperature=0.9, top_k=40, top_p=0.95, seed=77)
    per_token = generate(program, prompt, 20, decode_chunk=1, **settings)
    program.reset_state()
    assert generate(program, prompt, 20, decode_chunk=7, **settings) == per_token
    assert generate(program, prompt, 20, decode_chunk=7, **dict(settings, seed=78)) \
        != per_token


def test_eos_inside_a_chunk_stops_there(lowered):
    model, program = lowered("llama")
    prompt = _prompt(4)
    full = hf_greedy(model, prompt, 20)
    eos = full[9]  # the 10th token, the middle of the first 16-step chunk
    first = full.index(eos)
    streamed = []
    got = generate(program, prompt, 20, eos_token_id=eos, on_token=streamed.append)
    assert got == full[:first + 1] == streamed
    assert generate(program, prompt, 20, eos_token_id=eos, decode_chunk=1) == got


def test_run_repeated_checks(lowered):
    _, program = lowered("llama")
    with pytest.raises(VkDelegateError, match=r"times must be an int in 1\.\.1024"):
        program.run_repeated("decode_next", 0, torch.zeros(4))
    before = program.state_dict()["loop.pos"].clone()
    with pytest.raises(VkDelegateError, match=r"times must be an int in 1\.\.1024"):
        program.run_repeated("decode_next", 10**6, torch.zeros(4), torch.zeros(81))
    assert torch.equal(program.state_dict()["loop.pos"], before)  # refused before any run
    with pytest.raises(VkDelegateError, match="no method"):
        program.run_repeated("decode_nxt", 2, torch.zeros(4))
    with pytest.raises(VkDelegateError, match="decode_chunk"):
        generate(program, [1, 2], 4, decode_chunk=0)


def test_run_repeated_equals_calls():
    """A stateful module: one submit of N runs gives the state N calls give."""
    from vkdelegate.backend.partitioner import VulkanPartitioner
    from vkdelegate.backend.to_backend import to_backend
    from tests.vulkan_skip import vulkan_unavailable

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("acc", torch.zeros(8))

        def forward(self, x):
            self.acc.mul_(0.5).add_(x)
            return self.acc * 2.0

    x = torch.arange(8, dtype=torch.float32)
    eager = Counter()
    for _ in range(6):
        want = eager(x)
    program = to_backend(torch.export.export(Counter(), (x,)), VulkanPartitioner())
    got = program.run_repeated("forward", 6, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(program.state_dict()["acc"], eager.acc)
    torch.testing.assert_close(program.run_repeated("forward", 1, x), eager(x))


def test_reference_executor_takes_the_per_token_loop():
    """Compile option executor "reference" (torch on the CPU): decode_next cannot
    repeat in one submit there, so generate takes the one-call-per-token loop with its
    default decode_chunk, and the tokens are HF's. Its program's report (several
    methods, no default one) prints every method's."""
    pytest.importorskip("transformers")
    from tests.llm.conftest import MAX_SEQ_LEN
    from tests.llm.models import make_model
    from vkdelegate.backend.program import MethodReports
    from vkdelegate.llm import lower

    model = make_model("llama")
    program = lower(model, MAX_SEQ_LEN, options={"executor": "reference"})
    prompt = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(2)).tolist()
    assert generate(program, prompt, 8) == hf_greedy(model, prompt, 8)
    report = program.report
    assert isinstance(report, MethodReports) and list(report) == program.method_names
    assert report["decode"] is program.methods["decode"].report
    assert "method 'decode':" in str(report)


def test_decode_over_a_device_limit_falls_back_to_the_per_token_loop(caplog):
    """A vocabulary whose embedding is past the device's maxStorageBufferRange (a
    Llama-3-sized vocabulary at 2048 wide on lavapipe's 128 MiB): the delegates run on
    the CPU reference executor with a warning, so decode_next's state stays on the host
    and cannot repeat in one submit. generate must take the per-token loop (it raised
    "cannot repeat on the device" after one step) and still give HF's tokens."""
    import logging

    import transformers as tf
    from tests.vulkan_skip import vulkan_unavailable
    from vkdelegate.llm import lower
    from vkdelegate.runtime.device import default_device

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    hidden = 16
    vocab = default_device().info.max_storage_buffer_range // (4 * hidden) + 1
    if vocab > 4_000_000:
        pytest.skip(f"maxStorageBufferRange {default_device().info.max_storage_buffer_range}"
                    f" needs a {vocab}-word vocabulary to exceed")
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        eos_token_id=None, bos_token_id=None, pad_token_id=None)).eval()
    model.generation_config.eos_token_id = None
    program = lower(model, 32)
    prompt = [5, 77, 1000, vocab - 1]
    with caplog.at_level(logging.WARNING, logger="vkdelegate"):
        assert generate(program, prompt, 6) == hf_greedy(model, prompt, 6)
    assert any("CPU reference executor" in r.getMessage() for r in caplog.records)
    assert "CPU reference executor" in program.runner("decode_next").repeat_blocker()
    program.close()


def test_state_rows_read_on_host_and_device(monkeypatch):
    """ProgramState.get(rows=): the host value's rows, and a device buffer's (mapped:
    just those bytes read; staged: MAPPED_STATE_BYTES 0), equal to the whole value's
    slice."""
    import numpy as np

    from vkdelegate.backend.program_state import ProgramState
    from vkdelegate.runtime import default_device, state_buffer
    from vkdelegate.runtime.state_buffer import StateBuffer

    monkeypatch.setattr(state_buffer, "MAPPED_STATE_BYTES", 0)

    history = np.arange(40, dtype=np.int32).reshape(10, 4)
    state = ProgramState({"h": history})
    np.testing.assert_array_equal(state.get("h", rows=slice(3, 5)), history[3:5])
    for staging in (False, True):
        buffer = StateBuffer(default_device(), "int32", "int32", (10, 4), staging, history)
        try:
            assert buffer.staged == staging
            state = ProgramState({"h": history})
            state.adopt("h", buffer)
            before = state.download_bytes
            np.testing.assert_array_equal(state.get("h", rows=slice(3, 5)), history[3:5])
            assert state.download_bytes - before == 2 * 4 * 4
            np.testing.assert_array_equal(state.get("h"), history)
        finally:
            buffer.close()
