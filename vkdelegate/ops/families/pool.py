"""2-D pooling: max (with indices), average, adaptive average and adaptive max.

Registered overloads (what export produces after the core-ATen decompositions):
- aten.max_pool2d_with_indices.default(self, kernel_size, stride=[], padding=0,
  dilation=1, ceil_mode=False) -> (out, indices int64)
- aten.avg_pool2d.default(self, kernel_size, stride=[], padding=0, ceil_mode=False,
  count_include_pad=True, divisor_override=None)
- aten._adaptive_avg_pool2d.default(self, output_size)
- aten.adaptive_max_pool2d.default(self, output_size) -> (out, indices int64)

Inputs are (C, H, W) or (N, C, H, W), fp32 or fp16; one shader (pool2d.glsl) follows
ATen's CPU kernels window for window: output sizes with ceil_mode, padded windows,
count_include_pad and divisor_override for averages, NaN propagation and ATen's index
choice for maxima (indices are flat h * W + w within each plane, int64 in the graph,
int32 on the device). Resizable in every dim.
"""
from __future__ import annotations

from vkdelegate.kernels import loop_limit
from vkdelegate.kernels.plane_grid import plane_grid
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "pool2d"
FLOATS = frozenset({"float32", "float16"})
MAX_POOL = "aten.max_pool2d_with_indices.default"
AVG_POOL = "aten.avg_pool2d.default"
ADAPTIVE_AVG = "aten._adaptive_avg_pool2d.default"
ADAPTIVE_MAX = "aten.adaptive_max_pool2d.default"


def _pair(values, default=None) -> list[int]:
    values = list(values) if values else list(default or [])
    return values * 2 if len(values) == 1 else values


def pooling_output_size(size: int, k: int, pad: int, stride: int, dilation: int,
                        ceil_mode: bool) -> int:
    """ATen's pooling_output_shape: the last window must start inside input + left pad."""
    num = size + 2 * pad - dilation * (k - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = num // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _window(args, with_dilation: bool):
    k = _pair(args[1])
    s = _pair(args[2], k)
    p = _pair(args[3], [0])
    d = _pair(args[4], [1]) if with_dilation else [1, 1]
    return k, s, p, d


def _pooled_shape(shape, k, s, p, d, ceil_mode) -> tuple:
    return tuple(shape[:-2]) + tuple(
        pooling_output_size(shape[-2 + i], k[i], p[i], s[i], d[i], ceil_mode)
        for i in range(2))


def _max_shape(args):
    k, s, p, d = _window(args, True)
    out = _pooled_shape(args[0].shape, k, s, p, d, bool(args[5]))
    return [out, out]


def _avg_shape(args):
    k, s, p, d = _window(args, False)
    return _pooled_shape(args[0].shape, k, s, p, d, bool(args[4]))


def _adaptive_shape(args):
    return tuple(args[0].shape[:-2]) + tuple(args[1])


def _adaptive_max_shape(args):
    out = _adaptive_shape(args)
    return [out, out]


# ---- partition-time rules -----------------------------------------------------------
def _rank(node: NodeSpec):
    x = node.args[0]
    return None if x.rank in (3, 4) else f"input of rank {x.rank}: needs (N,) C, H, W"


def _window_rule(node: NodeSpec):
    for i, name in ((1, "kernel_size"), (2, "stride"), (3, "padding")):
        v = node.args[i]
        if not isinstance(v, list) or len(v) > 2 or not all(isinstance(x, int) for x in v):
            return f"{name} {v!r} is not a list of at most 2 ints"
    return None


def _window_values(with_dilation: bool):
    """ATen's pooling checks (sizes >= 1, padding at most half the kernel size)
    and the shader's int32 window arithmetic: a crafted blob's window values must not
    reach the uniforms unchecked."""
    def rule(node: NodeSpec):
        if _rank(node) or _window_rule(node):
            return None  # reported by those rules
        dil = node.args[4] if with_dilation else [1]
        if not isinstance(dil, list) or len(dil) > 2 or \
                not all(isinstance(v, int) for v in dil):
            return f"dilation {dil!r} is not a list of at most 2 ints"
        if not node.args[1]:
            return "empty kernel_size"
        k, s, p, d = _window([None] + list(node.args[1:5]), with_dilation)
        size = node.args[0].shape[-2:]
        for i in range(2):
            if min(k[i], s[i], d[i]) < 1 or p[i] < 0:
                return "kernel_size, stride and dilation must be >= 1 and padding >= 0"
            extent = (k[i] - 1) * d[i] + 1
            if p[i] > k[i] // 2:
                return f"padding {p[i]} is more than half the kernel size {k[i]}"
            if size[i] + 2 * p[i] + extent + s[i] > (1 << 31) - 1:
                return (f"kernel {k[i]}, stride {s[i]}, padding {p[i]} and dilation "
                        f"{d[i]} exceed the shader's int32 index range")
        return None
    return rule


def _divisor_rule(node: NodeSpec):
    v = node.args[6]
    if v is not None and (not isinstance(v, int) or v == 0):
        return f"divisor_override {v!r} is not a non-zero int"
    return None


def _output_size_rule(node: NodeSpec):
    v = node.args[1]
    if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) for x in v):
        return f"output_size {v!r} is not a list of 2 ints"
    return None


# ---- runtime ------------------------------------------------------------------------
#: The most taps of a window that pool2d.glsl's STATIC_WINDOW form unrolls.
STATIC_TAPS = 64


