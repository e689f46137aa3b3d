"""``vkdelegate.fused_elementwise``: a chain of float elementwise ops in one dispatch.

Schema (backend/custom_ops.py): ``fused_elementwise(Tensor[] inputs, str steps,
float[] scalars) -> Tensor``, written by backend/passes/fuse_elementwise.py. ``inputs``:
1 to 3 float32 or float16 tensors (dtypes may differ: casts inside the chain join
them), broadcasting against each other as ATen's binary ops do; ``steps``: the chain
text of kernels/elementwise_chain.py (parsed and checked here again at load: a program
file can only compose the registered ops' expressions); the output has the last
step's dtype and the inputs' broadcast shape. The dtypes are those the program file
gives its input and output tensors and its casts' named dtypes: at load, every
register is typed from them (``chain.check_dtypes``) and a node whose tensors disagree
with its chain (an op on two dtypes, a cast to its operand's own dtype, an output
tensor of another dtype than the last step's) is refused with a VkDelegateError
before any shader is compiled. One shader, fused_elementwise.glsl, through the
broadcast plan of the binary ops.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import elementwise_chain as chain
from vkdelegate.kernels.elementwise_chain import chain_defines
from vkdelegate.kernels.broadcast import PLAN_PARAMS, broadcast_shape, plan_dispatch
from vkdelegate.ops.registry import NodeSpec, OpSpec, TensorSpec, register
from vkdelegate.runtime.dtypes import STORAGE_PROFILES, device_dtype
from vkdelegate.shaders.bindings import Bindings, shader_bindings
from vkdelegate.shaders.variants import declare_grid, declare_open

NAME = "vkdelegate.fused_elementwise.default"
SHADER = chain.SHADER
FLOATS = frozenset(chain.DTYPES)


@shader_bindings(SHADER)
def _bindings(d) -> Bindings:
    n = int(d["NUM_INPUTS"])
    return Bindings(outputs=("out_data",), inputs=tuple(f"in{k}_data" for k in range(n)),
                    params=(PLAN_PARAMS,))


def _shape(args):
    shape = ()
    for t in args[0]:
        shape = broadcast_shape(shape, tuple(t.shape))
    return shape


def _parse(inputs, steps, scalars):
    """(parsed steps, scalars as floats); VkDelegateError for a malformed chain."""
    if not isinstance(scalars, (list, tuple)):
        raise VkDelegateError("fused elementwise chain: scalars is not a list")
    values = chain.scalar_values(scalars)
    return chain.parse(steps, len(inputs), len(values)), values


def _rule(node: NodeSpec):
    inputs, steps, scalars = node.args[:3]
    if not isinstance(inputs, (list, tuple)) or \
            not all(isinstance(t, TensorSpec) for t in inputs):
        return "inputs is not a list of tensors"
    try:
        parsed, _ = _parse(inputs, steps, scalars)
        chain.check_dtypes(parsed, [t.dtype for t in inputs], node.outputs[0].dtype)
    except VkDelegateError as exc:
        return str(exc)
    return None


def _impl(b, node):
    inputs_id, steps_id, scalars_id, out_id = node.args
    inputs, out = b.value(inputs_id), b.tensor(out_id)
    if not isinstance(inputs, list) or not all(hasattr(t, "buffer") for t in inputs):
        raise b.error("fused_elementwise expects a list of tensors")
    try:
        steps, scalars = _parse(inputs, b.value(steps_id), b.value(scalars_id))
        defines = chain_defines(out, inputs, steps, scalars)
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None
    plan_dispatch(b, SHADER, defines, out, inputs)


register(OpSpec(name=NAME, dtypes=FLOATS, impl=_impl, shape_fn=_shape, rules=(_rule,),
                notes="fused chains of float unary/binary ops and float32/float16 casts "
                      "(passes/fuse_elementwise)"))


def _example(profile, dtype: str, n: int) -> dict:
    """A representative variant (SiLU times n-1 more inputs): chains are compiled on
    demand, since their bodies are the graph's; this one lets build-shaders and the
    coverage tests compile the shader."""
    pair = (dtype, device_dtype(dtype, profile))
    text = "aten.sigmoid.default(r0);" + ";".join(
        f"aten.mul.Tensor(r{n + k},r{k})" for k in range(n))
    steps = chain.parse(text, n, 0)
    return chain_defines(pair, [pair] * n, steps, [])


def _example_cast(profile, out: str) -> dict:
    """A mixed-dtype variant: a float16 SwiGLU gate (float16 gate and up, SiLU in
    float32, rounded back to float16, times up), or with ``out`` float32 its float32
    result (SiLU of float(gate), times float(up))."""
    half = ("float16", device_dtype("float16", profile))
    if out == "float16":
        text = ("aten._to_copy.default(r0,'float32');aten.sigmoid.default(r2);"
                "aten.mul.Tensor(r2,r3);aten._to_copy.default(r4,'float16');"
                "aten.mul.Tensor(r5,r1)")
    else:
        text = ("aten._to_copy.default(r0,'float32');aten._to_copy.default(r1,'float32');"
                "aten.sigmoid.default(r2);aten.mul.Tensor(r2,r4);aten.mul.Tensor(r5,r3)")
    steps = chain.parse(text, 2, 0)
    return chain_defines((out, device_dtype(out, profile)), [half, half], steps, [])


declare_open(SHADER, "the chain's steps are the graph's ops")
declare_grid(SHADER, _example, profile=STORAGE_PROFILES, dtype=sorted(FLOATS),
             n=range(1, chain.MAX_INPUTS + 1))
declare_grid(SHADER, _example_cast, profile=STORAGE_PROFILES, out=sorted(FLOATS))
