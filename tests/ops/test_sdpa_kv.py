"""Attention over a KV cache on Vulkan (issue 14), against eager
F.scaled_dot_product_attention with the masks the ops imply built independently
(tests/ops/attention_reference.py): llama.custom_sdpa (start_pos, causal, 2-D masks,
GQA 1..8, head dims 32..256, fp16, a 4096-row cache), llama.sdpa_with_kv_cache (the
caches written in place), vkdelegate.sliding_window_sdpa, and the reference executor."""
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.attention_reference import (CUSTOM, FP16_TOL, FP32_TOL, OFF, SDPA, SLIDING,
                                           cache_qkv, custom_fn, eager_cache_attention,
                                           sliding_fn, window_mask)
from tests.ops.et_graphs import run_et_node
from tests.ops.harness import check_op
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend
from vkdelegate.kernels import attention

ensure_defined()


@pytest.mark.parametrize("start_pos,lq", [(0, 1), (0, 7), (5, 1), (37, 1), (20, 13),
                                          (90, 40)])
@pytest.mark.parametrize("causal", [True, False])
def test_custom_sdpa_start_pos(start_pos, lq, causal):
    q, k, v = cache_qkv(1, lq, 4, 160, 2, 32)
    want = eager_cache_attention(q, k, v, start_pos, start_pos + lq, causal)
    got = check_op(custom_fn(start_pos, causal), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v), want, **FP32_TOL)


def test_custom_sdpa_decode_over_a_4096_row_cache():
    # One query at position 4000 (split-K; the rows past 4000 are never read).
    q, k, v = cache_qkv(1, 1, 8, 4096, 2, 64)
    k[:, 4001:] = float("nan")  # cache rows not in use: must not reach the output
    got = check_op(custom_fn(4000), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v),
                               eager_cache_attention(q, k, v, 4000, 4001, True), **FP32_TOL)


@pytest.mark.parametrize("hk", [8, 4, 2, 1])
def test_custom_sdpa_gqa_ratios(hk):
    q, k, v = cache_qkv(2, 9, 8, 64, hk, 32)
    got = check_op(custom_fn(11), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v), eager_cache_attention(q, k, v, 11, 20, True),
                               **FP32_TOL)


