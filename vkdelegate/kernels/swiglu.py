"""The SwiGLU epilogue of ``vkdelegate.linear_swiglu`` (and of its int4 and int8
weight-only forms ``vkdelegate.linear_q4gsw_swiglu`` and
``vkdelegate.weight_int8pack_mm_swiglu``, ops/families/quantized_linear.py: the same
chains in linear_qw_gemv.glsl's and linear_qw.glsl's epilogues): a merged gate/up
linear's two halves combined as the fused elementwise chain after it combined them.

``linear_swiglu(input [..., K], weight [2F, K], bias [2F]?, steps) -> [..., F]``: with
y = linear(input, weight, bias) rounded to the output's dtype (as the linear's store
rounds it), gate = y[..., :F] and up = y[..., F:], the output is the chain ``steps``
(kernels/elementwise_chain.py's language) over the registers r0 = gate, r1 = up. Made
by backend/passes/fuse_linear_swiglu.py from a merged gate/up linear
(passes/merge_linears: its two ``narrow_last`` parts) and the
``vkdelegate.fused_elementwise`` chain reading them, so ``steps`` is always one of
``CHAINS``: SiLU(gate) * up in the two forms HF models export (float32: ``gate *
sigmoid(gate) * up``; float16: ATen's decomposition computes SiLU in float32 between two
casts). A program file may hold no other text (a load rule and the CPU glue's string
choices, backend/allowed_ops.py, check it), so the shader variants are a finite list
(declared with the GEMV path's and linear.glsl's) and ``vkdelegate build-shaders``
compiles them ahead of time.

The epilogue is the chain's own GLSL (``elementwise_chain.glsl_body``, the text that
fused_elementwise.glsl runs) applied to gate and up rounded to the output dtype
(``round_to_half`` for float16, common.h: the value the linear's fp16 store keeps), so
every float16 rounding of the unfused program happens at the same point: the fused op's
bits are the linear's and the chain's (tests/backend/test_fuse_linear_swiglu.py).

``match(steps, gate_first)`` is the pass's test: the canonical text of ``CHAINS`` that
computes exactly what a fused chain's ``steps`` computes (the same ops, rounding steps
and dtypes, up to the order of a product's operands, which IEEE multiplication does
not see), or None; ``match_roles`` the same for a chain of any number of inputs, each
the gate or the up half (a chain that reads the gate twice: through a view and
directly, as torchao's int8 linears leave it). Torch-free; registers no op.
"""
from __future__ import annotations

from vkdelegate.errors import VkDelegateError
from vkdelegate.kernels import elementwise_chain as chain
from vkdelegate.shaders.variants import flag_defines

#: The float32 form: silu(gate) * up, SiLU decomposed as gate * sigmoid(gate).
SILU = "aten.sigmoid.default(r0);aten.mul.Tensor(r0,r2);aten.mul.Tensor(r3,r1)"
#: The float16 form: SiLU computed in float32 between casts, rounded to float16, * up.
SILU_HALF = ("aten._to_copy.default(r0,'float32');aten.sigmoid.default(r2);"
             "aten.mul.Tensor(r2,r3);aten._to_copy.default(r4,'float16');"
             "aten.mul.Tensor(r5,r1)")
#: Every chain the op accepts (r0: gate, r1: up).
CHAINS = (SILU, SILU_HALF)
#: The chains valid on a graph dtype (the output's, the linear's): the float16 form's
#: casts need float16 gate and up; the float32 form on float16 tensors rounds every step
#: (an fp32 model under force_fp16, as its fused chain would).
CHAINS_FOR = {"float32": (SILU,), "float16": (SILU, SILU_HALF)}


def _tree(steps: list, inputs: tuple, dtypes: list):
    """The expression of a parsed chain's result: nested tuples of (op, dtype, operands),
    a product's operands sorted; inputs named by ``inputs``. None for an op other than
    sigmoid, a product of two tensors or a cast."""
    regs = list(inputs)
    for j, step in enumerate(steps):
        if any(kind != "r" for kind, _ in step.args[:2 if step.op != chain.CAST else 1]):
            return None
        operands = [regs[v] for kind, v in step.args if kind == "r"]
        dtype = dtypes[len(inputs) + j]
        if step.op == "aten.mul.Tensor" and len(operands) == 2:
            regs.append(("mul", dtype, tuple(sorted(operands, key=repr))))
        elif step.op in ("aten.sigmoid.default", chain.CAST) and len(operands) == 1:
            regs.append((step.op, dtype, tuple(operands)))
        else:
            return None
    return regs[-1]


def match(steps: str, scalars, dtype: str, gate_first: bool) -> "str | None":
    """The text of ``CHAINS`` that computes exactly what fused chain ``steps`` (with
    ``scalars``) computes over inputs of ``dtype``, its r0 being the gate (the linear's
    first half) when ``gate_first``, else the up half; None when none does."""
    return match_roles(steps, scalars, dtype,
                       ("gate", "up") if gate_first else ("up", "gate"))


