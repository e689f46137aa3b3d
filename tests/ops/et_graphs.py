"""Run one node under an ExecuTorch op name in a hand-built VkGraph.

Some ops appear only in ET-VK blobs (view_copy, zeros, split.Tensor, ...): torch.export
never emits them, so check_op cannot reach them. ``run_et_node`` builds the one-node
graph the way ET-VK serializes it (schema order, output last), runs it on Vulkan,
compares every output exactly (or within rtol for floats) with the expected tensors,
and records the run in the registry coverage like check_op does.
"""
from __future__ import annotations

import numpy as np
import torch

from tests.ops import coverage
from tests.runtime.graphs import GraphMaker
from vkdelegate.backend.node_specs import dtype_name
from vkdelegate.serialization import vkgraph as g


def run_et_node(device, name: str, args: list, expected, rtol: float = 0.0,
                atol: float = 0.0) -> None:
    """args: the op's arguments in schema order: tensors become graph inputs, a list of
    tensors a ValueList of inputs, anything else a scalar value (None -> Null).
    expected: the output tensor, or a list of them for a ValueList output. rtol, atol:
    float tolerances (atol only applies with rtol)."""
    gm = GraphMaker()
    arg_ids, inputs, dtypes = [], [], []

    def add_input(t):
        vid = gm.input(tuple(t.shape), dtype_name(t.dtype))
        inputs.append(t.numpy())
        dtypes.append(dtype_name(t.dtype))
        return vid
    for a in args:
        if isinstance(a, torch.Tensor):
            arg_ids.append(add_input(a))
        elif isinstance(a, list) and a and all(isinstance(t, torch.Tensor) for t in a):
            arg_ids.append(gm._add(g.ValueList([add_input(t) for t in a])))
        else:
            arg_ids.append(gm.scalar(a))
    outs = expected if isinstance(expected, list) else [expected]
    out_ids = [gm.tensor(tuple(t.shape), dtype_name(t.dtype)) for t in outs]
    dtypes += [dtype_name(t.dtype) for t in outs]
    out = out_ids[0] if not isinstance(expected, list) else gm._add(g.ValueList(out_ids))
    gm.graph.chain.append(g.OperatorCall(0, name, arg_ids + [out]))
    for o in out_ids:
        gm.output(o)
    graph = gm.build(device)
    try:
        got = graph.execute(inputs)
    finally:
        graph.close()
    for i, (y, ref) in enumerate(zip(got, outs)):
        ref = ref.numpy()
        assert y.dtype == ref.dtype and y.shape == ref.shape, \
            f"{name} output {i}: {y.dtype}{list(y.shape)} != {ref.dtype}{list(ref.shape)}"
        if rtol and ref.dtype.kind == "f":
            np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(y, ref, err_msg=f"{name} output {i}")
    coverage.record(name, tuple(dtypes))
