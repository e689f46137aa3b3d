"""Attention over a KV cache and block-sparse early exit (issue 14) on Vulkan, against
eager F.scaled_dot_product_attention with the masks the ops imply built independently:
llama.custom_sdpa (start_pos, causal, 2-D masks, GQA 1..8, head dims 32..256),
llama.sdpa_with_kv_cache (the caches written in place), vkdelegate.sliding_window_sdpa,
the plain-ATen static-cache form (a mask from a start_pos tensor, wholly on Vulkan),
split-K decode, and outputs bit-identical with the early exit switched off."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.et_graphs import run_et_node
from tests.ops.harness import check_op
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend
from vkdelegate.kernels import attention

CUSTOM = "llama.custom_sdpa.default"
SLIDING = "vkdelegate.sliding_window_sdpa.default"
SDPA = "aten.scaled_dot_product_attention.default"
# As tests/ops/test_sdpa.py: fp32 accumulation-order differences; fp16 output rounding
# plus eager's fp16 intermediates.
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
FP16_TOL = dict(rtol=4e-3, atol=4e-3)
OFF = {"sdpa_skip_masked_tiles": False}
ensure_defined()


def _cache_qkv(b, lq, hq, s, hk, e, dtype=torch.float32, seed=0):
    """q [B, L, Hq, E], k/v caches [B, S, Hk, E] (ExecuTorch's layout)."""
    torch.manual_seed(seed)
    return (torch.randn(b, lq, hq, e).to(dtype), torch.randn(b, s, hk, e).to(dtype),
            torch.randn(b, s, hk, e).to(dtype))


def _eager_cache_attention(q, k, v, start_pos, keys, causal, mask=None, window=0):
    """ExecuTorch's semantics spelt with eager SDPA: keys 0..keys-1 of the cache, query
    row i at start_pos + i; returns [B, L, Hq, E]."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k[:, :keys], v[:, :keys]))
    i = torch.arange(q.shape[1])[:, None] + start_pos
    j = torch.arange(keys)[None, :]
    allowed = torch.ones(q.shape[1], keys, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window:
        allowed &= j > i - window
    attn = allowed if mask is None else mask[:, :keys]
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn, enable_gqa=True)
    return out.transpose(1, 2)


def _sdpa(**kw):
    """F.scaled_dot_product_attention(q, k, v[, mask], **kw) as a function."""
    def fn(q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **kw)
    return fn


def _sliding(window, start_pos):
    def fn(q, k, v, *mask):
        return torch.ops.vkdelegate.sliding_window_sdpa(q, k, v, window, start_pos, *mask)
    return fn


def _custom(start_pos, causal=True):
    return lambda q, k, v: torch.ops.llama.custom_sdpa(q, k, v, start_pos, None, 0.0,
                                                       causal, None)


@pytest.mark.parametrize("start_pos,lq", [(0, 1), (0, 7), (5, 1), (37, 1), (20, 13),
                                          (90, 40)])
@pytest.mark.parametrize("causal", [True, False])
def test_custom_sdpa_start_pos(start_pos, lq, causal):
    q, k, v = _cache_qkv(1, lq, 4, 160, 2, 32)
    want = _eager_cache_attention(q, k, v, start_pos, start_pos + lq, causal)
    got = check_op(_custom(start_pos, causal), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v), want, **FP32_TOL)


def test_custom_sdpa_decode_over_a_4096_row_cache():
    # One query at position 4000 (split-K; the rows past 4000 are never read).
    q, k, v = _cache_qkv(1, 1, 8, 4096, 2, 64)
    k[:, 4001:] = float("nan")  # cache rows not in use: must not reach the output
    got = check_op(_custom(4000), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v),
                               _eager_cache_attention(q, k, v, 4000, 4001, True), **FP32_TOL)


@pytest.mark.parametrize("hk", [8, 4, 2, 1])
def test_custom_sdpa_gqa_ratios(hk):
    q, k, v = _cache_qkv(2, 9, 8, 64, hk, 32)
    got = check_op(_custom(11), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v), _eager_cache_attention(q, k, v, 11, 20, True),
                               **FP32_TOL)


@pytest.mark.parametrize("e", [32, 64, 128, 256])
def test_custom_sdpa_head_dims(e):
    q, k, v = _cache_qkv(1, 5, 2, 48, 1, e)
    got = check_op(_custom(30), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v), _eager_cache_attention(q, k, v, 30, 35, True),
                               **FP32_TOL)


@pytest.mark.parametrize("e", [128, 256])
def test_fp16_large_head_dims_half_query(e):
    # Q_HALF (float16 q as packed fp16 pairs, scaled after the dot) from head dim 128.
    assert attention.defines(*[("float16", "float16")] * 4, None, causal=True, window=False,
                             d_max=e, cpu=False, skip=True).get("Q_HALF") == "1"
    torch.manual_seed(12)
    q, k, v = (torch.randn(1, h, n, e).half() for h, n in ((4, 40), (2, 70), (2, 70)))
    check_op(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                            enable_gqa=True, scale=0.3),
             (q, k, v), ops=[SDPA], **FP16_TOL)
    qc, kc, vc = (t.transpose(1, 2) for t in (q[:, :, :5], k, v))
    got = check_op(_custom(60), (qc, kc, vc), ops=[CUSTOM], **FP16_TOL)(qc, kc, vc)
    torch.testing.assert_close(got.float(), _eager_cache_attention(
        qc.float(), kc.float(), vc.float(), 60, 65, True), **FP16_TOL)


def test_custom_sdpa_fp16_and_float_mask_with_fully_masked_row():
    q, k, v = _cache_qkv(1, 6, 4, 70, 2, 64, dtype=torch.float16)
    got = check_op(_custom(50), (q, k, v), ops=[CUSTOM], **FP16_TOL)
    torch.testing.assert_close(got(q, k, v).float(),
                               _eager_cache_attention(q.float(), k.float(), v.float(), 50,
                                                      56, True), **FP16_TOL)
    # A 2-D additive mask over the whole cache; row 2 fully masked: NaN (the op's
    # reference softmax), which check_op compares as equal.
    mask = torch.randn(6, 70)
    mask[2] = float("-inf")
    fn = lambda q, k, v, m: torch.ops.llama.custom_sdpa(q, k, v, 50, m)  # noqa: E731
    q32, k32, v32 = q.float(), k.float(), v.float()
    out = check_op(fn, (q32, k32, v32, mask), ops=[CUSTOM], **FP32_TOL)(q32, k32, v32, mask)
    assert torch.isnan(out[:, 2]).all() and not torch.isnan(out[:, [0, 1, 3, 4, 5]]).any()
    want = _eager_cache_attention(q32, k32, v32, 0, 70, False, mask=mask)
    torch.testing.assert_close(out[:, [0, 1, 3, 4, 5]], want[:, [0, 1, 3, 4, 5]], **FP32_TOL)


def test_custom_sdpa_symbolic_start_pos_resizes():
    # start_pos from a size (the past length): re-read after every resize.
    def fn(q, k, v, past):
        return torch.ops.llama.custom_sdpa(q, k, v, past.shape[0], None, 0.0, True, None)

    q, k, v = _cache_qkv(1, 3, 4, 96, 2, 32)
    past = Dim("past", min=1, max=90)
    got = check_op(fn, (q, k, v, torch.zeros(10)), ops=[CUSTOM], **FP32_TOL,
                   dynamic_shapes=(None, None, None, {0: past}),
                   resize_inputs=[(q, k, v, torch.zeros(61)), (q, k, v, torch.zeros(1))])
    for n in (10, 61):
        torch.testing.assert_close(got(q, k, v, torch.zeros(n)),
                                   _eager_cache_attention(q, k, v, n, n + 3, True),
                                   **FP32_TOL)


def test_sdpa_with_kv_cache_writes_cache_and_attends(vk_device):
    q, k_cache, v_cache = _cache_qkv(1, 4, 4, 40, 2, 32)
    torch.manual_seed(7)
    k_new, v_new = torch.randn(1, 4, 2, 32), torch.randn(1, 4, 2, 32)
    k_full, v_full = k_cache.clone(), v_cache.clone()
    k_full[:, 9:13], v_full[:, 9:13] = k_new, v_new
    want = _eager_cache_attention(q, k_full, v_full, 9, 13, True)
    run_et_node(vk_device, "llama.sdpa_with_kv_cache.default",
                [q, k_new, v_new, k_cache, v_cache, 9, 4, None, 0.0, True, None], want,
                **FP32_TOL)


def test_sdpa_with_kv_cache_fp16_bool_mask(vk_device):
    # With a mask every cache row takes part: the mask decides (ET's semantics).
    q, k_cache, v_cache = _cache_qkv(1, 3, 2, 24, 1, 64, dtype=torch.float16)
    torch.manual_seed(9)
    k_new, v_new = torch.randn(1, 3, 1, 64).half(), torch.randn(1, 3, 1, 64).half()
    mask = torch.rand(3, 24) > 0.4
    mask[:, 0] = True
    k_full, v_full = k_cache.clone(), v_cache.clone()
    k_full[:, 5:8], v_full[:, 5:8] = k_new, v_new
    want = _eager_cache_attention(q.float(), k_full.float(), v_full.float(), 5, 24, False,
                                  mask=mask).half()
    run_et_node(vk_device, "llama.sdpa_with_kv_cache.default",
                [q, k_new, v_new, k_cache, v_cache, 5, 3, mask, 0.0, False, None], want,
                **FP16_TOL)


def test_custom_sdpa_and_sliding_window_bool_masks():
    q, k, v = _cache_qkv(1, 8, 4, 50, 4, 32)
    torch.manual_seed(10)
    mask = torch.rand(8, 50) > 0.5
    mask[torch.arange(8), torch.arange(8) + 42] = True  # each row sees its own position
    fn = lambda q, k, v, m: torch.ops.llama.custom_sdpa(q, k, v, 42, m)  # noqa: E731
    got = check_op(fn, (q, k, v, mask), ops=[CUSTOM], **FP32_TOL)(q, k, v, mask)
    torch.testing.assert_close(got, _eager_cache_attention(q, k, v, 42, 50, False, mask=mask),
                               **FP32_TOL)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    fn = _sliding(6, 42)
    got = check_op(fn, (qt, kt, vt, mask), ops=[SLIDING], **FP32_TOL)(qt, kt, vt, mask)
    want = _eager_cache_attention(q, k, v, 42, 50, False,
                                  mask=mask & _window_mask(8, 50, 6, 42))
    torch.testing.assert_close(got, want.transpose(1, 2), **FP32_TOL)


@pytest.mark.parametrize("start_pos,lq", [(0, 100), (70, 1), (33, 20)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sliding_window_op(start_pos, lq, dtype):
    torch.manual_seed(2)
    s = start_pos + lq
    q, k, v = (torch.randn(1, h, n, 64).to(dtype) for h, n in ((4, lq), (2, s), (2, s)))
    fn = _sliding(24, start_pos)
    tol = FP32_TOL if dtype == torch.float32 else FP16_TOL
    on = check_op(fn, (q, k, v), ops=[SLIDING], **tol)
    off = check_op(fn, (q, k, v), ops=[SLIDING], **tol, options=OFF)
    assert torch.equal(on(q, k, v), off(q, k, v))
    want = _eager_cache_attention(*(t.float().transpose(1, 2) for t in (q, k, v)),
                                  start_pos, s, True, window=24).transpose(1, 2)
    torch.testing.assert_close(on(q, k, v).float(), want, **tol)


def _window_mask(lq, s, window, start_pos=0):
    i = torch.arange(lq)[:, None] + start_pos
    j = torch.arange(s)[None, :]
    return (j <= i) & (j > i - window)


@pytest.mark.parametrize("mode", ["causal", "bool_window", "bool_blocks", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_early_exit_is_bit_identical(mode, dtype):
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 200, 64).to(dtype) for _ in range(3))
    if mode == "causal":
        fn, args = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    (q, k, v))
    else:
        if mode == "bool_window":
            mask = _window_mask(200, 200, 40)
        elif mode == "bool_blocks":  # random 32-key blocks off, one row fully masked
            mask = torch.rand(200, 200) > 0.5
            mask[:, 32:96] = False
            mask[:64, 128:] = False
            mask[5] = False
        else:
            mask = torch.where(_window_mask(200, 200, 40), torch.randn(200, 200),
                               torch.tensor(float("-inf"))).to(dtype)
        fn = _sdpa()
        args = (q, k, v, mask)
    tol = FP32_TOL if dtype == torch.float32 else FP16_TOL
    on = check_op(fn, args, ops=[SDPA], **tol)
    off = check_op(fn, args, ops=[SDPA], **tol, options=OFF)
    assert torch.equal(on(*args), off(*args))


def test_gqa_heads_packed_per_workgroup_causal_and_window_exact():
    # Hq / Hk = 4 query heads share each workgroup (one K/V tile read for all four).
    assert attention.pack_for(32, 8) == 4 and attention.pack_for(12, 4) == 1
    assert attention.pack_for(64, 1) == 1 and attention.pack_for(8, 8) == 1
    torch.manual_seed(11)
    q, k, v = (torch.randn(1, h, 100, 32) for h in (8, 2, 2))
    fn = _sdpa(is_causal=True, enable_gqa=True)
    on = check_op(fn, (q, k, v), ops=[SDPA], **FP32_TOL)
    off = check_op(fn, (q, k, v), ops=[SDPA], **FP32_TOL, options=OFF)
    assert torch.equal(on(q, k, v), off(q, k, v))
    fn = _sliding(20, 0)
    on = check_op(fn, (q, k, v), ops=[SLIDING], **FP32_TOL)
    off = check_op(fn, (q, k, v), ops=[SLIDING], **FP32_TOL, options=OFF)
    assert torch.equal(on(q, k, v), off(q, k, v))


def test_reference_executor_runs_the_kv_ops():
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            a = torch.ops.llama.custom_sdpa(q, k, v, 4, None, 0.0, True, None)
            b = torch.ops.vkdelegate.sliding_window_sdpa(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 3, 4)
            return a + b.transpose(1, 2)

    q, k, v = _cache_qkv(1, 3, 4, 10, 2, 16)
    ep = torch.export.export(M(), (q, k, v))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    assert all(d.partition is not None for d in program.methods["forward"].report.decisions)
    want = (_eager_cache_attention(q, k, v, 4, 7, True)
            + _eager_cache_attention(q, k, v, 4, 10, True, window=3))
    torch.testing.assert_close(program(q, k, v), want, **FP32_TOL)


def test_split_k_decode_matches_eager_and_is_chosen():
    # One query over 1500 keys: split-K (several workgroups over key ranges + combine).
    assert attention.splits_for(1, 8, 1, 1500, 64) > 1
    assert attention.splits_for(4096, 32, 4, 4096, 128) == 1
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, h, n, 64) for h, n in ((8, 1), (2, 1500), (2, 1500)))
    check_op(_sdpa(enable_gqa=True), (q, k, v), ops=[SDPA], **FP32_TOL)
    mask = torch.rand(1, 1500) > 0.3
    mask[:, 200:1400] = False
    fn = _sdpa(enable_gqa=True)
    on = check_op(fn, (q, k, v, mask), ops=[SDPA], **FP32_TOL)
    off = check_op(fn, (q, k, v, mask), ops=[SDPA], **FP32_TOL, options=OFF)
    assert torch.equal(on(q, k, v, mask), off(q, k, v, mask))
    qh, kh, vh = q.half(), k.half(), v.half()
    check_op(_custom(1000), (qh.transpose(1, 2), kh.transpose(1, 2), vh.transpose(1, 2)),
             ops=[CUSTOM], **FP16_TOL)


class _StaticCacheAttention(torch.nn.Module):
    """What a HF decoder with a static cache exports: SDPA over the whole cache with a
    boolean mask from the positions (cache_position = start_pos + arange(L)); with
    ``window``, Mistral / Gemma 2's sliding-window mask."""

    def __init__(self, window: int = 0):
        super().__init__()
        self.window = window

    def forward(self, q, k_cache, v_cache, start_pos):
        pos = torch.arange(q.shape[-2]) + start_pos
        keys = torch.arange(k_cache.shape[-2])
        mask = keys[None, :] <= pos[:, None]
        if self.window:
            mask = mask & (keys[None, :] > pos[:, None] - self.window)
        return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask[None, None],
                                              enable_gqa=True)