def match_roles(steps: str, scalars, dtype: str, roles) -> "str | None":
    """``match`` for a chain over len(roles) inputs of ``dtype``, input i being the gate
    (the linear's first half) where roles[i] is "gate", the up half where it is "up"."""
    if scalars or dtype not in CHAINS_FOR or set(roles) != {"gate", "up"}:
        return None
    try:
        parsed = chain.parse(steps, len(roles), 0)
        dtypes = chain.register_dtypes(parsed, [dtype] * len(roles))
    except VkDelegateError:
        return None
    names = (("gate", dtype), ("up", dtype))  # CHAINS' r0 and r1
    got = _tree(parsed, tuple(names[r == "up"] for r in roles), dtypes)
    if got is None or dtypes[-1] != dtype:
        return None
    for text in CHAINS_FOR[dtype]:
        canon = chain.parse(text, 2, 0)
        if _tree(canon, names, chain.register_dtypes(canon, [dtype, dtype])) == got:
            return text
    return None


def halves_shape(w_at: int):
    """The shape function of an op whose output is the SwiGLU chain over the halves of
    a merged product with 2F-row weight argument ``w_at``: input[..., :-1] + [F]."""
    return lambda args: tuple(args[0].shape[:-1]) + (args[w_at].shape[0] // 2,)


def node_defines(b, steps_id: int, dtype: str) -> dict:
    """``defines`` of the chain a node passes as value ``steps_id`` (node builder ``b``;
    output graph dtype ``dtype``), a refused chain raised as the node's error."""
    try:
        return defines(b.value(steps_id), dtype)
    except VkDelegateError as exc:
        raise b.error(str(exc)) from None


def halves_rule(w_at: int, steps_at: int, bias_at: "int | None"):
    """A load rule (NodeSpec -> message or None) of an op whose output is a SwiGLU
    chain over the halves of a merged gate/up product: the weight (argument ``w_at``,
    2-D) has an even number of rows 2F (the kernels index its two halves), the bias
    (argument ``bias_at``, if any) is exactly [2F], the output [..., F] of the input
    (argument 0), the steps (argument ``steps_at``) one of the CHAINS for the output's
    dtype. Inputs that are not tensors of the ranks the op takes are left to the op's
    other rules."""
    def rule(node) -> "str | None":
        x, w = node.args[0], node.args[w_at]
        if not all(hasattr(t, "rank") for t in (x, w)) or x.rank < 1 or w.rank != 2:
            return None
        rows = w.shape[0]
        if rows < 2 or rows % 2:
            return f"weight {list(w.shape)}: a merged gate/up weight has an even number " \
                   f"of rows"
        bias = node.args[bias_at] if bias_at is not None else None
        if bias is not None and (not hasattr(bias, "shape") or tuple(bias.shape) != (rows,)):
            return f"bias must be [{rows}] (the merged product's)"
        out = node.outputs[0] if node.outputs else None
        want = tuple(x.shape[:-1]) + (rows // 2,)
        if out is None or tuple(out.shape) != want:
            return f"output must be {list(want)}"
        return check(node.args[steps_at], out.dtype)
    return rule


def check(steps, dtype: str) -> "str | None":
    """Why ``steps`` cannot be a linear_swiglu chain on graph dtype ``dtype`` (a load
    rule), or None."""
    if not isinstance(steps, str) or steps not in CHAINS:
        return "steps must be one of the SwiGLU chains of kernels/swiglu.py"
    if steps not in CHAINS_FOR.get(dtype, ()):
        return f"the SwiGLU chain {steps!r} does not apply to {dtype} tensors"
    return None


def defines(steps: str, dtype: str) -> dict:
    """The defines of the SWIGLU epilogue (gemv.glsl, linear.glsl) for chain ``steps``
    on graph dtype ``dtype``: SWIGLU, SWIGLU_HALF and SWIGLU_ROUND(v) (gate and up
    rounded to float16 before the chain, as the linear's store rounds them), CHAIN_BODY and CHAIN_RESULT (the
    chain's GLSL over r0 = gate, r1 = up, as fused_elementwise.glsl's).
    VkDelegateError for a chain ``check`` refuses."""
    problem = check(steps, dtype)
    if problem:
        raise VkDelegateError(problem)
    parsed = chain.parse(steps, 2, 0)
    dtypes = chain.check_dtypes(parsed, [dtype, dtype], dtype)
    half = dtype == "float16"
    return {**flag_defines(SWIGLU=True, SWIGLU_HALF=half),
            "SWIGLU_ROUND(v)": "round_to_half(v)" if half else "(v)",
            "CHAIN_BODY": chain.glsl_body(parsed, 2, [], dtypes),
            "CHAIN_RESULT": chain.result_register(parsed, 2)}
