"""Block-sparse early exit, split-K decode and grouped-query packing of the fused
attention (issue 14) on Vulkan: outputs bit-identical with the early exit switched off
(causal, sliding window, boolean blocks, float masks, fp32 and fp16), split-K chosen
and matching eager, the static-cache mask form a HF decoder exports (hand-written
and HF Mistral's sliding window) lowered wholly to Vulkan, and the prefill kernels
(sdpa_tiled.glsl, sdpa_coopmat.glsl): which one runs, and prefill-sized fp16 masks."""
import pytest
import torch
import torch.nn.functional as F

from tests.ops.attention_reference import (CUSTOM, FP16_TOL, FP32_TOL, OFF, SDPA, SLIDING,
                                           custom_fn, eager_cache_attention, sdpa_fn,
                                           sliding_fn, window_mask)
from tests.ops.harness import check_op
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend
from vkdelegate.kernels import attention

ensure_defined()


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
            mask = window_mask(200, 200, 40)
        elif mode == "bool_blocks":  # random 32-key blocks off, one row fully masked
            mask = torch.rand(200, 200) > 0.5
            mask[:, 32:96] = False
            mask[:64, 128:] = False
            mask[5] = False
        else:
            mask = torch.where(window_mask(200, 200, 40), torch.randn(200, 200),
                               torch.tensor(float("-inf"))).to(dtype)
        fn = sdpa_fn()
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
    fn = sdpa_fn(is_causal=True, enable_gqa=True)
    on = check_op(fn, (q, k, v), ops=[SDPA], **FP32_TOL)
    off = check_op(fn, (q, k, v), ops=[SDPA], **FP32_TOL, options=OFF)
    assert torch.equal(on(q, k, v), off(q, k, v))
    fn = sliding_fn(20, 0)
    on = check_op(fn, (q, k, v), ops=[SLIDING], **FP32_TOL)
    off = check_op(fn, (q, k, v), ops=[SLIDING], **FP32_TOL, options=OFF)
    assert torch.equal(on(q, k, v), off(q, k, v))


def test_split_k_decode_matches_eager_and_is_chosen():
    # One query over 1500 keys: split-K (several workgroups over key ranges + combine).
    assert attention.splits_for(1, 8, 1, 1500, 64) > 1
    assert attention.splits_for(4096, 32, 4, 4096, 128) == 1
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, h, n, 64) for h, n in ((8, 1), (2, 1500), (2, 1500)))
    check_op(sdpa_fn(enable_gqa=True), (q, k, v), ops=[SDPA], **FP32_TOL)
    mask = torch.rand(1, 1500) > 0.3
    mask[:, 200:1400] = False
    fn = sdpa_fn(enable_gqa=True)
    on = check_op(fn, (q, k, v, mask), ops=[SDPA], **FP32_TOL)
    off = check_op(fn, (q, k, v, mask), ops=[SDPA], **FP32_TOL, options=OFF)
    assert torch.equal(on(q, k, v, mask), off(q, k, v, mask))
    qh, kh, vh = q.half(), k.half(), v.half()
    check_op(custom_fn(1000), (qh.transpose(1, 2), kh.transpose(1, 2), vh.transpose(1, 2)),
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
            eager_cache_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
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


def test_hf_mistral_slidingwindow_mask_and_sdpa_lower_to_vulkan():
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


@pytest.mark.parametrize("mode", ["causal", "bool_window", "float_window"])
def test_prefill_sized_fp16_masks_at_head_dim_128(mode):
    # Prefill-shaped float16 attention (grouped-query heads, head dim 128, several query
    # blocks and key tiles, a [1, 1, L, S] mask as HF builds it): the tiled kernel, and on
    # devices with cooperative matrices sdpa_coopmat.glsl, match eager and are exact
    # under the early exit.
    torch.manual_seed(13)
    q, k, v = (torch.randn(1, h, 320, 128).half() for h in (4, 2, 2))
    if mode == "causal":
        fn, args = sdpa_fn(is_causal=True, enable_gqa=True), (q, k, v)
    else:
        mask = window_mask(320, 320, 100)[None, None]
        if mode == "float_window":
            mask = torch.where(mask, torch.randn(320, 320), torch.tensor(float("-inf"))).half()
        fn, args = sdpa_fn(enable_gqa=True), (q, k, v, mask)
    on = check_op(fn, args, ops=[SDPA], **FP16_TOL)
    off = check_op(fn, args, ops=[SDPA], **FP16_TOL, options=OFF)
    assert torch.equal(on(*args), off(*args))


def test_prefill_kernel_choice():
    # Prefill (>= TILED_MIN_L queries, head dims <= 128) runs the tiled kernels, within
    # their shared-memory budget; float16 takes sdpa_coopmat.glsl only where the device
    # has the cooperative-matrix shape, fixed 32-wide subgroups (boolean masks: COOP_BOOL_MASK).
    from vkdelegate.capabilities import Capabilities, CooperativeMatrixShape
    from vkdelegate.runtime.device_info import DeviceInfo
    assert attention.use_tiled(16, 128) and not attention.use_tiled(15, 128)
    assert not attention.use_tiled(2048, 256)
    # a device with the spec's 16 KiB of shared memory keeps sdpa.glsl
    assert attention.use_tiled(2048, 128, 32768) and not attention.use_tiled(2048, 128, 16384)
    for d in (32, 64, 128):
        bn = attention.tiled_block_n(d)
        assert bn % 8 == 0 and attention.tiled_shared_bytes(d, bn) <= 32768
    shape = CooperativeMatrixShape(16, 16, 16, "FLOAT16_KHR", "FLOAT16_KHR", "FLOAT32_KHR",
                                   "FLOAT32_KHR")
    caps = Capabilities(api_version=(1, 3), features=frozenset(attention.COOP_REQUIRES),
                        subgroup_size=32, min_subgroup_size=32, max_subgroup_size=32,
                        cooperative_matrix_shapes=(shape,))
    info = DeviceInfo(0, "gpu", "discrete", "driver", "1.3", capabilities=caps,
                      subgroup_ops=["basic", "shuffle"])
    half, f32, boolean = ("float16", "float16"), ("float32", "float32"), ("bool", "uint8")
    assert attention.coop_fits(info, half, half, half)
    assert attention.coop_fits(info, half, half, half, half)  # additive float16 mask
    assert attention.coop_fits(info, half, half, half, boolean) == attention.COOP_BOOL_MASK
    assert not attention.coop_fits(info, f32, f32, f32)
    wide = DeviceInfo(0, "gpu", "discrete", "driver", "1.3", subgroup_ops=["shuffle"],
                      capabilities=Capabilities(
                          api_version=(1, 3), features=caps.features, subgroup_size=64,
                          min_subgroup_size=64, max_subgroup_size=64,
                          cooperative_matrix_shapes=(shape,)))
    assert not attention.coop_fits(wide, half, half, half)
    bare = DeviceInfo(0, "gpu", "discrete", "driver", "1.3", capabilities=Capabilities(
        api_version=(1, 3), features=frozenset({"shaderFloat16"}), subgroup_size=32),
        subgroup_ops=["shuffle"])
    assert not attention.coop_fits(bare, half, half, half)
