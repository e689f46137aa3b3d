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


def _plain(value):
    """``value`` with namedtuples as (class name, fields dict) and dict subclasses (HF
    ModelOutput, the loaded program's Record) as (class name, dict): a loaded program
    rebuilds them as other classes of the same name and fields."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, {k: _plain(v) for k, v in zip(value._fields, value)})
    if isinstance(value, dict):
        name = getattr(value, "record_name", type(value).__name__)
        plain = {k: _plain(v) for k, v in dict.items(value)}
        return plain if type(value) is dict else (name, plain)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def assert_same(got, expected, tol: float) -> None:
    """Same nested structure, same dtypes, values within rtol = atol = tol."""
    got_leaves, got_spec = pytree.tree_flatten(_plain(got))
    exp_leaves, exp_spec = pytree.tree_flatten(_plain(expected))
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
