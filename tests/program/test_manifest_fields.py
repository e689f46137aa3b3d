"""Crafted manifests: a field deleted or of the wrong type (the CRC still matching)
gives VkDelegateError at load or at the call, never a raw KeyError/TypeError."""
import functools
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from vkdelegate.serialization import program_file

from . import crafted


class Mixed(torch.nn.Module):
    """CPU glue (sort: getitem, kwargs), a delegate, a state and an input update."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x, y):
        self.count.add_(1.0)
        y.mul_(2.0)
        s = torch.sort(torch.relu(x + self.w), dim=-1)[0]
        return s.to(dtype=torch.float32) - self.count, y


def _example():
    torch.manual_seed(0)
    return torch.randn(3, 4), torch.randn(3, 4)


@functools.lru_cache(maxsize=1)
def _saved(tmp_dir: str):
    ep = torch.export.export(Mixed(), _example())
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    path = f"{tmp_dir}/p.vkp"
    program.save(path)
    manifest, segments = program_file.read_program(path)
    return json.dumps(manifest), [bytes(s) for s in segments]


def _paths(value):
    """Every (path) inside the plan part of a manifest."""
    return crafted.json_paths(value)


_REPLACEMENTS = [None, "s", 7, -1, 2.5, [], [None], {}, {"v": 3}, True]


def _mutate(manifest: dict, path: tuple, action) -> None:
    parent = manifest
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if action == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    else:
        parent[key] = action


def _check(tmp_path, text: str, segments, path, action) -> None:
    manifest = json.loads(text)
    _mutate(manifest, path, action)
    out = tmp_path / "crafted.vkp"
    program_file.write_program(out, manifest, segments)
    try:
        program = vkdelegate.load(out)
        x, y = _example()
        program(x, y)
        program.state_dict()
    except VkDelegateError:
        pass


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_manifest_fields(tmp_path_factory, tmp_path, data):
    text, segments = _saved(str(tmp_path_factory.getbasetemp()))
    methods = json.loads(text)["methods"]
    paths = [("methods",) + p for p in _paths(methods) if p]
    path = data.draw(st.sampled_from(paths))
    action = data.draw(st.sampled_from(["delete"] + _REPLACEMENTS))
    _check(tmp_path, text, segments, path, action)


def test_each_plan_field_deleted_or_nulled(tmp_path_factory, tmp_path):
    """Every plan field, deleted and set to null, in turn (the cases the trial hit)."""
    text, segments = _saved(str(tmp_path_factory.getbasetemp()))
    plan = json.loads(text)["methods"]["forward"]["plan"]
    for p in _paths(plan):
        if p:
            for action in ("delete", None, "s", [1, 2, 3]):
                _check(tmp_path, text, segments, ("methods", "forward", "plan") + p, action)


def test_missing_shape_names_the_field(tmp_path_factory, tmp_path):
    text, segments = _saved(str(tmp_path_factory.getbasetemp()))
    manifest = json.loads(text)
    del manifest["methods"]["forward"]["plan"]["inputs"][0]["shape"]
    program_file.write_program(tmp_path / "p.vkp", manifest, segments)
    try:
        vkdelegate.load(tmp_path / "p.vkp")
    except VkDelegateError as exc:
        assert "method 'forward'" in str(exc) and "plan.inputs[0].shape" in str(exc)
    else:
        raise AssertionError("a plan without an input shape loaded")


def test_getitem_index_outside_the_outputs_is_refused_at_load(tmp_path_factory, tmp_path):
    """A getitem whose index is no output position (2^63 - 1 escaped as a bare
    ValueError at the call: fuzz/findings/program-getitem-index-int64-overflow.vkp;
    -1 the lowering never writes) is refused at load, naming the field."""
    text, segments = _saved(str(tmp_path_factory.getbasetemp()))
    for bad in (2 ** 63 - 1, 2 ** 31, -1):
        manifest = json.loads(text)
        nodes = manifest["methods"]["forward"]["plan"]["nodes"]
        at = next(i for i, n in enumerate(nodes) if n["op"] == "getitem")
        nodes[at]["args"][1] = bad
        program_file.write_program(tmp_path / "p.vkp", manifest, segments)
        try:
            vkdelegate.load(tmp_path / "p.vkp")
        except VkDelegateError as exc:
            assert f"plan.nodes[{at}].args[1]" in str(exc) and "output position" in str(exc)
        else:
            raise AssertionError(f"getitem index {bad} loaded")


def test_input_dtype_and_size_outside_what_a_lowering_writes(tmp_path_factory, tmp_path):
    """An input dtype outside the dtype table ("float99" loaded and blamed the user's
    tensor at the call) and a static size of 2^31 or more are refused at load, naming
    the field (a new user's crafted manifests, 2026-12-05)."""
    text, segments = _saved(str(tmp_path_factory.getbasetemp()))
    for field, bad, words in (("dtype", "float99", "not one of the dtypes"),
                              ("dtype", "complex64", "not one of the dtypes"),
                              ("shape", [3, 2 ** 31], "below 2^31"),
                              ("shape", [3, 32_000_000_000_000], "below 2^31")):
        manifest = json.loads(text)
        manifest["methods"]["forward"]["plan"]["inputs"][0][field] = bad
        program_file.write_program(tmp_path / "p.vkp", manifest, segments)
        try:
            vkdelegate.load(tmp_path / "p.vkp")
        except VkDelegateError as exc:
            assert f"plan.inputs[0].{field}" in str(exc) and words in str(exc), str(exc)
        else:
            raise AssertionError(f"input {field} {bad!r} loaded")


def test_lowering_refuses_an_input_dtype_a_program_cannot_hold():
    class ViewAsReal(torch.nn.Module):
        def forward(self, x):
            return torch.view_as_real(x) * 2

    ep = torch.export.export(ViewAsReal(), (torch.randn(4, dtype=torch.complex64),))
    try:
        to_backend(ep, VulkanPartitioner())
    except VkDelegateError as exc:
        assert "complex64" in str(exc) and "input 'x'" in str(exc)
    else:
        raise AssertionError("a complex64 input lowered")


def test_a_derived_size_outside_what_a_lowering_writes(tmp_path_factory, tmp_path):
    """A derived size is [symbol, a, b] (a*symbol + b): anything else is refused at
    load, naming the field; a well-formed one is checked at the call."""
    text, segments = _saved(str(tmp_path_factory.getbasetemp()))
    for bad in (["s0", 0, 1], ["s0", True, 0], ["s0", 2], [1, 2, 0], ["s0", 2.0, 0],
                ["s0", 2, 2 ** 31], ["s0", 2 ** 31, 0], "2*s0", {"s0": 2}):
        manifest = json.loads(text)
        manifest["methods"]["forward"]["plan"]["inputs"][0]["shape"][1] = {"affine": bad}
        program_file.write_program(tmp_path / "p.vkp", manifest, segments)
        try:
            vkdelegate.load(tmp_path / "p.vkp")
        except VkDelegateError as exc:
            assert "plan.inputs[0].shape[1].affine must be [symbol, a, b]" in str(exc), \
                str(exc)
        else:
            raise AssertionError(f"derived size {bad!r} loaded")
    manifest = json.loads(text)
    plan = manifest["methods"]["forward"]["plan"]
    plan["inputs"][0]["shape"][1] = {"affine": ["s0", 2, 0]}
    plan["ranges"] = {"s0": [2, 2]}
    program_file.write_program(tmp_path / "p.vkp", manifest, segments)
    with vkdelegate.load(tmp_path / "p.vkp") as program:
        with pytest.raises(VkDelegateError, match=r"input 'x' dim 1 is 5, expected 2\*s0 "
                                                  r"for s0 in 2\.\.2 \(4\)"):
            program(torch.randn(3, 5), torch.randn(3, 4))
