"""runtime/prefetch.py: the L2 prefetch dispatches' plan (which constants, at the end
of which stage, within the budget) and a graph with them forced on lavapipe (which
takes none by default): the same outputs bit for bit, the same pipeline barriers, each
prefetch reading one constant and adding no hazard."""
from types import SimpleNamespace

import numpy as np
import pytest

from tests.runtime.graphs import GraphMaker, rand
from tests.runtime.test_graph import _check, _mixed_graph
from vkdelegate.runtime import prefetch

MB = 1 << 20


def _buf(name, mb):
    return SimpleNamespace(name=name, size=int(mb * MB), region=name)


def _stage_dispatches(spec):
    """One dispatch per stage, each reading the previous stage's output region (a
    barrier before every stage but the first) and the given constants."""
    out = []
    for k, consts in enumerate(spec):
        reads = {f"t{k - 1}"} if k else set()
        out.append(SimpleNamespace(reads=reads | {b.region for b in consts},
                                   writes={f"t{k}"}, constants=tuple(consts)))
    return out


def test_plan_keeps_the_window_within_the_budget():
    """A decode layer's shape in int4 MB: q/k/v 3.3, attention (none), o_proj 2.2,
    gate/up 17.8, down 8.9, then the next layer's q/k/v; the running stage's own
    constants count against the budget."""
    qkv, o, gu, down, qkv2 = (_buf("qkv", 3.3), _buf("o", 2.2), _buf("gu", 17.8),
                              _buf("down", 8.9), _buf("qkv2", 3.3))
    d = _stage_dispatches([[qkv], [], [o], [gu], [down], [qkv2]])

    def names(budget_mb):
        return {at: [b.name for b in bufs]
                for at, bufs in prefetch.plan(d, budget_mb * MB).items()}
    # 24 MB. End of q/k/v (index 1): o and gate/up (3.3 + 20 = 23.3; down would make
    # 32.2); down never fits beside gate/up (26.7); end of down (index 5): the next
    # q/k/v (12.2); the last stage: the first stage's q/k/v, for the next run.
    assert names(24) == {1: ["o", "gu"], 5: ["qkv2"], 6: ["qkv"]}
    # 32 MB: down at the end of the attention (2.2 + 17.8 + 8.9 = 28.9), the next
    # q/k/v at the end of gate/up (17.8 + 8.9 + 3.3 = 30; beside o_proj: 32.2).
    assert names(32) == {1: ["o", "gu"], 2: ["down"], 4: ["qkv2"], 6: ["qkv"]}


def test_plan_skips_what_exceeds_the_budget():
    """A stage larger than the budget is never prefetched, nor anything while it runs,
    and the window moves past it once it has run; a budget of 0 plans nothing."""
    a, big, c, e = _buf("a", 1), _buf("big", 40), _buf("c", 2), _buf("e", 3)
    d = _stage_dispatches([[a], [big], [c], [e]])
    names = {at: [b.name for b in bufs] for at, bufs in prefetch.plan(d, 24 * MB).items()}
    assert names == {3: ["e"], 4: ["a"]}
    assert prefetch.plan(d, 0) == {}


def test_plan_leaves_small_constants(monkeypatch):
    """Constants under MIN_BYTES (a norm weight) are not prefetched."""
    monkeypatch.setattr(prefetch, "MIN_BYTES", 1 << 20)
    w, norm = _buf("w", 2), _buf("norm", 0.01)
    d = _stage_dispatches([[], [w, norm]])
    names = {at: [b.name for b in bufs] for at, bufs in prefetch.plan(d, 24 * MB).items()}
    assert names == {1: ["w"]}


def test_one_stage_reads_each_buffer_once():
    """Two dispatches of one stage reading one constant: prefetched once."""
    w = _buf("w", 1)
    first = SimpleNamespace(reads={"x"}, writes={"t0"}, constants=())
    a = SimpleNamespace(reads={"t0", "w"}, writes={"t1"}, constants=(w,))
    b = SimpleNamespace(reads={"t0", "w"}, writes={"t2"}, constants=(w,))
    names = {at: [b.name for b in bufs]
             for at, bufs in prefetch.plan([first, a, b], 24 * MB).items()}
    assert names == {1: ["w"]}