@pytest.mark.parametrize("window", [0, 16])
def test_static_cache_mask_form_runs_wholly_on_vulkan(window):
    torch.manual_seed(8)
    q, k, v = torch.randn(1, 4, 5, 32), torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32)
    program = check_op(_StaticCacheAttention(window), (q, k, v, torch.tensor([21])),
                       ops=[SDPA], **FP32_TOL)
    cpu = {d.op for m in program.methods.values() for d in m.report.cpu_nodes}
    assert cpu == set(), cpu
    for start in (0, 40, 59):
        torch.testing.assert_close(
            program(q, k, v, torch.tensor([start])),
            _eager_cache_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                   start, 64, True, window=window).transpose(1, 2),
            **FP32_TOL)


class _HFStaticCacheDecoder(torch.nn.Module):
    """A HF causal LM over transformers' StaticCache whose layers point at our buffers
    (as vkdelegate.llm does): the attention exports as SDPA over the whole cache with a
    mask built from the positions."""

    def __init__(self, model, max_seq_len: int):
        super().__init__()
        from transformers.cache_utils import StaticCache, StaticLayer

        self.model = model
        cfg = model.config
        heads, dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
        for i in range(cfg.num_hidden_layers):
            self.register_buffer(f"k_{i}", torch.zeros(1, heads, max_seq_len, dim))
            self.register_buffer(f"v_{i}", torch.zeros(1, heads, max_seq_len, dim))
        cache = StaticCache(max_cache_len=max_seq_len, config=cfg)
        cache.layers = [StaticLayer(max_seq_len) for _ in cache.layers]
        n = cfg.num_hidden_layers
        cache.early_initialization(1, [heads] * n, [dim] * n, model.dtype, torch.device("cpu"))
        self.__dict__["_static"] = cache

    def forward(self, embeds, start_pos):
        for i, layer in enumerate(self._static.layers):
            layer.keys, layer.values = getattr(self, f"k_{i}"), getattr(self, f"v_{i}")
            layer.cumulative_length = start_pos[0].clone()
        positions = (torch.arange(embeds.shape[1]) + start_pos).unsqueeze(0)
        return self.model(inputs_embeds=embeds, position_ids=positions, cache=self._static,
                          use_cache=True, logits_to_keep=1).logits