def _defines(out, x, kind: str, plane_loop: bool = False,
             long_window: bool = False, static: bool = False) -> dict:
    is_max = kind in ("max", "adaptive_max")
    d = dict(storage_defines(OUT=out, IN=x),
             **flag_defines(PLANE_LOOP=plane_loop, LONG_WINDOW=long_window, MAX_POOL=is_max,
                            AVG_POOL=not is_max, ADAPTIVE=kind.startswith("adaptive"),
                            STATIC_WINDOW=static))
    if is_max:
        d["IDX_T"] = "int"  # int64 indices are int32 on the device
    return d


POOL_PARAMS = ParamBlock("pool_block", [
    ("kernel_stride", "ivec4"),  # kernel h, kernel w, stride h, stride w
    ("pad_dilation", "ivec4"),   # padding h, padding w, dilation h, dilation w
    ("avg", "ivec4")])           # count_include_pad, divisor_override (0: none)


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    # Max pools also write the argmax indices.
    return Bindings(outputs=("out_data",) + (("idx_data",) if "MAX_POOL" in d else ()),
                    inputs=("in_data",),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            POOL_PARAMS))


def _dispatch(b, kind, x, out, idx, k=(1, 1), s=(1, 1), p=(0, 0), d=(1, 1),
              count_include_pad=True, divisor=0):
    if x.dtype != out.dtype or x.ndim not in (3, 4):
        raise b.error(f"input {x.dtype} {list(x.max_shape)}, output {out.dtype}")
    params = b.params(POOL_PARAMS.pack(kernel_stride=[k[0], k[1], s[0], s[1]],
                                       pad_dilation=[p[0], p[1], d[0], d[1]],
                                       avg=[int(bool(count_include_pad)), divisor or 0]))
    outputs = [out] + ([idx] if idx is not None else [])
    grid, local, plane_loop = plane_grid(b, out)
    # Loop iterations per output (pool2d.glsl): rows x columns for a plain window,
    # rows x (columns / 16 + up to 15 + 2) for the LONG_WINDOW form, which only windows
    # beyond the plain form's budget use (it costs small windows 3x on llvmpipe).
    # Adaptive windows span up to ceil(in / out) + 1 elements.
    if kind.startswith("adaptive"):
        rows, cols = (-(-i // max(o, 1)) + 1 for i, o in zip(x.max_shape[-2:],
                                                               out.max_shape[-2:]))
    else:
        rows, cols = k
    passes = 2 if plane_loop else 1
    long_window = loop_limit.over_budget(rows * (cols + 2) * passes)
    if long_window:
        loop_limit.check(b, rows * (cols // 16 + 17) * passes,
                         f"a pooling window of {rows} x {cols}")
    # Small fixed windows: the geometry as specialization constants, every tap unrolled
    # (conv_window.h's order: kernel, stride, padding, dilation, then 2 spatial dims).
    static = not kind.startswith("adaptive") and k[0] * k[1] <= STATIC_TAPS
    b.dispatch(SHADER, _defines(out, x, kind, plane_loop, long_window and not static,
                                static),
               outputs=outputs, inputs=[x], params=[out.meta, x.meta, params],
               global_size=grid, local_size=local,
               spec_constants=(*k, *s, *p, *d, 2) if static else ())


def _max_impl(b, node):
    x = b.tensor(node.args[0])
    args = [None] + [b.value(a) for a in node.args[1:5]]
    k, s, p, d = _window(args, True)
    out, idx = b.value(node.args[-1])
    _dispatch(b, "max", x, out, idx, k, s, p, d)


def _avg_impl(b, node):
    x = b.tensor(node.args[0])
    args = [None] + [b.value(a) for a in node.args[1:4]]
    k, s, p, _ = _window(args, False)
    include, divisor = b.scalar(node.args[5]), b.scalar(node.args[6])
    _dispatch(b, "avg", x, b.tensor(node.args[-1]), None, k, s, p,
              count_include_pad=include, divisor=divisor)


def _adaptive_avg_impl(b, node):
    _dispatch(b, "adaptive_avg", b.tensor(node.args[0]), b.tensor(node.args[-1]), None)


def _adaptive_max_impl(b, node):
    out, idx = b.value(node.args[-1])
    _dispatch(b, "adaptive_max", b.tensor(node.args[0]), out, idx)


_WITH_INDICES = dict(dtypes=FLOATS | {"int64"}, arg_dtypes={0: FLOATS})
register(OpSpec(name=MAX_POOL, impl=_max_impl, shape_fn=_max_shape,
                rules=(_rank, _window_rule, _window_values(True)), max_rank=4,
                **_WITH_INDICES,
                notes="dilation, ceil_mode, NaN propagation, int64 indices"))
register(OpSpec(name=AVG_POOL, dtypes=FLOATS, impl=_avg_impl, shape_fn=_avg_shape,
                rules=(_rank, _window_rule, _window_values(False), _divisor_rule),
                max_rank=4,
                notes="ceil_mode, count_include_pad, divisor_override"))
register(OpSpec(name=ADAPTIVE_AVG, dtypes=FLOATS, impl=_adaptive_avg_impl,
                shape_fn=_adaptive_shape, rules=(_rank, _output_size_rule), max_rank=4,
                notes="ATen's floor/ceil windows"))
register(OpSpec(name=ADAPTIVE_MAX, impl=_adaptive_max_impl, shape_fn=_adaptive_max_shape,
                rules=(_rank, _output_size_rule), max_rank=4, **_WITH_INDICES,
                notes="ATen's floor/ceil windows, int64 indices"))
def _variant(profile, dtype: str, kind: str, loop: bool, long: bool, static: bool):
    if static and (long or kind.startswith("adaptive")):
        return None
    ddt = (dtype, device_dtype(dtype, profile))
    return _defines(ddt, ddt, kind, loop, long, static)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=FLOATS,
             kind=("max", "avg", "adaptive_avg", "adaptive_max"), loop=(False, True),
             long=(False, True), static=(False, True))
