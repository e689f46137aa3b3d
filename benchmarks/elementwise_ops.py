"""GPU time of the elementwise binary and unary ops, the reductions, softmax and RMS
norm on realistic shapes (EfficientNet-Lite0 activations, its 1280-channel head, a
transformer's hidden size and attention scores, a classifier's logits, the one-token
RMS norm of a Llama-3.2-1B decode step).

Builds a one-node graph per case, runs it a few times with timestamp queries and
prints the best GPU time with the effective bandwidth: bytes of tensor data read and
written (all of these ops are memory-bound: a few flops per element). Correctness is
the op tests' job (tests/ops/test_{binary,add_sub,ternary,unary,reduce,sum,softmax,
norm}.py).
The last column is the process CPU time of one plain execute, the stable measure on a
CPU driver (lavapipe) on a shared machine. Torch-free.

    python benchmarks/elementwise_ops.py [--runs 5] [--device NAME] [--filter softmax]
"""
from __future__ import annotations

from one_node import OneNode, main as run_cases

ACT = (1, 96, 112, 112)  # EfficientNet-Lite0's widest activation (after the expansion)
PER_CHANNEL = (1, 96, 1, 1)  # a bias or squeeze-and-excitation scale: broadcast on H, W
ROW = (1, 1 << 20)  # one long row: a reduction that one workgroup cannot cover alone
ATTENTION = (8, 12, 128, 128)  # batch 8, 12 heads, 128 tokens: BERT-base's scores


def binary(name, op, a, b, out_dtype="float32", *scalars):
    node = OneNode(name).input(a).input(b)
    for s in scalars:
        node.arg(s)
    return node.graph(op, [(ACT, out_dtype)])


def where(name):
    node = OneNode(name).input(ACT, "bool").input(ACT).input(PER_CHANNEL)
    return node.graph("aten.where.self", [(ACT, "float32")])


def unary(name, op, *scalars):
    node = OneNode(name).input(ACT)
    for s in scalars:
        node.arg(s)
    return node.graph(op, [(ACT, "float32")])


def reduction(name, op, shape, out_shape, scalars, out_dtype="float32"):
    node = OneNode(name).input(shape)
    for s in scalars:
        node.arg(s)
    return node.graph(op, [(out_shape, out_dtype)])


def rms_norm(name, rows, n, dtype):
    # ET-VK's et_vk.rms_norm(x, weight, eps) over the last dim, what a Llama decoder's
    # norms lower to (fuse_rms_norm); one row: a decode step's token.
    node = OneNode(name).input((rows, n), dtype).constant((n,), dtype).arg(1e-5)
    return node.graph("et_vk.rms_norm.default", [((rows, n), dtype)])


def softmax(name, op, shape):
    node = OneNode(name).input(shape).arg(-1).arg(False)  # dim, half_to_float
    return node.graph(op, [(shape, "float32")])


CASES = [
    lambda: binary("add bias (broadcast H, W) 96 @112", "aten.add.Tensor", ACT, PER_CHANNEL,
                   "float32", 1),
    lambda: binary("add residual 96 @112", "aten.add.Tensor", ACT, ACT, "float32", 1),
    lambda: binary("mul SE scale (broadcast H, W) 96 @112", "aten.mul.Tensor", ACT,
                   PER_CHANNEL),
    lambda: binary("gt -> bool (broadcast H, W) 96 @112", "aten.gt.Tensor", ACT,
                   PER_CHANNEL, "bool"),
    lambda: where("where (bool, x, broadcast y) 96 @112"),
    lambda: unary("relu 96 @112", "aten.relu.default"),
    lambda: unary("hardtanh 0..6 (relu6) 96 @112", "aten.hardtanh.default", 0.0, 6.0),
    lambda: unary("gelu erf 96 @112", "aten.gelu.default", "none"),
    lambda: unary("gelu tanh 96 @112", "aten.gelu.default", "tanh"),
    lambda: unary("sigmoid 96 @112", "aten.sigmoid.default"),
    lambda: unary("exp 96 @112", "aten.exp.default"),
    lambda: reduction("mean over H, W of 1280 @7", "aten.mean.dim", (1, 1280, 7, 7),
                      (1, 1280, 1, 1), [[2, 3], True, None]),
    lambda: reduction("mean last dim of 64x4096", "aten.mean.dim", (64, 4096), (64,),
                      [[-1], False, None]),
    lambda: reduction("var last dim of 64x4096", "aten.var.correction", (64, 4096), (64,),
                      [[-1], 1, False]),
    lambda: reduction("amax of one 2^20 row", "aten.amax.default", ROW, (1,),
                      [[-1], False]),
    lambda: reduction("argmax of one 2^20 row", "aten.argmax.default", ROW, (1,),
                      [-1, False], "int64"),
    lambda: softmax("softmax last dim 8x12x128x128", "aten._softmax.default", ATTENTION),
    lambda: softmax("log_softmax last dim 8x12x128x128", "aten._log_softmax.default",
                    ATTENTION),
    lambda: softmax("softmax 1x1000 (logits)", "aten._softmax.default", (1, 1000)),
    lambda: rms_norm("rms_norm 1x2048 fp16 (decode)", 1, 2048, "float16"),
    lambda: rms_norm("rms_norm 1x2048 fp32 (decode)", 1, 2048, "float32"),
    lambda: rms_norm("rms_norm 32x2048 fp16 (prefill)", 32, 2048, "float16"),
]


if __name__ == "__main__":
    raise SystemExit(run_cases(CASES, __doc__.split("\n\n")[0], rate_header="bandwidth"))