def test_hf_mistral_sliding_window_mask_and_sdpa_lower_to_vulkan():
    # The sliding-window mask HF Mistral builds (arange, le, gt, sub, and) and the SDPA
    # reading it are delegated; only the cache write (index_copy_/index_put, other work)
    # may stay on the CPU.
    transformers = pytest.importorskip("transformers")
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    cfg = transformers.MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, sliding_window=8,
                                     max_position_embeddings=128)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    module = _HFStaticCacheDecoder(transformers.MistralForCausalLM(cfg).eval(), 32)
    ep = torch.export.export(module, (torch.randn(1, 5, 64), torch.tensor([3])), strict=False)
    program = to_backend(ep, VulkanPartitioner())
    decisions = program.methods["forward"].report.decisions
    assert [d.partition is not None for d in decisions if d.op == SDPA] == [True]
    cpu = {d.op for d in program.methods["forward"].report.cpu_nodes}
    assert {op for op in cpu if "index" not in op} == set(), cpu
    torch.manual_seed(0)
    eager = _HFStaticCacheDecoder(transformers.MistralForCausalLM(cfg).eval(), 32)
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        want = eager(x, torch.tensor([3]))
    torch.testing.assert_close(program(x, torch.tensor([3])), want, rtol=1e-4, atol=1e-5)
    program.close()
