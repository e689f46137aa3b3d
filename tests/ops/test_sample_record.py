"""vkdelegate.sample_record on Vulkan: the decode loop's sampling step
(custom_ops_llm.sample_record_reference) against eager, float32 and float16 logits,
int64 and int32 positions, with and without decode_next's table of draws; the id
bitwise vkdelegate.sample's on the vector with the same draw; the loop's state kept
on the device and its history written in place by the sampler's one dispatch;
positions outside the history or the draws raise; crafted blobs are refused at load.
"""
import numpy as np
import pytest
import torch
from torch import nn

from tests.ops.harness import FnModule, check_op, delegated_nodes
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.backend.custom_ops_llm import sample_record_reference, sample_reference
from vkdelegate.errors import VkDelegateError

custom_ops.ensure_defined()
OP = "vkdelegate.sample_record.default"
ROWS = 12  # the history's rows (max_seq_len + 1 in a decoder)


def _record(logits, sampling, draws, pos, token, token_pos, history):
    return torch.ops.vkdelegate.sample_record(logits, sampling, draws, pos, token,
                                              token_pos, history)


def _no_draws(logits, sampling, pos, token, token_pos, history):
    return _record(logits, sampling, None, pos, token, token_pos, history)


def _state(g):
    return (torch.randint(0, 100, (1, 1), generator=g), torch.tensor([3]),
            torch.randint(0, 100, (ROWS,), generator=g))


def test_reference_definition_by_hand():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 2.0]])
    token, token_pos, history = torch.tensor([[9]]), torch.tensor([2]), torch.arange(6)
    greedy = torch.tensor([0.0, 0, 1, 0.9])
    out = sample_record_reference(logits, greedy, None, torch.tensor([3]), token,
                                  token_pos, history)
    assert [o.tolist() for o in out] == [[1], [[1]], [4], [0, 1, 2, 3, 1, 5]]
    # The draw from the table at pos (top-2: the tied pair; a draw past half takes 2).
    draws = torch.tensor([0.0, 0.0, 0.99, 0.0])
    top2 = torch.tensor([1.0, 2, 1, 0.0])
    got = sample_record_reference(logits, top2, draws, torch.tensor([2]), token,
                                  token_pos, history)
    assert int(got[0]) == int(sample_reference(logits, torch.tensor([1.0, 2, 1, 0.99]))) \
        == 2
    assert got[2].tolist() == [3] and got[3].tolist() == [0, 1, 2, 2, 4, 5]
    with pytest.raises(IndexError):  # pos + 1 outside the history
        sample_record_reference(logits, greedy, None, torch.tensor([5]), token,
                                token_pos, history)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("with_draws", [False, True])
def test_against_eager(dtype, pos_dtype, with_draws):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(1, 1000, generator=g) * 3).to(dtype)
    sampling = torch.tensor([0.9, 40, 0.9, 0.3])
    pos = torch.tensor([7], dtype=pos_dtype)
    if with_draws:
        draws = torch.rand(ROWS, generator=g)
        check_op(_record, (logits, sampling, draws, pos) + _state(g), ops=[OP])
    else:
        check_op(_no_draws, (logits, sampling, pos) + _state(g), ops=[OP])


def _lowered(fn, inputs):
    program = to_backend(torch.export.export(FnModule(fn), inputs), VulkanPartitioner())
    return program



@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_id_is_bitwise_the_samplers(dtype):
    """With a table of draws, the id is vkdelegate.sample's on (temperature, top_k,
    top_p, draws[pos]), device against device, for every path of the sampler; the
    state outputs are the id, pos + 1 and the history with the id at pos + 1."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(1, 5003, generator=g) * 3).to(dtype)
    draws = torch.rand(ROWS, generator=g)
    token, token_pos, history = _state(g)
    sampling = torch.tensor([1.0, 0, 1, 0.5])
    fused = _lowered(_record, (logits, sampling, draws, torch.tensor([0]), token, token_pos,
                           history))
    assert [op for op, _ in delegated_nodes(fused)] == [OP]
    alone = _lowered(lambda x, s: torch.ops.vkdelegate.sample(x, s), (logits, sampling))
    picks = set()
    for t, k, p in [(0.0, 0, 1.0), (0.8, 50, 0.9), (1.3, 0, 1.0), (1.0, 0, 0.7),
                    (0.9, 2000, 0.95), (1.0, 3, 0.0)]:
        for pos in (0, 4, ROWS - 2):
            settings = torch.tensor([t, k, p, 0.77])  # its draw is not the one used
            got = fused(logits, settings, draws, torch.tensor([pos]), token, token_pos,
                        history)
            want = alone(logits, torch.tensor([t, k, p, float(draws[pos])]))
            assert torch.equal(got[0], want), (t, k, p, pos)
            assert got[1].tolist() == [[int(want)]] and got[2].tolist() == [pos + 1]
            expected = history.clone()
            expected[pos + 1] = want
            assert torch.equal(got[3], expected)
            picks.add(int(want))
    assert len(picks) > 3


class Loop(nn.Module):
    """The decode loop's state (vkdelegate.llm.decoder.DecodeLoopState) recording a
    sampled token per call, as decode (pos an input) or decode_next (pos the state,
    with a table of draws) does."""

    def __init__(self, from_state: bool):
        super().__init__()
        from vkdelegate.llm.decoder import DecodeLoopState

        self.loop = DecodeLoopState(ROWS - 1)
        self.from_state = from_state

    def forward(self, logits, sampling, draws, pos):
        if self.from_state:
            return self.loop.sample(logits, sampling, self.loop.pos.clone(), draws)
        return self.loop.sample(logits, sampling, pos)


@pytest.mark.parametrize("from_state", [False, True])
def test_loop_state_stays_on_the_device(from_state):
    """The loop's token, pos and history are program state kept on the device (no
    state bytes cross after the first call); the history is written in place (the
    op's only dispatch is the sampler's: the copy of the history is dropped); after
    each call the state equals eager's buffers (read back with state_dict, which is not
    counted as a call's transfer)."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    g = torch.Generator().manual_seed(8)
    eager = Loop(from_state).eval()
    logits = torch.randn(1, 300, generator=g)
    draws = torch.rand(ROWS, generator=g)
    sampling = torch.tensor([0.8, 20, 0.9, 0.4])
    program = to_backend(torch.export.export(Loop(from_state).eval(),
                                             (logits, sampling, draws, torch.tensor([0]))),
                         VulkanPartitioner())
    assert OP in [op for op, _ in delegated_nodes(program)]
    program.set_profiling(True)
    for step in range(ROWS - 1):
        logits = torch.randn(1, 300, generator=g)
        pos = torch.tensor([step])
        got = program(logits, sampling, draws, pos)
        want = eager(logits, sampling, draws, pos)
        assert torch.equal(got, want), step
        state = program.state_dict()
        for name, buf in eager.named_buffers():
            assert torch.equal(state[name], buf), (step, name)
        moved = program.last_transfer()
        if step:  # the first call uploads the initial state once
            assert moved["state_upload_bytes"] == moved["state_download_bytes"] == 0, moved
        shaders = [d.shader for _, prof in program.last_profiles() for d in prof.dispatches
                   if d.op == OP]
        assert shaders == ["sample"], shaders
    assert eager.loop.pos.tolist() == [ROWS - 1]


