"""The op test harness: export one op, lower it, run it on Vulkan, compare with eager.

    from tests.ops.harness import check_op

    def test_add_broadcast():
        torch.manual_seed(0)
        check_op(torch.add, (torch.randn(3, 1, 5), torch.randn(7, 1)),
                 ops=["aten.add.Tensor"])

``check_op`` also records every delegated (op, tensor dtypes) it ran and the shader
variants those ops dispatched into ``tests.ops.coverage``; the registry coverage test
(tests/ops/test_registry_coverage.py) compares that record with the registry.
"""
from __future__ import annotations

import copy
import functools
from typing import Callable, Sequence
from unittest import mock

import pytest
import torch
import torch.utils._pytree as pytree

from tests.ops import coverage
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.serialization import vkgraph as g
from vkdelegate.serialization.blob import read_blob
from vkdelegate.shaders.variants import variant_key


class FnModule(torch.nn.Module):
    """A plain function as a module (torch.export exports modules)."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _tensor_dtypes(graph: g.VkGraph, call: g.OperatorCall) -> tuple[str, ...]:
    """Graph dtypes of the node's tensor arguments in order (ValueLists flattened)."""
    dtypes = []
    for vid in call.args:
        value = graph.values[vid]
        items = [graph.values[i] for i in value.items] \
            if isinstance(value, g.ValueList) else [value]
        dtypes.extend(g.DTYPE_NAMES[v.datatype] for v in items if isinstance(v, g.VkTensor))
    return tuple(dtypes)


def delegated_nodes(program) -> list[tuple[str, tuple[str, ...]]]:
    """(op name, tensor dtypes) of every node in every delegate blob of ``program``."""
    nodes = []
    for method in program.methods.values():
        for delegate in method.delegates:
            graph = read_blob(delegate.blob).graph
            nodes.extend((call.name, _tensor_dtypes(graph, call)) for call in graph.chain)
    return nodes


def spy_dispatches(monkeypatch, record=lambda shader, defines: shader,
                   sizes: bool = False) -> list:
    """A list that collects ``record(shader, defines)`` for every dispatch a node
    builder records from now on (the test's monkeypatch undoes the spy); with
    ``sizes``, ``record(shader, defines, (global_size, local_size))`` (the dispatch's
    keyword arguments: invocations in all, per workgroup)."""
    from vkdelegate.runtime.builder import NodeBuilder

    seen = []
    original = NodeBuilder.dispatch

    def spy(self, shader, defines, *args, **kwargs):
        if sizes:
            seen.append(record(shader, defines, (kwargs.get("global_size"),
                                                 kwargs.get("local_size"))))
        else:
            seen.append(record(shader, defines))
        return original(self, shader, defines, *args, **kwargs)

    monkeypatch.setattr(NodeBuilder, "dispatch", spy)
    return seen


def dispatched_ops(program, *args, method: str = "forward") -> list[str]:
    """The op name of every dispatch of one profiled run of ``method`` on ``args``, in
    order (a node may record several)."""
    program.set_profiling(True)
    try:
        program.run(method, *args)
    finally:
        program.set_profiling(False)
    return [d.op for _, prof in program.last_profiles(method) for d in prof.dispatches]


def _assert_delegated(program, ops: Sequence[str]) -> None:
    chain_ops = {name for name, _ in delegated_nodes(program)}
    left = []
    for name, method in program.methods.items():
        if method.report is not None:
            left.extend(d for d in method.report.cpu_nodes if d.op in ops)
    problems = [f"{op} is not in any delegate's op chain (delegated: "
                f"{sorted(chain_ops)})" for op in ops if op not in chain_ops]
    problems += [f"{d.op} ({d.name}) stayed on the CPU: {'; '.join(d.reasons)}"
                 for d in left]
    if problems:
        reports = "\n".join(str(m.report) for m in program.methods.values())
        raise AssertionError("\n".join(problems) + "\n" + reports)


