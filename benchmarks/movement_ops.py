"""GPU time of the data-movement ops on realistic shapes (EfficientNet-Lite0, ResNet,
a small language model's embedding).

Builds a one-node graph per case, runs it a few times with timestamp queries and
prints the best GPU time with the effective bandwidth: bytes of tensor data read and
written (the memory-bound measure for copies). Correctness is the op tests' job
(tests/ops/test_{movement,concat,pad,indexing,creation,copy}.py). The last column is
the process CPU time of one plain execute, the stable measure on a CPU driver
(lavapipe) on a shared machine. Torch-free.

    python benchmarks/movement_ops.py [--runs 5] [--device NAME] [--filter pad]
"""
from __future__ import annotations

from one_node import OneNode, main as run_cases


def _one(name, op, shape, args, out_shapes, dtype="float32"):
    c = OneNode(name).input(shape)
    for a in args:
        c.arg(a)
    return c.graph(op, [(s, dtype) for s in out_shapes])


def _cat():
    c = OneNode("cat 2 x 64 channels @56")
    c.inputs_list([(1, 64, 56, 56), (1, 64, 56, 56)]).arg(1)
    return c.graph("aten.cat.default", [((1, 128, 56, 56), "float32")])


def _embedding():
    c = OneNode("embedding 32000x512 (constant), 128 tokens")
    c.constant((32000, 512))
    c.input((1, 128), "int64", high=32000)
    c.arg(-1).arg(False).arg(False)
    c.moved += 128 * 512 * 4  # the picked rows are read
    return c.graph("aten.embedding.default", [((1, 128, 512), "float32")])


def _gather():
    c = OneNode("gather dim 1 of 64x1000, 64x5")
    c.input((64, 1000))
    c.arg(1)
    c.input((64, 5), "int64", high=1000)
    c.arg(False)
    c.moved -= 64 * 1000 * 4 - 64 * 5 * 4  # only the gathered elements are read
    return c.graph("aten.gather.default", [((64, 5), "float32")])


CASES = [
    lambda: _one("constant_pad_nd SAME 32 @112", "aten.constant_pad_nd.default",
                 (1, 32, 112, 112), [[0, 1, 0, 1], 0.0], [(1, 32, 113, 113)]),
    lambda: _one("permute NCHW->NHWC 96 @56", "aten.permute.default", (1, 96, 56, 56),
                 [[0, 2, 3, 1]], [(1, 56, 56, 96)]),
    lambda: _one("view (flat copy) 144 @56", "aten.view.default", (1, 144, 56, 56),
                 [[1, 144, 3136]], [(1, 144, 3136)]),
    lambda: _one("expand SE scale 1x1 -> 56x56 x144", "aten.expand.default",
                 (1, 144, 1, 1), [[1, 144, 56, 56], False], [(1, 144, 56, 56)]),
    lambda: _one("slice step 2 of 64 @112", "aten.slice.Tensor", (1, 64, 112, 112),
                 [3, 0, 112, 2], [(1, 64, 112, 56)]),
    lambda: _one("_to_copy fp32->fp16 64 @112", "aten._to_copy.default", (1, 64, 112, 112),
                 [None, None, None, None, False, None], [(1, 64, 112, 112)], "float16"),
    _cat,
    lambda: _one("split_with_sizes 128 -> 2 x 64 @56", "aten.split_with_sizes.default",
                 (1, 128, 56, 56), [[64, 64], 1], [(1, 64, 56, 56)] * 2),
    _embedding,
    _gather,
]


if __name__ == "__main__":
    raise SystemExit(run_cases(CASES, __doc__.split("\n\n")[0], rate_header="bandwidth"))
