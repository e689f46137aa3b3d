"""8da4w's activation quantization parameters: vkdelegate.choose_qparams_per_token.default
(backend/custom_ops.py, whose CPU kernel is the definition; made by
backend/passes/quantized_linear.fuse_choose_qparams from torchao's decomposed
choose_qparams_affine).

choose_qparams_per_token(x fp32 [..., K]) -> (scale fp32 [...], zero point int8 [...]):
per row of x, lo = min(amin, 0), hi = max(amax, 0), scale = max((hi - lo) / 255,
FLT_MIN), zp = clamp(-128 - round(lo / scale), -128, 127): the same float operations
as the decomposition's nodes, each division correctly rounded as the CPU's (the
shader's div_rn: GLSL's `/` may be off by a few ulp, and an H100 gave a scale one ulp
off with it), so the same bits (a row holding a NaN: scale NaN, zero point 0, as
eager's cast gives; a row holding -inf: scale inf, -inf / inf is NaN, zero point 0
likewise). One dispatch, choose_qparams.glsl: a workgroup of WG
invocations per row (min / max partials, then a shared-memory tree); before, the
decomposition took about eight dispatches a row (amin, amax, two full_like, minimum,
the chains, the cast). Rows may vary at run time (prefill's T): the grid is sized for
the most, workgroups past the current rows return.
"""
from __future__ import annotations

import math

from vkdelegate.kernels import loop_limit
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "choose_qparams"
NAME = "vkdelegate.choose_qparams_per_token.default"
WG = 64  # invocations per row (a power of two)
#: FLT_MIN, the least scale (backend/custom_ops.QPARAMS_EPS, which the op's definition
#: uses: ops do not import the backend; tests/ops/test_choose_qparams.py compares them).
EPS = 1.1754943508222875e-38
#: x: rows now, y: K; fparams x: 255 (the int8 range), y: eps (FLT_MIN).
PARAMS = ParamBlock("qparams_block", [("info", "ivec4"), ("fparams", "vec4")])


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("scale_data", "zp_data"), inputs=("x_data",),
                    params=(PARAMS,))


def _defines(scale, zp) -> dict:
    d = storage_defines(SCALE=scale, ZP=zp)
    d["WG"] = str(WG)
    return d


def _impl(b, node):
    x_id, out_ids = node.args
    outs = b.value(out_ids)
    if not isinstance(outs, list) or len(outs) != 2:
        raise b.error("choose_qparams_per_token has two outputs")
    x = b.tensor(x_id)
    scale, zp = (b.tensor(o) if isinstance(o, int) else o for o in outs)
    # The loader has checked x, the outputs' dtypes and their sizes against the op's
    # rule and shape_fn (tests/ops/test_choose_qparams.py's crafted blobs).
    k = x.max_shape[-1]
    rows = math.prod(x.max_shape[:-1])
    loop_limit.check(b, -(-k // WG) + int(math.log2(WG)) + 2,
                     f"quantization parameters of rows of {k} values")

    def pack():
        return PARAMS.pack(info=[x.numel // max(x.shape[-1], 1), x.shape[-1]],
                           fparams=[255.0, EPS])
    params = b.params(pack())
    b.on_resize(lambda: params.write(pack()))
    b.dispatch(SHADER, _defines(scale, zp), outputs=[scale, zp], inputs=[x],
               params=[params], global_size=(max(rows, 1) * WG,), local_size=(WG, 1, 1))


def _rule(node: NodeSpec):
    x = node.args[0]
    if x.rank < 1 or x.shape[-1] < 1:
        return f"x of sizes {list(x.shape)} (rows of at least one value expected)"
    if len(node.outputs) != 2 or node.outputs[0].dtype != "float32" or \
            node.outputs[1].dtype != "int8":
        return "outputs other than (float32 scale, int8 zero point)"
    return None


def _shape(args):
    rows = tuple(args[0].shape[:-1])
    return [rows, rows]


register(OpSpec(name=NAME, dtypes=frozenset({"float32", "int8"}), impl=_impl,
                shape_fn=_shape, rules=(_rule,), arg_dtypes={0: frozenset({"float32"})},
                notes="8da4w's per-row asymmetric int8 scale and zero point, bit for bit "
                      "torchao's decomposition; one workgroup a row"))

declare_grid(SHADER, lambda profile: _defines(
    ("float32", "float32"), ("int8", device_dtype("int8", profile))),
    profile=STORAGE_PROFILES)
