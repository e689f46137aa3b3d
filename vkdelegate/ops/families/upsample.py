"""Upsampling: nearest and bilinear, on (N, C, H, W) tensors.

Registered overloads (what F.interpolate exports to):
- aten.upsample_nearest2d.vec(input, output_size?, scale_factors?);
- aten.upsample_bilinear2d.vec(input, output_size?, align_corners, scale_factors?).
The .default overloads (scales as two scalars) never reach the partitioner: the
core-ATen decompositions turn them into index arithmetic. ``_scales`` still reads both
argument styles so that adding them is one line each in ``OPS``.

Semantics are ATen's: "nearest" is the legacy floor(dst * scale) rule (not
nearest-exact); bilinear with align_corners either way; a scale factor given to the op
replaces input/output size in the index arithmetic, as in ATen's kernels; an output
size computed from a scale factor is floor(input * scale). fp32 and fp16 (fp32 math).
Resizable: output sizes follow the input when they come from scale factors.
"""
from __future__ import annotations

from vkdelegate.kernels.plane_grid import plane_grid
from vkdelegate.ops.registry import NodeSpec, OpSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype, storage_defines
from vkdelegate.runtime.param_block import ParamBlock, tensor_meta_block
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid

SHADER = "upsample2d"
DTYPES = frozenset({"float32", "float16"})
UPSAMPLE_PARAMS = ParamBlock("upsample_block", [
    ("inv_scales", "vec4"),  # 1 / scale_h, 1 / scale_w from the export's scales, 0: none
    ("flags", "ivec4")])     # x: align_corners


@shader_bindings(SHADER)
def _bindings(_defines) -> Bindings:
    return Bindings(outputs=("out_data",), inputs=("in_data",),
                    params=(tensor_meta_block("out_meta"), tensor_meta_block("in_meta"),
                            UPSAMPLE_PARAMS))

#: op name -> (mode, position of output_size, of align_corners (None: nearest),
#: of the scale arguments, whether scales are one list (vec) or two scalars)
OPS = {
    "aten.upsample_nearest2d.vec": ("nearest", 1, None, 2, True),
    "aten.upsample_bilinear2d.vec": ("bilinear", 1, 2, 3, True),
}


def _scales(args, pos: int, is_vec: bool) -> list:
    """[scale_h, scale_w] (None where absent) from the op's arguments."""
    if is_vec:
        s = args[pos] if pos < len(args) else None
        return list(s) if s else [None, None]
    return [args[pos] if pos < len(args) else None,
            args[pos + 1] if pos + 1 < len(args) else None]


def output_size(in_hw, size, scales) -> tuple:
    """(OH, OW): ``size`` if given, else floor(input * scale) as ATen computes it."""
    if size:
        return tuple(int(s) for s in size)
    return tuple(int(i * float(s)) for i, s in zip(in_hw, scales))


def _make_shape(size_pos: int, scale_pos: int, is_vec: bool):
    def shape(args):
        x = args[0].shape
        return tuple(x[:2]) + output_size(x[2:], args[size_pos],
                                          _scales(args, scale_pos, is_vec))
    return shape


def _make_rule(size_pos: int, scale_pos: int, is_vec: bool):
    def rule(node: NodeSpec):
        x = node.args[0]
        if x.rank != 4:
            return f"input of rank {x.rank}: needs (N, C, H, W)"
        size, scales = node.args[size_pos], _scales(node.args, scale_pos, is_vec)
        if not size and not all(isinstance(s, (int, float)) and s > 0 for s in scales):
            return f"neither output_size nor two positive scale factors ({scales})"
        if size and (len(size) != 2 or not all(isinstance(s, int) for s in size)):
            return f"output_size {size!r} is not two ints"
        return None
    return rule


def _defines(out, x, mode: str, plane_loop: bool = False) -> dict:
    d = storage_defines(OUT=out, IN=x)
    if plane_loop:
        d["PLANE_LOOP"] = "1"
    d["NEAREST" if mode == "nearest" else "BILINEAR"] = "1"
    return d


def _make_impl(mode: str, size_pos: int, align_pos, scale_pos: int, is_vec: bool):
    def impl(b, node):
        args = [b.value(a) for a in node.args[:-1]]
        x, out = b.tensor(node.args[0]), b.tensor(node.args[-1])
        if x.ndim != 4 or x.dtype != out.dtype:
            raise b.error(f"input {x.dtype} {list(x.max_shape)}, output {out.dtype}")
        scales = _scales(args, scale_pos, is_vec)
        # ATen uses the scale factors in its index arithmetic only when the output
        # size came from them (the .vec overload with output_size given passes none).
        if is_vec and args[size_pos]:
            scales = [None, None]
        inv = [1.0 / float(s) if s and s > 0 else 0.0 for s in scales]
        align = bool(args[align_pos]) if align_pos is not None else False
        params = b.params(UPSAMPLE_PARAMS.pack(inv_scales=inv, flags=[int(align)]))
        grid, local, plane_loop = plane_grid(b, out)
        b.dispatch(SHADER, _defines(out, x, mode, plane_loop), outputs=[out], inputs=[x],
                   params=[out.meta, x.meta, params], global_size=grid, local_size=local)
    return impl


for _name, (_mode, _size, _align, _scale, _vec) in OPS.items():
    register(OpSpec(name=_name, dtypes=DTYPES,
                    impl=_make_impl(_mode, _size, _align, _scale, _vec),
                    shape_fn=_make_shape(_size, _scale, _vec),
                    rules=(_make_rule(_size, _scale, _vec),), max_rank=4,
                    notes=f"{_mode}" + (", align_corners both ways" if _align else "")
                    + ", output size or scale factors"))
def _variant(profile, dtype: str, mode: str, loop: bool) -> dict:
    ddt = (dtype, device_dtype(dtype, profile))
    return _defines(ddt, ddt, mode, loop)


declare_grid(SHADER, _variant, profile=STORAGE_PROFILES, dtype=DTYPES,
             mode=("nearest", "bilinear"), loop=(False, True))
