"""8da4w's activation quantization parameters: vkdelegate.choose_qparams_per_token.default
(backend/custom_ops.py, whose CPU kernel is the definition; made by
backend/passes/quantized_linear.fuse_choose_qparams from torchao's decomposed
choose_qparams_affine).

choose_qparams_per_token(x fp32 or fp16 [..., K]) -> (scale [...] of x's dtype, zero
point int8 [...]): per row of x, lo = min(amin, 0), hi = max(amax, 0), scale =
max((hi - lo) / 255, eps), zp = clamp(-128 - round(lo / scale), -128, 127), eps the
least normal number of x's dtype (torchao's; FLT_MIN for fp32): the same float
operations as the decomposition's nodes, each rounded to x's dtype as eager rounds
it (fp16: in fp32, then to fp16), each division correctly rounded as the CPU's (the
shader's div_rn: GLSL's `/` may be off by a few ulp, and an H100 gave a scale one ulp
off with it), so the same bits (a row holding a NaN: scale NaN, zero point 0, as
eager's cast gives; a row holding -inf: scale inf, -inf / inf is NaN, zero point 0
likewise). One dispatch, choose_qparams.glsl: a workgroup per row (``workgroup``: WG
invocations and a shared-memory tree on CPU drivers; on GPUs up to GPU_WG, about one
group of 8 values each, reduced by subgroup operations where the device has them);
before, the
decomposition took about eight dispatches a row (amin, amax, two full_like, minimum,
the chains, the cast). Rows may vary at run time (prefill's T): the grid is sized for
the most, workgroups past the current rows return.

On GPUs, where the products of these rows run linear_qw_gemv.glsl's GEMV, the
dispatch also writes the rows quantized with the qparams it found (the shader's QX
form, kernels/quantized_x.py's layout) and publishes them (``NodeBuilder.publish``
under ``quantized_x.key``): a product of these qparams then reads them (QX_IN) instead
of quantizing x again in each of its workgroups (ops/families/quantized_linear.py).
The row is read once: each invocation holds GPI groups of 8 values in registers for
every pass (``layout``).

vkdelegate.rms_norm_choose_qparams.default(x, weight, eps) -> (y, scale, zp): y =
et_vk.rms_norm(x, weight, eps) and the qparams of y (custom_ops.RMS_NORM_CHOOSE_QPARAMS;
made by fuse_choose_qparams where only 8da4w products read the norm): the shader's NORM
form, one dispatch where the norm and the qparams took two; y is the norm's value
within its rounding (the sum of squares in another order than norm.glsl's), and the
qparams are bit for bit those of the y written.
"""
from __future__ import annotations

import math

from vkdelegate.kernels import loop_limit
from vkdelegate.kernels import quantized_x
from vkdelegate.kernels.workgroup import has_subgroup_arithmetic
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, flag_defines

SHADER = "choose_qparams"
NAME = "vkdelegate.choose_qparams_per_token.default"
NORM_NAME = "vkdelegate.rms_norm_choose_qparams.default"
WG = 64  # invocations per row (a power of two) on CPU drivers
#: GPUs: up to this many invocations a row (``workgroup``), with subgroup reductions
#: where the device has subgroup arithmetic. A workgroup of 64 left each invocation's
#: strided loads in series on an H100: 9.8 us for one row of 2048 (choose_qparams)
#: and 14.8 us with the norm (two passes), 2026-12-07.
GPU_WG = 1024
#: The least scale per x dtype: its least normal number (backend/custom_ops.QPARAMS_EPS,
#: which the op's definition uses: ops do not import the backend;
#: tests/ops/test_choose_qparams.py compares them).
EPS = {"float32": 1.1754943508222875e-38, "float16": 6.103515625e-05}
DTYPES = frozenset(EPS)
#: x: rows now, y: K, z: QX's words a row; fparams x: 255 (the int8 range), y: eps
#: (EPS[x's dtype]), z: NORM's eps.
PARAMS = ParamBlock("qparams_block", [("info", "ivec4"), ("fparams", "vec4")])


