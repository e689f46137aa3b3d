"""Structural fuzzing of a real saved program's manifest: random fields replaced by
random JSON values (huge and negative ints, non-finite floats, strings, nested lists,
null, deep nesting), deleted, or added. Through ``load()`` and a call, and through
``vkdelegate inspect`` (text and JSON), the only exception is VkDelegateError; the
CLI answers 0, or 2 with one error line."""
import copy
import json
import os
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkdelegate
from vkdelegate import VkDelegateError
from vkdelegate.cli import main

from . import crafted

# Field names and values the loader gives meaning to, so mutations hit real checks.
_KEYS = ["segment", "dtype", "shape", "offset", "size", "sha256", "v", "op", "args",
         "kwargs", "out", "index", "inputs", "nodes", "outputs", "user_outputs",
         "state_updates", "input_updates", "ranges", "sym", "expr", "t", "c", "k",
         "cast_inputs", "cast_outputs", "blob", "named_data", "const", "executor"]
_MEANINGFUL = [{"v": "x"}, {"v": "getitem"}, {"segment": 0, "dtype": "float32",
                                              "shape": [4]},
               {"sym": "s0"}, {"dtype": "float32"}, "float32", "bfloat16", "reference",
               "aten.sort.default", "delegate", "getitem", 0, 1, 3, 4, 64]
_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64, -2**63 - 1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(_MEANINGFUL))
_JSON = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=4)), inner,
                    max_size=4)), max_leaves=10)


_DEEP = "\0deep"  # a placeholder: json.dumps itself recurses on deep lists


def _nest(depth: int, leaf):
    if depth > 100:
        return f"{_DEEP}{depth}"
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _text(manifest: dict) -> str:
    """The manifest as JSON (Infinity/NaN allowed), deep placeholders expanded."""
    return re.sub(r'"\\u0000deep(\d+)"', lambda m: "[" * int(m[1]) + "0" + "]" * int(m[1]),
                  json.dumps(manifest, allow_nan=True))


# Nesting around the depth limit, and far past Python's recursion limit.
_VALUES = st.one_of(_JSON, st.builds(_nest, st.one_of(st.integers(1, 70),
                                                      st.integers(900, 5000)), _LEAVES))


def _paths(value):
    # Past depth 24 is inside a nest a mutation made: nothing new deeper down.
    return crafted.json_paths(value, max_depth=24)


def _draw_value(data):
    # A copy: sampled values are shared objects a later mutation would edit in place.
    return copy.deepcopy(data.draw(_VALUES, label="value"))


def _region(path: tuple) -> tuple:
    """The part of the manifest a path is in: the segment table, options, a method's
    constants, state, plan inputs / nodes / rest, delegates, report, or the top."""
    if len(path) >= 3 and path[0] == "methods":
        return path[2:3] + (path[3:4] if path[2] == "plan" and len(path) > 3 else ())
    return path[:1]


def _mutate(manifest: dict, data) -> dict:
    manifest = copy.deepcopy(manifest)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = [p for p in _paths(manifest) if p]
        # A region first, then a path in it: the small segment table and tensor
        # references are hit as often as the long plan and report.
        regions = sorted({_region(p) for p in paths}, key=str)
        region = data.draw(st.sampled_from(regions), label="region")
        path = data.draw(st.sampled_from([p for p in paths if _region(p) == region]),
                         label="path")
        parent = manifest
        for k in path[:-1]:
            parent = parent[k]
        action = data.draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent[path[-1]], dict):
            key = data.draw(st.sampled_from(_KEYS), label="key")
            parent[path[-1]][key] = _draw_value(data)
        else:
            parent[path[-1]] = _draw_value(data)
        if not isinstance(manifest, dict) or not manifest:
            break
    return manifest


_FUZZ = settings(max_examples=int(os.environ.get("VKD_FUZZ_EXAMPLES", 150)),
                 deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                       HealthCheck.too_slow])


@_FUZZ
@given(data=st.data())
def test_load_and_call_raise_only_vkdelegate_error(tmp_path, data):
    path = crafted.write_raw(tmp_path / "fuzz.vkp",
                             _text(_mutate(crafted.manifest(), data)))
    try:  # a mutation no check refuses (an ignored field) must leave a program that runs
        program = vkdelegate.load(path)
        program(crafted.example())
        program.state_dict()
    except VkDelegateError:
        pass


@_FUZZ
@given(data=st.data())
def test_inspect_answers_0_or_2_with_one_line(tmp_path, capsys, data):
    path = crafted.write_raw(tmp_path / "fuzz.vkp",
                             _text(_mutate(crafted.manifest(), data)))
    for extra in ([], ["--json"]):
        status = main(["inspect", path, *extra])
        out, err = capsys.readouterr()
        assert status in (0, 2), (status, err)
        if status == 2:
            assert err.startswith("vkdelegate inspect: error: ") and err.count("\n") == 1
        else:
            assert err == "" and out
