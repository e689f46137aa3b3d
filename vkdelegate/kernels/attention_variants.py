"""The shader variants of the fused attention (kernels/attention.py) an op family may
dispatch, declared for ``vkdelegate build-shaders`` and the variant tests.

An op family lists its forms, tuples (mask, causal, window, nan_rows, seq_first[,
start]) with mask None, "bool" or "float" (an additive mask of the query's dtype) and
start the dtype of a start_pos tensor (POS_TENSOR, vkdelegate.sdpa_at; absent or None:
the offset is a parameter), and calls
``declare(forms, dtypes)``: every storage profile, dtype and head-dim bucket of sdpa.glsl (the
early exit on and off, whole and split-K, CPU and GPU head-dim loops, the CPU drivers'
K and V as texel buffers or staged), of
sdpa_decode.glsl (few rows on GPUs: the early exit on and off, whole and split-K,
with and without subgroup arithmetic) and its lanes form (one row: the early exit
on and off, whole and split-K), of
sdpa_tiled.glsl (head dims up to TILED_MAX_D), of sdpa_coopmat.glsl (float16 with
16-bit storage; declared with COOP_REQUIRES, so only devices with cooperative matrices
build it), of sdpa_coopmat_wg.glsl (the forms ``coop2_fits`` lets it take: no mask
tensor, window, [B, L, H, D] layout, start tensor or NaN rows; COOP2_REQUIRES), of sdpa_combine.glsl and, for boolean masks, of sdpa_tile_map.glsl (the
block map the early exit reads, kernels/attention_map.py). Torch-free; registers no op.
"""
from __future__ import annotations

from vkdelegate.kernels import attention as at
from vkdelegate.kernels import attention_decode as dec
from vkdelegate.kernels import attention_map as amap
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype
from vkdelegate.shaders.variants import declare_grid


def _forms(forms, profile, dtype: str):
    """Per form: the tensors' (graph, device) dtype pair, the mask's (None without a
    mask), the form's keyword flags and its mask kind."""
    t = (dtype, device_dtype(dtype, profile))
    for form in forms:
        mask, causal, window, nan_rows, seq_first = form[:5]
        start = form[5] if len(form) > 5 else None
        mdt = {None: None, "bool": "bool", "float": dtype}[mask]
        m = None if mdt is None else (mdt, device_dtype(mdt, profile))
        kw = dict(causal=causal, window=window, nan_rows=nan_rows, seq_first=seq_first)
        if start is not None:
            kw["start"] = (start, device_dtype(start, profile))
        yield t, m, kw, mask


def declare(forms, dtypes) -> None:
    """Declare the variants of ``forms`` (see the module docstring) at the float
    ``dtypes`` (graph dtype names) for the four attention shaders."""
    forms = tuple(forms)

    def whole(profile, dtype: str, cpu: bool, d_max: int) -> list:
        f32 = ("float32", device_dtype("float32", profile))
        return [at.defines(f32 if split else t, t, t, t, m, d_max=d_max, cpu=cpu,
                           skip=skip, split=split, kv_texel=kv_texel, **kw)
                for t, m, kw, _ in _forms(forms, profile, dtype)
                for skip in (True, False) for split in (False, True)
                for kv_texel in ((False, True) if cpu else (False,))]

    def tiled(profile, dtype: str, d_max: int):
        if d_max > at.TILED_MAX_D:
            return None
        return [at.tiled_defines(t, t, t, t, m, d_max=d_max, skip=skip, **kw)
                for t, m, kw, _ in _forms(forms, profile, dtype) for skip in (True, False)]

    def coop(profile, d_max: int):
        if d_max > at.TILED_MAX_D or not profile.storage_16bit:
            return None
        return [at.coop_defines(t, t, t, t, m, d_max=d_max, skip=skip, **kw)
                for t, m, kw, mask in _forms(forms, profile, "float16")
                if mask != "bool" or at.COOP_BOOL_MASK for skip in (True, False)]

    def coop2(profile, d_max: int, threads: int):
        if d_max not in at.COOP2_D or not profile.storage_16bit:
            return None
        return [at.coop2_defines(t, t, t, t, d_max=d_max, skip=skip, threads=threads,
                                 causal=kw["causal"])
                for t, m, kw, _ in _forms(forms, profile, "float16")
                if m is None and not (kw["window"] or kw["seq_first"] or kw["nan_rows"]
                                      or "start" in kw)
                for skip in (True, False)]

    def combine(profile, dtype: str, d_max: int) -> list:
        t = (dtype, device_dtype(dtype, profile))
        return [at.combine_defines(t, d_max, nan, seq_first)
                for nan in (False, True) for seq_first in (False, True)]

    def decode(profile, dtype: str, d_max: int) -> list:
        f32 = ("float32", device_dtype("float32", profile))
        return [dec.defines(f32 if split else t, t, t, t, m, d_max=d_max, skip=skip,
                            subgroup=subgroup, split=split, rows=rows, **kw)
                for t, m, kw, _ in _forms(forms, profile, dtype)
                for skip in (True, False) for split in (False, True)
                for subgroup in (True, False)
                for rows in (1, 2, 4, 8) if rows <= dec.rows_max(d_max)]

    def lanes(profile, dtype: str, d_max: int):
        shape = dec.lanes_shape(d_max, dec.LANES_MAX)
        if shape is None:
            return None
        f32 = ("float32", device_dtype("float32", profile))
        return [dec.lanes_defines(f32 if split else t, t, t, t, m, d_max=d_max, skip=skip,
                                  split=split, lanes=shape[0], max_sg=shape[1], **kw)
                for t, m, kw, _ in _forms(forms, profile, dtype)
                for skip in (True, False) for split in (False, True)]

    def tile_map(profile, seq_first: bool):
        if not any(form[0] == "bool" and form[4] == seq_first for form in forms):
            return None
        return amap.defines(("bool", device_dtype("bool", profile)), seq_first)

    declare_grid(amap.SHADER, tile_map, profile=STORAGE_PROFILES, seq_first=(False, True))
    declare_grid(dec.SHADER, decode, profile=STORAGE_PROFILES, dtype=dtypes,
                 d_max=at.D_BUCKETS)
    declare_grid(dec.LANES_SHADER, lanes, profile=STORAGE_PROFILES, dtype=dtypes,
                 d_max=at.D_BUCKETS)
    declare_grid(at.SHADER, whole, profile=STORAGE_PROFILES, dtype=dtypes,
                 cpu=(True, False), d_max=at.D_BUCKETS)
    declare_grid(at.TILED, tiled, profile=STORAGE_PROFILES, dtype=dtypes,
                 d_max=at.D_BUCKETS)
    declare_grid(at.COOP, coop, requires=at.COOP_REQUIRES, profile=STORAGE_PROFILES,
                 d_max=at.D_BUCKETS)
    declare_grid(at.COOP2, coop2, requires=at.COOP2_REQUIRES, profile=STORAGE_PROFILES,
                 d_max=at.D_BUCKETS, threads=(128, 256))
    declare_grid(at.COMBINE, combine, profile=STORAGE_PROFILES, dtype=dtypes,
                 d_max=at.D_BUCKETS)