@shader_bindings(SHADER)
def _bindings(defines) -> Bindings:
    qx = ("qx_data",) if "QX" in defines else ()
    if "NORM" in defines:
        return Bindings(outputs=("y_data", "scale_data", "zp_data") + qx,
                        inputs=("x_data", "w_data"), params=(PARAMS,))
    return Bindings(outputs=("scale_data", "zp_data") + qx, inputs=("x_data",),
                    params=(PARAMS,))


#: At most this many groups of 8 values an invocation holds (GPI; a power of two).
MAX_GPI = 32


def _limit(info) -> int:
    """The most invocations of a row's workgroup on device ``info``: GPU_WG, or the
    device's limit where lower."""
    return min(GPU_WG, info.max_workgroup_size[0], info.max_workgroup_invocations)


def workgroup(info, k: int) -> int:
    """Invocations per row of k values on device ``info``: WG on CPU drivers (their
    barriers cost more than the parallel loads save); on GPUs a power of two from WG
    with about one group of 8 values each, at most GPU_WG and the device's limit."""
    if info.type == "cpu":
        return WG
    limit = _limit(info)
    wg = WG
    while 2 * wg <= limit and 16 * wg <= k:
        wg *= 2
    return wg


def layout(b, k: int) -> tuple:
    """(invocations, GPI) of a row of k values on b's device: ``workgroup``'s
    invocations, each holding GPI groups of 8 values (enough for QX's groups, 4 per
    32 values, rounded up to a power of two); where that would be over MAX_GPI, more
    invocations (up to GPU_WG and the device's limit). DeviceLimitError (b.error) for
    rows longer still (past 8 * MAX_GPI * GPU_WG = 262144 values)."""
    info = b.device.info
    wg = workgroup(info, k)
    groups = quantized_x.words(k) // 2
    while -(-groups // wg) > MAX_GPI and 2 * wg <= _limit(info):
        wg *= 2
    per = -(-groups // wg)
    if per > MAX_GPI:
        raise b.error(f"rows of {k} values: more than {MAX_GPI * 8 * wg} (the values "
                      f"one workgroup of this device holds)", limit=True)
    return wg, 1 << (per - 1).bit_length()


def _defines(x, scale, zp, y=None, w=None, wg: int = WG, subgroup: bool = False,
             qx: bool = False, gpi: int = 1) -> dict:
    """Defines of choose_qparams.glsl; y and w (the normalized row and the norm weight):
    its NORM form; wg: invocations a row; subgroup: the SUBGROUP reductions; qx: the
    QX form (the quantized rows written too); gpi: groups of 8 values an invocation
    holds (``layout``)."""
    d = storage_defines(X=x, SCALE=scale, ZP=zp, **(dict(Y=y, W=w) if y is not None else {}))
    d.update(WG=str(wg), GPI=str(gpi))
    d.update(flag_defines(F16=(x.dtype if hasattr(x, "dtype") else x[0]) == "float16",
                          NORM=y is not None, SUBGROUP=subgroup, QX=qx))
    return d


def _record(b, x, outs: list, w=None, eps: float = 0.0) -> None:
    """One workgroup per row of x: outs = [scale, zp], or with the norm weight w
    (rms_norm_choose_qparams) [y, scale, zp]."""
    # The loader has checked x, the outputs' dtypes and their sizes against the op's
    # rule and shape_fn (tests/ops/test_choose_qparams.py's crafted blobs).
    k = x.max_shape[-1]
    rows = math.prod(x.max_shape[:-1])
    wg, gpi = layout(b, k)
    subgroup = wg > WG and has_subgroup_arithmetic(b.device.info)
    key = quantized_x.key(outs[-2], outs[-1])
    qx = None
    if key is not None and quantized_x.publishes(b.device.info, rows, k):
        qx = b.temporary([max(rows, 1), quantized_x.words(k)], "int32")
    # The loops: three passes over the values held, the reductions (a tree of
    # log2(wg) steps, or the slots' fold).
    loop_limit.check(b, 3 * 8 * gpi + 2 * (wg // 32 + int(math.log2(wg))) + 64,
                     f"quantization parameters of rows of {k} values")
    words = quantized_x.words(k) if qx is not None else 0

    def pack():
        return PARAMS.pack(info=[x.numel // max(x.shape[-1], 1), x.shape[-1], words],
                           fparams=[255.0, EPS[x.dtype], eps])
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    y = outs[0] if w is not None else None
    b.dispatch(SHADER, _defines(x, outs[-2], outs[-1], y, w, wg, subgroup, qx is not None,
                                gpi),
               outputs=list(outs) + ([qx] if qx is not None else []),
               inputs=[x] + ([w] if w is not None else []),
               params=[params], global_size=(max(rows, 1) * wg,), local_size=(wg, 1, 1))
    if qx is not None:
        b.publish(key, qx)


def _outputs(b, out_ids, count: int, what: str) -> list:
    outs = b.value(out_ids)
    if not isinstance(outs, list) or len(outs) != count:
        raise b.error(f"{what} has {count} outputs")
    return [b.tensor(o) if isinstance(o, int) else o for o in outs]


def _impl(b, node):
    x_id, out_ids = node.args
    _record(b, b.tensor(x_id), _outputs(b, out_ids, 2, "choose_qparams_per_token"))


def _norm_impl(b, node):
    x_id, w_id, eps_id, out_ids = node.args
    _record(b, b.tensor(x_id), _outputs(b, out_ids, 3, "rms_norm_choose_qparams"),
            b.tensor(w_id), float(b.scalar(eps_id)))


def _rule(node: NodeSpec):
    x = node.args[0]
    if x.rank < 1 or x.shape[-1] < 1:
        return f"x of sizes {list(x.shape)} (rows of at least one value expected)"
    qparams = node.outputs[-2:]
    if len(qparams) != 2 or qparams[0].dtype != x.dtype or qparams[1].dtype != "int8":
        return f"outputs other than ({x.dtype} scale, int8 zero point)"
    return None


def _norm_rule(node: NodeSpec):
    x, w = node.args[:2]
    if len(node.outputs) != 3 or node.outputs[0].dtype != x.dtype:
        return f"outputs other than ({x.dtype} y, scale, zero point)"
    if w.rank != 1 or x.rank < 1 or w.shape[0] != x.shape[-1] or w.dtype != x.dtype:
        return (f"norm weight {list(w.shape)} {w.dtype} for x {list(x.shape)} {x.dtype}: "
                f"[K] of x's dtype expected")
    if x.dynamic and x.dynamic[-1]:
        return "x with a dynamic last dim"
    return None


def _shape(args):
    rows = tuple(args[0].shape[:-1])
    return [rows, rows]


def _norm_shape(args):
    return [tuple(args[0].shape)] + _shape(args)


register(OpSpec(name=NAME, dtypes=DTYPES | {"int8"}, impl=_impl,
                shape_fn=_shape, rules=(_rule,), arg_dtypes={0: DTYPES},
                notes="8da4w's per-row asymmetric int8 scale and zero point, bit for bit "
                      "torchao's decomposition; one workgroup a row; on GPUs, for rows "
                      "of a GEMV, also the rows quantized, which the products read"))
register(OpSpec(name=NORM_NAME, dtypes=DTYPES | {"int8"}, impl=_norm_impl,
                shape_fn=_norm_shape, rules=(_rule, _norm_rule),
                arg_dtypes={0: DTYPES, 1: DTYPES},
                notes="et_vk.rms_norm and choose_qparams_per_token of its output in one "
                      "dispatch (a workgroup a row: the sum of squares, then the "
                      "normalized row and its min / max); the qparams bit for bit those "
                      "of the y written; on GPUs, for rows of a GEMV, also y quantized, "
                      "which the products read"))


def _grid(profile, dtype, norm, wg, subgroup, qx, gpi):
    if subgroup and wg == WG:
        return None  # the CPU drivers' form: a tree
    pair = (dtype, device_dtype(dtype, profile))
    return _defines(pair, pair, ("int8", device_dtype("int8", profile)),
                    pair if norm else None, pair if norm else None, wg, subgroup, qx, gpi)


declare_grid(SHADER, _grid, profile=STORAGE_PROFILES, dtype=sorted(DTYPES),
             norm=(False, True), wg=tuple(WG << i for i in range(5)),
             subgroup=(False, True), qx=(False, True),
             gpi=tuple(1 << i for i in range(MAX_GPI.bit_length())))
