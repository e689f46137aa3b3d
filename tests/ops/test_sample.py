"""vkdelegate.sample on Vulkan against its torch definition (custom_ops_llm.
sample_reference): the chosen token for many seeds, V in {50, 1000, 32000, 151936},
fp32 and fp16 logits, greedy / temperature / top-k / top-p; greedy equals torch.argmax.
Then every path of sample.glsl: the top-k list (top_k in [1, KMAX], or V <= KMAX), the
general radix searches (top_k 0 or > KMAX; top-p; temperature only), tokens tied in z
(the split by index), tokens far below the maximum (fixed-point mass 0), V below /
not a multiple of the workgroup, V = 128256 and 151936."""
import pytest
import torch
from torch import nn

from vkdelegate import to_backend
from vkdelegate.backend import custom_ops
from vkdelegate.backend.custom_ops_llm import sample_reference

from tests.ops.harness import check_op, delegated_nodes, spy_dispatches
from tests.vulkan_skip import vulkan_unavailable

custom_ops.ensure_defined()
#: How far (a fraction of the kept mass) a draw must be from a cumulative boundary for
#: the fp32 device sums to be bound to agree with the fp64 definition.
DELTA = 2e-5


OP = "vkdelegate.sample.default"


class Sampler(nn.Module):
    def forward(self, logits, sampling):
        return torch.ops.vkdelegate.sample(logits, sampling)


@pytest.fixture
def dispatched_shaders(monkeypatch):
    """The shaders each node dispatched, in order."""
    return spy_dispatches(monkeypatch)


def _settings(g):
    draw = lambda: float(torch.rand((), generator=g))  # noqa: E731
    return [(0.0, 0, 1.0, draw()), (1.0, 0, 1.0, draw()), (0.7, 40, 1.0, draw()),
            (1.3, 0, 0.9, draw()), (0.9, 50, 0.8, draw()), (1.0, 1, 1.0, draw()),
            (1.0, 0, 0.0, draw()), (2.0, 0, 1.0, 0.999999)]


def _check(program, logits, setting) -> tuple:
    """Runs ``program`` on (logits, setting); asserts its id against sample_reference:
    exact where the draw and top_p are farther than DELTA from a cumulative boundary,
    else between the picks of the perturbed settings (in sampling order). Returns the
    id and whether the exact rule applied."""
    sampling = torch.tensor(setting, dtype=torch.float32)
    want = int(sample_reference(logits, sampling))
    got = program(logits, sampling)
    assert got.dtype == torch.int64 and got.shape == (1,)
    # The draw (and top_p) moved by DELTA either way: the same token means the draw is
    # not within fp32 rounding of a boundary, so the pick must be exact.
    near = {int(sample_reference(logits, sampling + torch.tensor(d)))
            for d in ([0, 0, 0, DELTA], [0, 0, 0, -DELTA], [0, 0, DELTA, 0],
                      [0, 0, -DELTA, 0])}
    if near == {want}:
        assert int(got) == want, (setting, int(got), want)
        return int(got), True
    # Within rounding: between the perturbed picks, in sampling order.
    vocab = logits.numel()
    z = logits.float().reshape(-1) / setting[0]
    rank = torch.empty(vocab, dtype=torch.int64)
    rank[torch.sort(z, descending=True, stable=True).indices] = torch.arange(vocab)
    ranks = [int(rank[t]) for t in near | {want}]
    assert min(ranks) <= int(rank[int(got)]) <= max(ranks), (setting, int(got), want, near)
    return int(got), False


def test_reference_definition_by_hand():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 2.0]])
    s = lambda *a: int(sample_reference(logits, torch.tensor(a)))  # noqa: E731
    assert s(0.0, 0, 1, 0.9) == 1            # greedy: first maximum
    assert s(1.0, 2, 1, 0.0) == 1 and s(1.0, 2, 1, 0.99) == 2  # top-2: the tied pair
    w = torch.softmax(logits[0], 0)          # order 1, 2, 4, 0, 3
    cut = float((w[1] + w[2] + w[4]) / w.sum())
    assert s(1.0, 0, cut - 1e-3, 0.999) == 4  # top-p keeps three tokens
    assert s(1.0, 0, 1, float((w[1] + w[2]) / w.sum()) + 1e-4) == 4


