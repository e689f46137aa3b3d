"""GPU time of the CNN op families on realistic shapes (EfficientNet-Lite0, ResNet).

Builds a one-node graph per case (constant weights, as after export), runs it a few
times with timestamp queries and prints the best GPU time with the throughput:
GFLOP/s (2 per multiply-add) for convolution and linear algebra, GB/s of tensor bytes
read and written for the memory-bound ops. Correctness is the op tests' job
(tests/ops/test_{convolution,batch_norm,linear,pool,upsample}.py). The last column is
the process CPU time of one plain execute (inputs written, outputs read back
included), the stable measure on a CPU driver on a shared machine. Torch-free.

    python benchmarks/cnn_ops.py [--runs 5] [--device NAME] [--filter conv]
"""
from __future__ import annotations

from one_node import OneNode, main as run_cases


def conv(name, n, cin, cout, hw, k, s, groups=1, transposed=False):
    pad = k // 2
    if transposed:
        oh = (hw - 1) * s - 2 * pad + k
        w_shape = (cin, cout // groups, k, k)
    else:
        oh = (hw + 2 * pad - k) // s + 1
        w_shape = (cout, cin // groups, k, k)
    b = OneNode(name).input((n, cin, hw, hw)).constant(w_shape).constant((cout,))
    b.arg([s, s]).arg([pad, pad]).arg([1, 1]).arg(transposed).arg([0, 0]).arg(groups)
    b.flops = 2 * n * cout * (cin // groups) * k * k * (hw * hw if transposed else oh * oh)
    return b.graph("aten.convolution.default", [((n, cout, oh, oh), "float32")])


def linear(name, m, k, n):
    b = OneNode(name).input((m, k)).constant((n, k)).constant((n,))
    b.flops = 2 * m * k * n
    return b.graph("aten.linear.default", [((m, n), "float32")])


def bmm(name, batch, m, k, n):
    b = OneNode(name).input((batch, m, k)).input((batch, k, n))
    b.flops = 2 * batch * m * k * n
    return b.graph("aten.bmm.default", [((batch, m, n), "float32")])


def max_pool(name, n, c, hw):
    oh = (hw + 2 - 3) // 2 + 1
    b = OneNode(name).input((n, c, hw, hw)).arg([3, 3]).arg([2, 2]).arg([1, 1]).arg([1, 1])
    b.arg(False)
    # moved: input, output and the int64 indices (written, not read back)
    return b.graph("aten.max_pool2d_with_indices.default",
                   [((n, c, oh, oh), "float32"), ((n, c, oh, oh), "int64")],
                   graph_outputs=1)


def avg_pool(name, n, c, hw):
    oh = hw // 2
    b = OneNode(name).input((n, c, hw, hw)).arg([2, 2]).arg([2, 2]).arg([0, 0]).arg(False)
    b.arg(True).arg(None)
    return b.graph("aten.avg_pool2d.default", [((n, c, oh, oh), "float32")])


def batch_norm(name, n, c, hw):
    b = OneNode(name).input((n, c, hw, hw))
    for i in range(4):  # weight, bias, running mean, running variance
        b.constant((c,), positive=i == 3)
    b.arg(0.1).arg(1e-5)
    # save_mean and save_invstd are empty in inference
    return b.graph("aten._native_batch_norm_legit_no_training.default",
                   [((n, c, hw, hw), "float32"), ((0,), "float32"), ((0,), "float32")],
                   graph_outputs=1)


def upsample(name, n, c, hw, mode):
    b = OneNode(name).input((n, c, hw, hw))
    if mode == "nearest":
        b.arg(None).arg([2.0, 2.0])
        op = "aten.upsample_nearest2d.vec"
    else:
        b.arg([2 * hw, 2 * hw]).arg(False).arg(None)
        op = "aten.upsample_bilinear2d.vec"
    return b.graph(op, [((n, c, 2 * hw, 2 * hw), "float32")])


CASES = [
    lambda: conv("conv stem 3->32 k3 s2 @224", 1, 3, 32, 224, 3, 2),
    lambda: conv("conv depthwise 96 k3 s2 @112", 1, 96, 96, 112, 3, 2, groups=96),
    lambda: conv("conv depthwise 144 k5 @56", 1, 144, 144, 56, 5, 1, groups=144),
    lambda: conv("conv pointwise 16->96 @112", 1, 16, 96, 112, 1, 1),
    lambda: conv("conv pointwise 144->24 @56", 1, 144, 24, 56, 1, 1),
    lambda: conv("conv pointwise 1152->192 @7", 1, 1152, 192, 7, 1, 1),
    # The texel-buffer layers of docs/PERF.md (issue 12, 2026-12-05).
    lambda: conv("conv pointwise 24->144 @56", 1, 24, 144, 56, 1, 1),
    lambda: conv("conv pointwise 320->1280 @7", 1, 320, 1280, 7, 1, 1),
    lambda: conv("conv depthwise 32 k3 @112", 1, 32, 32, 112, 3, 1, groups=32),
    lambda: conv("conv depthwise 144 k3 @56", 1, 144, 144, 56, 3, 1, groups=144),
    lambda: conv("conv depthwise 672 k5 @14", 1, 672, 672, 14, 5, 1, groups=672),
    lambda: conv("conv resnet 64->64 k3 @56", 1, 64, 64, 56, 3, 1),
    lambda: conv("conv transposed 64->32 k3 s2 @28", 1, 64, 32, 28, 3, 2, transposed=True),
    lambda: linear("linear 1x1280 -> 1000", 1, 1280, 1000),
    lambda: linear("linear 256x512 -> 256", 256, 512, 256),
    lambda: linear("linear 8x512 -> 512", 8, 512, 512),
    lambda: linear("linear 64x256 -> 1024", 64, 256, 1024),
    lambda: bmm("bmm 8 x 128x64x128", 8, 128, 64, 128),
    lambda: max_pool("max_pool2d k3 s2 64 @112", 1, 64, 112),
    lambda: avg_pool("avg_pool2d k2 64 @112", 1, 64, 112),
    lambda: batch_norm("batch_norm 64 @112", 1, 64, 112),
    lambda: upsample("upsample nearest x2 64 @56", 1, 64, 56, "nearest"),
    lambda: upsample("upsample bilinear x2 64 @56", 1, 64, 56, "bilinear"),
]


if __name__ == "__main__":
    raise SystemExit(run_cases(CASES, __doc__.split("\n\n")[0]))