@pytest.mark.parametrize("pos, with_draws", [(ROWS - 1, False), (-2, False),
                                             (ROWS - 1, True), (ROWS, True), (-1, True)])
def test_out_of_range_position_raises(pos, with_draws):
    """pos + 1 outside the history (or pos outside the draws) raises, as eager's
    index_copy / index_select do."""
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    g = torch.Generator().manual_seed(1)
    logits, sampling = torch.randn(1, 50, generator=g), torch.tensor([0.0, 0, 1, 0.5])
    draws = torch.rand(ROWS - 1 if with_draws else ROWS, generator=g)
    args = (logits, sampling, draws, torch.tensor([0])) + _state(g)
    program = to_backend(torch.export.export(FnModule(_record), args), VulkanPartitioner())
    program(*args)  # in range
    bad = args[:3] + (torch.tensor([pos]),) + args[4:]
    with pytest.raises(IndexError):
        _record(*bad)
    with pytest.raises(VkDelegateError, match=r"node \d+ \(vkdelegate.sample_record.default\)"
                                              r": position out of range"):
        program(*bad)


# ---- load-time checks of crafted blobs ------------------------------------------------
def _blob(logits=(1, 50), draws=(ROWS,), pos=(1,), token=(1, 1), history=(ROWS,),
          outs=None, pos_dtype="int64"):
    """A blob of one sample_record node with inputs of these sizes (draws None: no
    table) and outputs declared ``outs`` (default: what the op gives)."""
    from tests.runtime.graphs import GraphMaker
    from vkdelegate.serialization import vkgraph as g

    m = GraphMaker()
    args = [m.input(logits), m.input((4,))]
    args.append(m.scalar(None) if draws is None else m.input(draws))
    args += [m.input(pos, pos_dtype), m.input(token, "int64"), m.input((1,), "int64"),
             m.input(history, "int64")]
    outs = outs or [(1,), token, (1,), history]
    ids = [m.tensor(shape, "int64") for shape in outs]
    out = m._add(g.ValueList(ids))
    m.graph.chain.append(g.OperatorCall(0, OP, args + [out]))
    for i in ids:
        m.output(i)
    return m


def test_matching_blob_runs(vk_device):
    from vkdelegate.runtime import load_delegate

    m = _blob()
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, 50)).astype(np.float32)
    inputs = [logits, np.array([0.0, 0, 1, 0], np.float32), np.zeros(ROWS, np.float32),
              np.array([4]), np.array([[7]]), np.array([4]), np.arange(ROWS)]
    with load_delegate(m.blob()) as graph:
        out = graph.execute(inputs)
    best = int(np.argmax(logits))
    assert [o.tolist() for o in out] == [[best], [[best]], [5],
                                         [0, 1, 2, 3, 4, best] + list(range(6, ROWS))]


@pytest.mark.parametrize("kwargs,match", [
    (dict(logits=(2, 50)), r"logits of sizes \[2, 50\]"),
    (dict(draws=(2, 6)), r"draws of sizes \[2, 6\]"),
    (dict(pos=(2,)), r"pos of sizes \[2\]"),
    (dict(token=(1, 2)), r"token of sizes \[1, 2\]"),
    (dict(history=(3, 4)), r"history of sizes \[3, 4\]"),
    (dict(outs=[(1,), (1, 1), (1,), (ROWS + 1,)]), r"output"),
    (dict(outs=[(2,), (1, 1), (1,), (ROWS,)]), r"output"),
    (dict(pos_dtype="float32"), r"argument 3 has dtype float32"),
])
def test_crafted_blob_is_refused_at_load(vk_device, kwargs, match):
    """A blob whose sample_record the kernel could not run as the op defines it is
    refused before anything is built, by the Vulkan loader and the reference executor
    alike."""
    from vkdelegate.backend.reference import load_reference
    from vkdelegate.runtime import load_delegate

    blob = _blob(**kwargs).blob()
    for load in (load_delegate, load_reference):
        with pytest.raises(VkDelegateError, match=r"node 0 \(vkdelegate.sample_record."
                                                  r"default\): .*" + match):
            load(blob)