def assert_matches_eager(got, expected, rtol: float, atol: float, what: str = "") -> None:
    """Same structure; each tensor of the same dtype and shape; floats within rtol/atol
    (NaN where eager has NaN), integers and bools exactly equal. Messages name the
    output by its path in the structure (e.g. ``output [2]`` or ``output ['floor']``)."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    exp_paths, exp_spec = pytree.tree_flatten_with_path(expected)
    assert got_spec == exp_spec, f"{what}output structure {got_spec} != {exp_spec}"
    for out, (path, ref) in zip(got_leaves, exp_paths):
        where = f"{what}output {pytree.keystr(path) or '(the only one)'}"
        if not isinstance(ref, torch.Tensor):
            assert out == ref, f"{where}: {out!r} != {ref!r}"
            continue
        assert isinstance(out, torch.Tensor), f"{where}: expected a tensor, got {type(out)}"
        ref = ref.detach()
        assert out.dtype == ref.dtype, f"{where}: dtype {out.dtype} != {ref.dtype}"
        assert out.shape == ref.shape, f"{where}: shape {tuple(out.shape)} != " \
                                       f"{tuple(ref.shape)}"
        if ref.is_floating_point() or ref.is_complex():
            torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"{where}: {m}")
        else:
            mismatch = (out != ref).nonzero()
            assert mismatch.numel() == 0, (
                f"{where}: {len(mismatch)} of {ref.numel()} elements differ, first at "
                f"{tuple(mismatch[0].tolist())}: {out[tuple(mismatch[0])]!r} != "
                f"{ref[tuple(mismatch[0])]!r}")


def _clone(inputs):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, inputs)


def check_op(fn_or_module, inputs: tuple, *, ops: Sequence[str], rtol: float = 1e-4,
             atol: float = 1e-4, dynamic_shapes=None, resize_inputs=None, kwargs=None,
             options: "dict | None" = None, blocklist=None):
    """Export, lower and run ``fn_or_module`` on Vulkan; compare with eager.

    fn_or_module: an ``nn.Module`` or a plain function of tensors.
    inputs: positional inputs (tensors, or Python values torch.export specializes).
    ops: ATen overload names (e.g. "aten.add.Tensor") that must each be in a delegate's
        op chain, with no node of those ops left on the CPU.
    rtol, atol: tolerance for floating outputs; integer and bool outputs must match
        exactly; every output must have eager's dtype and shape.
    dynamic_shapes: as for ``torch.export.export``; for a plain function, a tuple with
        one entry per positional input.
    resize_inputs: inputs (a tuple) or a list of such tuples, with sizes inside the
        Dim ranges, run after the first call and compared again; then ``inputs`` run
        once more (resizing back to the first sizes).
    kwargs: keyword arguments. For a plain function they are bound into it (constants
        like ``dim=1`` or ``rounding_mode="floor"``); for a module they are passed to
        torch.export and to every call.
    options: compile options for VulkanPartitioner (executor is always "vulkan").
    blocklist: ops VulkanPartitioner must leave to the CPU (``operator_blocklist``), e.g.
        the fused SDPA, to test its decomposed form.
    Returns the LoweredProgram (its delegates closed; calling it again rebuilds them).
    Skips the test when no Vulkan device is available.
    """
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    kwargs = dict(kwargs or {})
    if isinstance(fn_or_module, torch.nn.Module):
        module, call_kwargs = fn_or_module.eval(), kwargs
        dynamic = dynamic_shapes
    else:
        fn = functools.partial(fn_or_module, **kwargs) if kwargs else fn_or_module
        module, call_kwargs = FnModule(fn).eval(), {}
        dynamic = (tuple(dynamic_shapes),) if dynamic_shapes is not None else None
    inputs = tuple(inputs)
    ep = torch.export.export(copy.deepcopy(module), _clone(inputs), _clone(call_kwargs),
                             dynamic_shapes=dynamic)
    program = to_backend(ep, VulkanPartitioner(dict(options or {}, executor="vulkan"),
                                               operator_blocklist=blocklist))
    _assert_delegated(program, list(ops))

    runs = [("", inputs)]
    if resize_inputs is not None:
        resized = resize_inputs if isinstance(resize_inputs, list) else [resize_inputs]
        runs += [(f"resized run {i}: ", tuple(r)) for i, r in enumerate(resized)]
        runs.append(("run after resizing back: ", inputs))

    from vkdelegate.runtime.builder import NodeBuilder

    original_dispatch = NodeBuilder.dispatch

    def recording_dispatch(self, shader, defines, *args, **kw):
        if self.node is not None:
            coverage.record_variant(self.node.name, variant_key(shader, defines))
        return original_dispatch(self, shader, defines, *args, **kw)

    try:
        # Delegates are built at their first call: record what their ops dispatch.
        with mock.patch.object(NodeBuilder, "dispatch", recording_dispatch):
            for what, args in runs:
                with torch.no_grad():
                    expected = module(*_clone(args), **_clone(call_kwargs))
                got = program(*_clone(args), **_clone(call_kwargs))
                assert_matches_eager(got, expected, rtol, atol, what)
    finally:
        program.close()
    for name, dtypes in delegated_nodes(program):
        coverage.record(name, dtypes)
    return program