@pytest.mark.parametrize("vocab", [50, 1000, 32000, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sampler_matches_the_definition(vocab, dtype):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    g = torch.Generator().manual_seed(vocab)
    seeds = 10 if vocab < 100000 else 3
    logits = (torch.randn(1, vocab, generator=g) * 3).to(dtype)
    program = check_op(Sampler(), (logits, torch.tensor([1.0, 0, 1, 0.5])),
                       ops=["vkdelegate.sample.default"])
    chosen, exact = set(), 0
    for _ in range(seeds):
        logits = (torch.randn(1, vocab, generator=g) * 3).to(dtype)
        logits[0, int(torch.randint(vocab, (), generator=g))] = logits.max()  # a tie
        for setting in _settings(g):
            got, ok = _check(program, logits, setting)
            exact += ok
            chosen.add(got)
            if setting[0] == 0.0:
                assert got == int(torch.argmax(logits.float()))
    assert len(chosen) > seeds  # the draws really pick different tokens
    assert exact >= 0.75 * seeds * len(_settings(g))  # most draws are far from one


def test_argmax_runs_on_vulkan():
    check_op(lambda x: torch.argmax(x, dim=-1), (torch.randn(1, 3000),),
             ops=["aten.argmax.default"])


#: (temperature, top_k, top_p): the top-k list below, at and above KMAX (1024), the
#: general path with top-p alone and temperature alone, top-p <= 0.
_PATHS = [(0.8, 5, 1.0), (0.8, 50, 0.9), (1.1, 1024, 0.95), (0.8, 1025, 0.9),
          (1.3, 2000, 1.0), (0.8, 0, 0.9), (1.0, 0, 0.5), (0.7, 0, 1.0), (1.0, 0, -1.0),
          (0.9, 3, 0.0)]


def _logits(kind: str, vocab: int, g) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(1, vocab, generator=g) * 3
    if kind == "ties":  # 40 distinct values: the thresholds fall inside tied runs
        return torch.randint(-20, 20, (1, vocab), generator=g).float() / 2
    if kind == "far":  # a few near the top, the rest 1e4 below (mass 0 in fixed point)
        x = torch.randn(1, vocab, generator=g) - 1e4
        near = torch.randperm(vocab, generator=g)[:min(vocab, 700)]
        x[0, near] = torch.randn(near.numel(), generator=g) * 2
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("vocab,kind,dtype", [
    (300, "normal", torch.float32), (1000, "ties", torch.float16),
    (5003, "normal", torch.float16), (5003, "ties", torch.float32),
    (40000, "far", torch.float32), (128256, "normal", torch.float32),
    (128256, "ties", torch.float16), (151936, "normal", torch.float16),
    (151936, "far", torch.float16)])
def test_sampler_paths(vocab, kind, dtype):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    g = torch.Generator().manual_seed(vocab + len(kind))
    logits = _logits(kind, vocab, g).to(dtype)
    program = check_op(Sampler(), (logits, torch.tensor([1.0, 0, 1, 0.5])),
                       ops=["vkdelegate.sample.default"])
    exact = 0
    for t, k, p in _PATHS:
        for draw in (float(torch.rand((), generator=g)), 0.0, 0.999):
            exact += _check(program, logits, (t, k, p, draw))[1]
    assert exact >= 0.75 * 3 * len(_PATHS)


def test_non_finite_logits_end_with_an_id_in_range():
    # Outside the definition (NaN / inf logits, NaN settings): no output is promised,
    # but every search must end (a GPU loop that does not is a lost device) and the
    # id must index the vocabulary. The -inf cases are inside it: checked exactly.
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    vocab = 5003
    g = torch.Generator().manual_seed(9)
    program = check_op(Sampler(), (torch.randn(1, vocab, generator=g),
                                   torch.tensor([1.0, 0, 1, 0.5])),
                       ops=["vkdelegate.sample.default"])
    cases = {}
    x = torch.randn(1, vocab, generator=g)
    x[0, 7] = float("nan")
    cases["one nan"] = x
    cases["all nan"] = torch.full((1, vocab), float("nan"))
    x = torch.randn(1, vocab, generator=g)
    x[0, 3] = float("inf")
    cases["+inf"] = x
    cases["all -inf"] = torch.full((1, vocab), float("-inf"))
    cases["huge"] = torch.randn(1, vocab, generator=g) * 1e30
    settings = [(0.8, 50, 0.9, 0.5), (0.8, 0, 0.9, 0.5), (0.8, 0, 1.0, 0.999),
                (0.8, 2000, 0.5, 0.1), (float("nan"), 5, 0.9, 0.5),
                (0.8, float("nan"), float("nan"), float("nan"))]
    for name, logits in cases.items():
        for setting in settings:
            got = int(program(logits, torch.tensor(setting)))
            assert 0 <= got < vocab, (name, setting, got)
    x = torch.randn(1, vocab, generator=g)
    x[0, :100] = float("-inf")  # masked tokens: never drawn
    for setting in settings[:4]:
        _check(program, x, setting)


@pytest.mark.parametrize("temperature", [0.0, 0.5], ids=["greedy", "t0.5"])
def test_first_pass_keeps_the_first_maximum_across_workgroups(dispatched_shaders,
                                                              temperature):
    """V > SPAN: sample_max.glsl's workgroups each keep their slice's maximum key and
    sample.glsl's PARTIALS form the largest of those; with the maximum tied in several
    slices (the first and last logits among them) the id is the lowest index, as
    torch.argmax (top_k 1 with a temperature: the same token)."""
    from vkdelegate.ops.families import sample as family

    vocab = 3 * family.SPAN + 5
    g = torch.Generator().manual_seed(7)
    program = check_op(Sampler(), (torch.randn(1, vocab, generator=g),
                                   torch.tensor([temperature, 1.0, 1.0, 0.5])),
                       ops=[OP])
    assert dispatched_shaders[:2] == [family.MAX_SHADER, family.SHADER], dispatched_shaders
    for ties in ([vocab - 1, 5, 2 * family.SPAN + 3], [family.SPAN, 0, vocab - 1],
                 [2 * family.SPAN - 1, 2 * family.SPAN]):
        x = torch.randn(1, vocab, generator=g)
        x[0, ties] = x.max() + 1.0
        got = int(program(x, torch.tensor([temperature, 1.0, 1.0, 0.5]))[0])
        assert got == min(ties), (ties, got)


def test_small_vocabulary_is_one_dispatch(dispatched_shaders):
    """V <= SPAN: no first pass, sample.glsl reads every logit."""
    from vkdelegate.ops.families import sample as family

    g = torch.Generator().manual_seed(3)
    check_op(Sampler(), (torch.randn(1, family.SPAN, generator=g),
                         torch.tensor([0.0, 0.0, 1.0, 0.5])), ops=[OP])
    assert dispatched_shaders == [family.SHADER], dispatched_shaders


@pytest.mark.parametrize("vocab,kind,dtype", [
    (1000, "ties", torch.float16), (5003, "normal", torch.float32),
    (128256, "ties", torch.float16)])
def test_sampler_paths_in_the_gpus_workgroup(monkeypatch, vocab, kind, dtype):
    """CPU drivers take CPU_WORKGROUP invocations, GPUs the device's largest power of
    two up to 1024: the paths in 1024 invocations here too (the shader's own limits),
    as test_sampler_paths checks them."""
    from vkdelegate.ops.families import sample as family

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    monkeypatch.setattr(family, "CPU_WORKGROUP", family.MAX_WORKGROUP)
    seen = spy_dispatches(monkeypatch, lambda shader, defines, sizes: (shader, sizes[1]),
                          sizes=True)
    g = torch.Generator().manual_seed(vocab + len(kind) + 1)
    logits = _logits(kind, vocab, g).to(dtype)
    program = check_op(Sampler(), (logits, torch.tensor([1.0, 0, 1, 0.5])),
                       ops=["vkdelegate.sample.default"])
    local = [size for shader, size in seen if shader == family.SHADER]
    assert local and all(size[0] == 1024 for size in local), seen
    exact = 0
    for t, k, p in _PATHS:
        for draw in (float(torch.rand((), generator=g)), 0.999):
            exact += _check(program, logits, (t, k, p, draw))[1]
    assert exact >= 0.75 * 2 * len(_PATHS)


class _Info:
    """What sample.workgroup_size reads of a DeviceInfo."""

    def __init__(self, type_: str, invocations: int = 1024):
        self.type = type_
        self.max_workgroup_size = (invocations, invocations, 64)
        self.max_workgroup_invocations = invocations


def test_workgroup_size_per_device_type():
    """GPUs: the largest power of two the device allows, up to 1024; CPU drivers:
    CPU_WORKGROUP, doubled only where a vocabulary's loops would pass llvmpipe's
    budget (whose check then passes)."""
    from vkdelegate.kernels import loop_limit
    from vkdelegate.ops.families import sample as family

    assert family.workgroup_size(_Info("discrete"), 1000) == 1024
    assert family.workgroup_size(_Info("integrated", 768), 1000) == 512
    assert family.workgroup_size(_Info("cpu"), 1000) == family.CPU_WORKGROUP
    assert family.workgroup_size(_Info("cpu"), 262144) == family.CPU_WORKGROUP
    huge = family.workgroup_size(_Info("cpu"), family.MAX_VOCAB - 1)
    assert family.CPU_WORKGROUP < huge <= 1024
    assert not loop_limit.over_budget(family.loop_iterations(family.MAX_VOCAB - 1, huge))
    assert loop_limit.over_budget(family.loop_iterations(family.MAX_VOCAB - 1, huge // 2))