@pytest.mark.parametrize("e", [32, 64, 128, 256])
def test_custom_sdpa_head_dims(e):
    q, k, v = cache_qkv(1, 5, 2, 48, 1, e)
    got = check_op(custom_fn(30), (q, k, v), ops=[CUSTOM], **FP32_TOL)
    torch.testing.assert_close(got(q, k, v), eager_cache_attention(q, k, v, 30, 35, True),
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
    got = check_op(custom_fn(60), (qc, kc, vc), ops=[CUSTOM], **FP16_TOL)(qc, kc, vc)
    torch.testing.assert_close(got.float(), eager_cache_attention(
        qc.float(), kc.float(), vc.float(), 60, 65, True), **FP16_TOL)


def test_custom_sdpa_fp16_and_float_mask_with_fully_masked_row():
    q, k, v = cache_qkv(1, 6, 4, 70, 2, 64, dtype=torch.float16)
    got = check_op(custom_fn(50), (q, k, v), ops=[CUSTOM], **FP16_TOL)
    torch.testing.assert_close(got(q, k, v).float(),
                               eager_cache_attention(q.float(), k.float(), v.float(), 50,
                                                      56, True), **FP16_TOL)
    # A 2-D additive mask over the whole cache; row 2 fully masked: NaN (the op's
    # reference softmax), which check_op compares as equal.
    mask = torch.randn(6, 70)
    mask[2] = float("-inf")
    fn = lambda q, k, v, m: torch.ops.llama.custom_sdpa(q, k, v, 50, m)  # noqa: E731
    q32, k32, v32 = q.float(), k.float(), v.float()
    out = check_op(fn, (q32, k32, v32, mask), ops=[CUSTOM], **FP32_TOL)(q32, k32, v32, mask)
    assert torch.isnan(out[:, 2]).all() and not torch.isnan(out[:, [0, 1, 3, 4, 5]]).any()
    want = eager_cache_attention(q32, k32, v32, 0, 70, False, mask=mask)
    torch.testing.assert_close(out[:, [0, 1, 3, 4, 5]], want[:, [0, 1, 3, 4, 5]], **FP32_TOL)


def test_custom_sdpa_symbolic_start_pos_resizes():
    # start_pos from a size (the past length): re-read after every resize.
    def fn(q, k, v, past):
        return torch.ops.llama.custom_sdpa(q, k, v, past.shape[0], None, 0.0, True, None)

    q, k, v = cache_qkv(1, 3, 4, 96, 2, 32)
    past = Dim("past", min=1, max=90)
    got = check_op(fn, (q, k, v, torch.zeros(10)), ops=[CUSTOM], **FP32_TOL,
                   dynamic_shapes=(None, None, None, {0: past}),
                   resize_inputs=[(q, k, v, torch.zeros(61)), (q, k, v, torch.zeros(1))])
    for n in (10, 61):
        torch.testing.assert_close(got(q, k, v, torch.zeros(n)),
                                   eager_cache_attention(q, k, v, n, n + 3, True),
                                   **FP32_TOL)


def test_sdpa_with_kv_cache_writes_cache_and_attends(vk_device):
    q, k_cache, v_cache = cache_qkv(1, 4, 4, 40, 2, 32)
    torch.manual_seed(7)
    k_new, v_new = torch.randn(1, 4, 2, 32), torch.randn(1, 4, 2, 32)
    k_full, v_full = k_cache.clone(), v_cache.clone()
    k_full[:, 9:13], v_full[:, 9:13] = k_new, v_new
    want = eager_cache_attention(q, k_full, v_full, 9, 13, True)
    run_et_node(vk_device, "llama.sdpa_with_kv_cache.default",
                [q, k_new, v_new, k_cache, v_cache, 9, 4, None, 0.0, True, None], want,
                **FP32_TOL)


def test_sdpa_with_kv_cache_fp16_bool_mask(vk_device):
    # With a mask every cache row takes part: the mask decides (ET's semantics).
    q, k_cache, v_cache = cache_qkv(1, 3, 2, 24, 1, 64, dtype=torch.float16)
    torch.manual_seed(9)
    k_new, v_new = torch.randn(1, 3, 1, 64).half(), torch.randn(1, 3, 1, 64).half()
    mask = torch.rand(3, 24) > 0.4
    mask[:, 0] = True
    k_full, v_full = k_cache.clone(), v_cache.clone()
    k_full[:, 5:8], v_full[:, 5:8] = k_new, v_new
    want = eager_cache_attention(q.float(), k_full.float(), v_full.float(), 5, 24, False,
                                  mask=mask).half()
    run_et_node(vk_device, "llama.sdpa_with_kv_cache.default",
                [q, k_new, v_new, k_cache, v_cache, 5, 3, mask, 0.0, False, None], want,
                **FP16_TOL)


def test_custom_sdpa_and_sliding_window_bool_masks():
    q, k, v = cache_qkv(1, 8, 4, 50, 4, 32)
    torch.manual_seed(10)
    mask = torch.rand(8, 50) > 0.5
    mask[torch.arange(8), torch.arange(8) + 42] = True  # each row sees its own position
    fn = lambda q, k, v, m: torch.ops.llama.custom_sdpa(q, k, v, 42, m)  # noqa: E731
    got = check_op(fn, (q, k, v, mask), ops=[CUSTOM], **FP32_TOL)(q, k, v, mask)
    torch.testing.assert_close(got, eager_cache_attention(q, k, v, 42, 50, False, mask=mask),
                               **FP32_TOL)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    fn = sliding_fn(6, 42)
    got = check_op(fn, (qt, kt, vt, mask), ops=[SLIDING], **FP32_TOL)(qt, kt, vt, mask)
    want = eager_cache_attention(q, k, v, 42, 50, False,
                                  mask=mask & window_mask(8, 50, 6, 42))
    torch.testing.assert_close(got, want.transpose(1, 2), **FP32_TOL)


@pytest.mark.parametrize("start_pos,lq", [(0, 100), (70, 1), (33, 20)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sliding_window_op(start_pos, lq, dtype):
    torch.manual_seed(2)
    s = start_pos + lq
    q, k, v = (torch.randn(1, h, n, 64).to(dtype) for h, n in ((4, lq), (2, s), (2, s)))
    fn = sliding_fn(24, start_pos)
    tol = FP32_TOL if dtype == torch.float32 else FP16_TOL
    on = check_op(fn, (q, k, v), ops=[SLIDING], **tol)
    off = check_op(fn, (q, k, v), ops=[SLIDING], **tol, options=OFF)
    assert torch.equal(on(q, k, v), off(q, k, v))
    want = eager_cache_attention(*(t.float().transpose(1, 2) for t in (q, k, v)),
                                  start_pos, s, True, window=24).transpose(1, 2)
    torch.testing.assert_close(on(q, k, v).float(), want, **tol)


def test_reference_executor_runs_the_kv_ops():
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            a = torch.ops.llama.custom_sdpa(q, k, v, 4, None, 0.0, True, None)
            b = torch.ops.vkdelegate.sliding_window_sdpa(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 3, 4)
            return a + b.transpose(1, 2)

    q, k, v = cache_qkv(1, 3, 4, 10, 2, 16)
    ep = torch.export.export(M(), (q, k, v))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    assert all(d.partition is not None for d in program.methods["forward"].report.decisions)
    want = (eager_cache_attention(q, k, v, 4, 7, True)
            + eager_cache_attention(q, k, v, 4, 10, True, window=3))
    torch.testing.assert_close(program(q, k, v), want, **FP32_TOL)
