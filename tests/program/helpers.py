"""One helper for end-to-end tests: export, lower, run, compare with eager."""
from __future__ import annotations

import copy

import torch
import torch.utils._pytree as pytree

from vkdelegate import VulkanPartitioner, to_backend


def export(case):
    """(eager module, exported program, (args, kwargs)) for a Case, seeded."""
    torch.manual_seed(0)
    module = case.make().eval()
    args, kwargs = case.inputs()
    dynamic = case.dynamic() if case.dynamic else None
    if dynamic is not None and type(module).__name__ == "Fn":
        dynamic = (dynamic,)  # Fn.forward(*args): the specs sit inside "args"
    ep = torch.export.export(copy.deepcopy(module), args, kwargs, dynamic_shapes=dynamic)
    return module, ep, (args, kwargs)


def assert_same(got, expected, tol: float) -> None:
    """Same nested structure, same dtypes, values within rtol = atol = tol."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    assert got_spec == exp_spec, f"structure {got_spec} != {exp_spec}"
    for g, e in zip(got_leaves, exp_leaves):
        if isinstance(e, torch.Tensor):
            assert isinstance(g, torch.Tensor), f"expected a tensor, got {type(g)}"
            torch.testing.assert_close(g, e.detach(), rtol=tol, atol=tol)
        else:
            assert g == e


def lower_and_compare(case, executor: str, options: dict | None = None):
    """Lower ``case``, run it ``case.calls`` times (and on resized inputs) against
    eager; returns the LoweredProgram."""
    module, ep, (args, kwargs) = export(case)
    program = to_backend(ep, VulkanPartitioner(dict(options or {}, executor=executor)))
    runs = [(args, kwargs)] * case.calls
    if case.resized:
        runs.append(case.resized())
    for a, k in runs:
        expected = module(*a, **k)
        got = program(*a, **k)
        assert_same(got, expected, case.tol)
    return program