@pytest.fixture
def forced(monkeypatch):
    """Prefetches on this device too (lavapipe takes none by default), 1 MB ahead,
    of every constant (these graphs' are small)."""
    monkeypatch.setattr(prefetch, "applies", lambda info: True)
    monkeypatch.setattr(prefetch, "PREFETCH_MB", 1)
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)


def _run(vk_device, rows=5):
    m = GraphMaker()
    w, bias = _mixed_graph(m, rows)
    rng = np.random.default_rng(3)
    x, y = rand(rng, (rows, 29)), rand(rng, (rows, 1))
    with m.build(vk_device) as graph:
        outs = graph.execute([x, y])
        return outs, graph.barriers, [(d.op, d.reads, d.writes, d.buffers[1:])
                                      for d in graph.dispatches], (x, y, w, bias)


def test_graph_with_prefetches(vk_device, forced, monkeypatch):
    """The mixed graph (mm with a constant weight, add with a constant bias, relu, sum
    and sub): one prefetch of the bias after the mm's stage and one of the weight at
    the end (for the next run); outputs equal the reference and, bit for bit, the
    graph without prefetches; the barriers are the same."""
    outs, barriers, dispatches, args = _run(vk_device)
    _check(outs, *args)
    pre = [(i, d) for i, d in enumerate(dispatches) if d[0] == prefetch.SHADER]
    assert [i for i, _ in pre] == [1, len(dispatches) - 1], dispatches
    for _, (_, reads, writes, buffers) in pre:
        assert writes == set() and len(reads) == 1 and buffers[0].region in reads
    # The bias is the add's constant, the weight the mm's.
    assert pre[0][1][3][0] in dispatches[2][3] and pre[1][1][3][0] in dispatches[0][3]
    monkeypatch.setattr(prefetch, "PREFETCH_MB", 0)
    plain, plain_barriers, plain_dispatches, _ = _run(vk_device)
    assert barriers == plain_barriers and len(plain_dispatches) == len(dispatches) - 2
    for got, want in zip(outs, plain):
        assert np.array_equal(got, want)


def test_repeated_runs_with_prefetches(vk_device, forced):
    """execute(repeat=3) with the prefetches (the last stage's reads the first stage's
    weight for the next run): every run's outputs as the reference."""
    m = GraphMaker()
    w, bias = _mixed_graph(m, 4)
    rng = np.random.default_rng(4)
    x, y = rand(rng, (4, 29)), rand(rng, (4, 1))
    with m.build(vk_device) as graph:
        assert any(d.op == prefetch.SHADER for d in graph.dispatches)
        _check(graph.execute([x, y], repeat=3), x, y, w, bias)


def test_llm_decode_with_prefetches(forced):
    """A tiny Llama lowered with the prefetches forced: its decode loop (16 steps a
    submit, the last stage prefetching the first's weights for the next step) gives
    HF eager's greedy tokens, and so does a profiled one-token-a-call loop, whose
    decode graph holds prefetch dispatches."""
    from tests.llm.conftest import MAX_SEQ_LEN
    from tests.llm.models import hf_greedy, make_model
    from tests.vulkan_skip import vulkan_unavailable

    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("transformers")
    from vkdelegate.llm import generate, lower

    model = make_model("llama")
    program = lower(model, MAX_SEQ_LEN)
    try:
        prompt = [5, 17, 3, 99, 42, 7]
        want = hf_greedy(model, prompt, 20)
        assert generate(program, prompt, 20) == want
        program.reset_state()
        program.set_profiling(True)  # a barrier between all dispatches: the same tokens
        assert generate(program, prompt, 20, decode_chunk=1) == want
        ops = [d.op for method in ("decode", "decode_next")
               for _, prof in program.last_profiles(method) for d in prof.dispatches]
        assert prefetch.SHADER in ops, ops
    finally:
        program.close()
