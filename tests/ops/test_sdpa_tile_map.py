"""The block map of a boolean attention mask (sdpa_tile_map.glsl, kernels/attention_map.py;
issue 14): recorded before the attention kernel for boolean masks with the early exit on
and only then, its bits equal to the mask's blocks as the consuming kernel tiles them
(read back from the device), and outputs bit-identical with the early exit off and
equal to eager for block-sparse masks: fully dead query blocks, full and partial tiles,
masks broadcast over heads, batch, rows or keys, per-head masks, lengths that are not
multiples of the tiles, grouped-query heads packed in sdpa.glsl, the [B, L, H, D] ops,
and resizes to smaller and larger lengths."""
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.ops.attention_reference import (CUSTOM, FP16_TOL, FP32_TOL, OFF, SDPA,
                                           SLIDING, sdpa_fn, sliding_fn, window_mask)
from tests.ops.harness import check_op
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate.backend.custom_ops import ensure_defined
from vkdelegate.backend.partitioner import VulkanPartitioner
from vkdelegate.backend.to_backend import to_backend
from vkdelegate.kernels import attention, attention_decode, attention_map

ensure_defined()


def block_mask(shape, seed: int, block: int = 8) -> torch.Tensor:
    """A boolean mask of ``shape`` (..., L, S) made of block x block cells, each dead,
    full or random (so that the kernels' tiles see dead, full and partial blocks), with
    some whole rows dead (query blocks of 32 and 64 rows among them where L allows)."""
    g = torch.Generator().manual_seed(seed)
    *lead, n, s = shape
    cells = torch.randint(0, 3, (*lead, -(-n // block), -(-s // block)), generator=g)
    kind = cells.repeat_interleave(block, -2).repeat_interleave(block, -1)[..., :n, :s]
    mask = torch.where(kind == 1, torch.ones((), dtype=torch.bool),
                       torch.rand(*lead, n, s, generator=g) > 0.5)
    mask &= kind != 0
    mask[..., 64:128, :] = False  # a whole query block of either kernel, dead
    if n > 5:
        mask[..., 5, :] = False   # and a fully masked row
    return mask


def _qkv(b, hq, hk, lq, s, e, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, e, generator=g).to(dtype)
                 for h, n in ((hq, lq), (hk, s), (hk, s)))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN rows (ExecuTorch's fully masked rows) included."""
    ints = {torch.float32: torch.int32, torch.float16: torch.int16}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))


def _exact(fn, args, tol, ops=(SDPA,), **kw):
    """check_op with the early exit on and off (each against eager, resizes included)
    and the two outputs bit-identical."""
    on = check_op(fn, args, ops=list(ops), **tol, **kw)
    off = check_op(fn, args, ops=list(ops), **tol, options=OFF, **kw)
    assert _same_bits(on(*args), off(*args))
    for resized in kw.get("resize_inputs") or []:
        assert _same_bits(on(*resized), off(*resized))


def _blocks(kernel: str, e: int, group: int = 1) -> tuple:
    """(rows, keys, heads) of one workgroup of ``kernel`` at head dim ``e`` (``group``:
    the query heads sdpa.glsl packs)."""
    d_max = attention.d_bucket(e, e)
    return {attention.TILED: (attention.TILED_BM, attention.tiled_block_n(d_max), 1),
            attention.COOP: (attention.COOP_BM, attention.COOP_BN, 1),
            attention.SHADER: (attention.BLOCK_M // group, attention.block_n(d_max),
                               group)}[kernel]


class _Spy:
    """Records what attention_map.dispatch made (the map tensor and its block shape)
    and which shaders the nodes dispatched, while building programs."""

    def __init__(self):
        self.maps = []
        self.shaders = []

    def __enter__(self):
        from vkdelegate.runtime.builder import NodeBuilder
        real_map, real_dispatch = attention_map.dispatch, NodeBuilder.dispatch
        spy = self

        def map_dispatch(b, a, params, *, rows, keys, heads):
            tile_map, map_params = real_map(b, a, params, rows=rows, keys=keys, heads=heads)
            spy.maps.append(dict(map=tile_map, rows=rows, keys=keys, heads=heads, a=a))
            return tile_map, map_params

        def dispatch(builder, shader, defines, *args, **kw):
            spy.shaders.append((shader, dict(defines)))
            return real_dispatch(builder, shader, defines, *args, **kw)

        self._patches = [mock.patch.object(attention_map, "dispatch", map_dispatch),
                         mock.patch.object(NodeBuilder, "dispatch", dispatch)]
        for p in self._patches:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self._patches:
            p.stop()


@pytest.mark.parametrize("case", ["bool", "bool_off", "float", "causal", "sdpa_glsl",
                                  "custom_sdpa"])
def test_map_dispatch_recorded_for_boolean_masks_with_the_early_exit(case):
    # The map dispatch comes right before the kernel that reads it, for boolean masks
    # with the early exit on (tiled prefill, sdpa.glsl, ExecuTorch's [B, L, H, D] ops),
    # and never otherwise.
    q, k, v = _qkv(1, 2, 2, 40 if case != "sdpa_glsl" else 9, 70, 32, seed=1)
    mask = block_mask((q.shape[-2], 70), seed=1)
    fn, args, ops, options = sdpa_fn(), (q, k, v, mask), (SDPA,), None
    if case == "bool_off":
        options = OFF
    elif case == "float":
        args = (q, k, v, torch.where(mask, 0.0, float("-inf")))
    elif case == "causal":
        fn, args = sdpa_fn(is_causal=True), (q, k, v)
    elif case == "custom_sdpa":
        qc, kc, vc = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        cmask = block_mask((40, 70), seed=2)

        def fn(q, k, v, m):
            return torch.ops.llama.custom_sdpa(q, k, v, 30, m, 0.0, False, None)
        args, ops = (qc, kc, vc, cmask), (CUSTOM,)
    with _Spy() as spy:
        check_op(fn, args, ops=list(ops), **FP32_TOL, options=options)
    shaders = [name for name, _ in spy.shaders]
    # sdpa_decode.glsl (few queries on GPUs) reads the mask per key, without a map.
    boolean = case in ("bool", "sdpa_glsl", "custom_sdpa") and \
        attention_decode.SHADER not in shaders
    if not boolean:
        assert attention_map.SHADER not in shaders and not spy.maps, shaders
        return
    assert shaders.count(attention_map.SHADER) == 1, shaders
    at = shaders.index(attention_map.SHADER)
    kernel, d = spy.shaders[at + 1]
    assert kernel == (attention.SHADER if case == "sdpa_glsl" else attention.TILED), shaders
    assert "TILE_MAP" in d and "SKIP_MASKED_TILES" in d
    (entry,) = spy.maps
    assert (entry["rows"], entry["keys"], entry["heads"]) == _blocks(kernel, 32)
    assert ("SEQ_FIRST" in spy.shaders[at][1]) == (case == "custom_sdpa")


def _reference_map(mask: torch.Tensor, lq: int, s: int, rows: int, keys: int,
                   heads: int) -> dict:
    """(plane, query block, tile) -> (live, full) of ``mask`` (rank <= 4, broadcast to
    [.., lq, s]) for blocks of rows x keys x heads, as sdpa_tile_map.glsl defines them."""
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    bm, hm = m.shape[:2]
    m = m.expand(bm, hm, lq, s)
    groups = -(-hm // heads)
    out = {}
    for pb in range(bm):
        for ph in range(groups):
            part = m[pb, ph * heads:(ph + 1) * heads]
            for qb in range(-(-lq // rows)):
                for t in range(-(-s // keys)):
                    cell = part[:, qb * rows:(qb + 1) * rows, t * keys:(t + 1) * keys]
                    out[pb * groups + ph, qb, t] = (bool(cell.any()), bool(cell.all()))
    return out


def _device_map(entry, mask_shape, lq: int, s: int) -> dict:
    """The same read back from the map tensor (host-visible memory: CPU drivers), at
    the current lengths ``lq`` and ``s``."""
    a, rows, keys, heads = entry["a"], entry["rows"], entry["keys"], entry["heads"]
    seq = -3 if a.seq_first else -2
    _, blocks, words = attention_map.extent(a.mask.max_shape, a.q.max_shape[seq],
                                            a.k.max_shape[seq], rows=rows, keys=keys,
                                            heads=heads)
    try:
        view = entry["map"].host_view().view(np.uint32)
    except Exception as exc:  # a GPU's device-local memory
        pytest.skip(f"the map is not host-visible here: {exc}")
    dims = (1,) * (4 - len(mask_shape)) + tuple(mask_shape)
    planes = dims[0] * -(-dims[1] // heads)
    out = {}
    for plane in range(planes):
        for qb in range(-(-lq // rows)):
            for t in range(-(-s // keys)):
                o = ((plane * blocks + qb) * words + t // 32) * 2
                bit = lambda x: bool((int(view[x]) >> (t % 32)) & 1)  # noqa: E731
                out[plane, qb, t] = (bit(o), bit(o + 1))
    return out


@pytest.mark.parametrize("form", ["tiled_broadcast", "tiled_per_head", "tiled_batch",
                                  "tiled_rows_broadcast", "tiled_keys_broadcast",
                                  "sdpa_glsl_packed_heads", "tiled_fp16_d128"])
def test_map_bits_equal_the_mask_blocks(form):
    # The bits on the device against the mask's blocks as the consuming kernel tiles
    # them (its rows, keys and packed heads), odd lengths, several mask planes.
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    lq, s, e, hq, hk, b, dtype = 77, 131, 32, 4, 2, 1, torch.float32
    if form == "sdpa_glsl_packed_heads":
        lq, hq, hk = 9, 8, 2  # < 16 queries: sdpa.glsl, Hq / Hk = 4 heads a workgroup
    if form == "tiled_fp16_d128":
        e, dtype = 128, torch.float16  # 16-key tiles
    shape = {"tiled_broadcast": (1, 1, lq, s), "tiled_per_head": (1, hq, lq, s),
             "tiled_batch": (2, 1, lq, s), "tiled_rows_broadcast": (1, 1, 1, s),
             "tiled_keys_broadcast": (lq, 1), "sdpa_glsl_packed_heads": (1, hq, lq, s),
             "tiled_fp16_d128": (1, 1, lq, s)}[form]
    if form == "tiled_batch":
        b = 2
    mask = block_mask(shape, seed=3, block=4) if shape[-1] > 1 else \
        torch.rand(shape, generator=torch.Generator().manual_seed(3)) > 0.5
    if form == "sdpa_glsl_packed_heads":
        mask[..., 32:96] = False  # dead for all four heads of a workgroup
    q, k, v = _qkv(b, hq, hk, lq, s, e, dtype, seed=3)
    ep = torch.export.export(_Masked(), (q, k, v, mask))
    program = to_backend(ep, VulkanPartitioner({"executor": "vulkan"}))
    try:
        with _Spy() as spy:
            got = program(q, k, v, mask)
        torch.testing.assert_close(got, _Masked()(q, k, v, mask),
                                   **(FP32_TOL if dtype == torch.float32 else FP16_TOL))
        shaders = [name for name, _ in spy.shaders]
        if attention_decode.SHADER in shaders:
            pytest.skip("few queries run sdpa_decode.glsl on this device (no map)")
        (entry,) = spy.maps
        kernel = shaders[shaders.index(attention_map.SHADER) + 1]
        packed = form == "sdpa_glsl_packed_heads"
        assert kernel == attention.SHADER if packed else kernel in (attention.TILED,
                                                                    attention.COOP)
        assert (entry["rows"], entry["keys"], entry["heads"]) == \
            _blocks(kernel, e, 4 if packed else 1)
        want = _reference_map(mask, lq, s, entry["rows"], entry["keys"], entry["heads"])
        got_map = _device_map(entry, tuple(mask.shape), lq, s)
        live = {key for key, (alive, _) in want.items() if alive}
        assert got_map == {key: (alive, full and alive) for key, (alive, full)
                           in want.items()}
        assert 0 < len(live) < len(want) or form.endswith("broadcast"), len(live)
    finally:
        program.close()


class _Masked(torch.nn.Module):
    def forward(self, q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", ["broadcast", "per_head", "batch_heads"])
def test_block_sparse_bool_masks_exact_and_match_eager(shape, dtype):
    # Odd lengths (not multiples of 32-row blocks or 16 / 32-key tiles), head dims of
    # both tile widths, a dead query block and a dead row.
    lq, s = 141, 203
    b, hq, hk = (2, 4, 2) if shape == "batch_heads" else (1, 4, 2)
    mshape = {"broadcast": (1, 1, lq, s), "per_head": (1, hq, lq, s),
              "batch_heads": (b, hq, lq, s)}[shape]
    tol = FP32_TOL if dtype == torch.float32 else FP16_TOL
    for e, seed in ((32, 5), (128, 6)):
        q, k, v = _qkv(b, hq, hk, lq, s, e, dtype, seed=seed)
        _exact(sdpa_fn(enable_gqa=True), (q, k, v, block_mask(mshape, seed=seed)), tol)


def test_mostly_true_and_all_false_masks_exact():
    # Every tile full (no mask byte read), every tile dead (NaN-free zeros, as ATen).
    q, k, v = _qkv(1, 2, 2, 70, 90, 64, seed=7)
    for mask in (torch.ones(70, 90, dtype=torch.bool),
                 torch.zeros(70, 90, dtype=torch.bool), window_mask(70, 90, 33)):
        _exact(sdpa_fn(), (q, k, v, mask), FP32_TOL)


def test_decode_shaped_and_packed_heads_on_sdpa_glsl_exact():
    # Few queries run sdpa.glsl on CPU drivers (GPUs: sdpa_decode.glsl, no map), with
    # Hq / Hk query heads per workgroup: the map's blocks are (32 / 4 rows, 4 heads).
    q, k, v = _qkv(1, 8, 2, 9, 300, 64, seed=8)
    for mshape in ((1, 8, 9, 300), (1, 1, 9, 300), (9, 300)):
        _exact(sdpa_fn(enable_gqa=True), (q, k, v, block_mask(mshape, seed=8)), FP32_TOL)


def test_head_dim_256_on_sdpa_glsl_exact():
    # Head dim 256 prefill runs sdpa.glsl (8-key tiles) with the map.
    q, k, v = _qkv(1, 2, 2, 40, 75, 256, seed=9)
    _exact(sdpa_fn(), (q, k, v, block_mask((1, 2, 40, 75), seed=9)), FP32_TOL)


def test_custom_sdpa_bool_mask_exact():
    # ExecuTorch's [B, L, H, D] layout (SEQ_FIRST) with a 2-D [L, S] mask over a cache
    # longer than the keys in use (start_pos + L).
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, n, h, 32, generator=g)
               for n, h in ((40, 4), (150, 2), (150, 2)))
    mask = block_mask((40, 150), seed=10)

    def fn(q, k, v, m):
        return torch.ops.llama.custom_sdpa(q, k, v, 60, m, 0.0, False, None)
    _exact(fn, (q, k, v, mask), FP32_TOL, ops=(CUSTOM,))


def test_sliding_window_op_with_bool_mask_exact():
    # vkdelegate.sliding_window_sdpa with a 2-D mask at prefill size: the causal and
    # window bounds narrow the tile range, then the map narrows it further.
    q, k, v = _qkv(1, 4, 2, 100, 130, 32, seed=15)
    mask = block_mask((100, 130), seed=15)
    _exact(sliding_fn(40, 30), (q, k, v, mask), FP32_TOL, ops=(SLIDING,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_resize_smaller_and_larger_exact(dtype):
    # The map is sized for the upper bounds and filled at the current sizes: resized to
    # fewer queries and keys (fewer query blocks and map words), then to the bounds.
    length, keys = Dim("length", min=16, max=200), Dim("keys", min=2, max=260)
    tol = FP32_TOL if dtype == torch.float32 else FP16_TOL

    def inputs(lq, s, seed):
        q, k, v = _qkv(1, 4, 2, lq, s, 64, dtype, seed=seed)
        return q, k, v, block_mask((1, 1, lq, s), seed=seed)
    first = inputs(150, 190, 11)
    resized = [inputs(37, 45, 12), inputs(200, 260, 13), inputs(16, 2, 14)]
    _exact(sdpa_fn(enable_gqa=True), first, tol,
           dynamic_shapes=({2: length}, {2: keys}, {2: keys}, {2: length, 3: keys}),
           resize_inputs=resized)


def test_map_over_the_tensor_limit_is_refused(tmp_path):
    # The map's sizes derive from the blob's (a [1, 1] mask broadcast over 32768
    # queries x 32768 keys of head dim 1: 128 KiB tensors, a 256 KiB map): over the
    # load limit max_tensor_bytes it is refused at load like any tensor, before it is
    # allocated.
    import vkdelegate
    from vkdelegate.errors import ResourceLimitError
    from vkdelegate.limits import LoadLimits

    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    n = 32768
    q, k, v = (torch.zeros(1, 1, n, 1) for _ in range(3))
    mask = torch.ones(1, 1, dtype=torch.bool)
    program = to_backend(torch.export.export(_Masked(), (q, k, v, mask)),
                         VulkanPartitioner({"executor": "vulkan"}))
    path = tmp_path / "attention.vkp"
    program.save(path)
    program.close()
    with _Spy() as spy:
        loaded = vkdelegate.load(path, limits=LoadLimits(max_tensor_bytes=200 << 10))
        with pytest.raises(ResourceLimitError,
                           match=r"scratch tensor int32\[65536\] in bytes is 262,144, "
                                 r"over the load limit max_tensor_bytes=204,800"):
            loaded(q, k, v, mask)
    loaded.close()
    assert not spy.maps
