"""Crafted glue nodes outside the allow-list are refused at load, naming node, op and
why; creation ops over the load limits are refused; to_backend never writes such a node."""
import functools
import json
import re

import pytest
import torch

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from vkdelegate.errors import ResourceLimitError
from vkdelegate.limits import LoadLimits
from vkdelegate.serialization import program_file


class SortThenRelu(torch.nn.Module):
    """CPU glue (sort stays on the CPU) around a delegate."""

    def forward(self, x):
        return torch.relu(torch.sort(x, dim=-1)[0])


@functools.lru_cache(maxsize=1)
def _saved(tmp_dir: str):
    ep = torch.export.export(SortThenRelu(), (torch.randn(3, 4),))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    path = f"{tmp_dir}/p.vkp"
    program.save(path)
    manifest, segments = program_file.read_program(path)
    return json.dumps(manifest), [bytes(s) for s in segments]


def _crafted(tmp_path_factory, tmp_path, *nodes):
    """The saved program with ``nodes`` put before its glue (node 0, 1, ...); "X" in
    an argument stands for the program's input."""
    text, segments = _saved(str(tmp_path_factory.getbasetemp()))
    manifest = json.loads(text)
    plan = manifest["methods"]["forward"]["plan"]
    x = plan["inputs"][0]["value"]
    for i, node in enumerate(nodes):
        node = json.loads(json.dumps(node).replace('"X"', json.dumps({"v": x})))
        plan["nodes"].insert(i, dict(node, out=f"crafted_{i}"))
    path = tmp_path / "crafted.vkp"
    program_file.write_program(path, manifest, segments)
    return path


def _node(op, *args, **kwargs):
    return {"op": op, "args": list(args), "kwargs": kwargs}


def test_the_untouched_program_loads_and_runs(tmp_path_factory, tmp_path):
    x = torch.randn(3, 4)
    with vkdelegate.load(_crafted(tmp_path_factory, tmp_path)) as program:
        torch.testing.assert_close(program(x), torch.relu(torch.sort(x, dim=-1)[0]))


def test_from_file_with_shared_fill_is_refused_and_the_file_kept(tmp_path_factory, tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"keep me!")
    path = _crafted(tmp_path_factory, tmp_path,
                    _node("aten.from_file.default", str(victim), True, 8,
                          dtype={"dtype": "uint8"}),
                    _node("aten.fill_.Scalar", {"v": "crafted_0"}, 0))
    with pytest.raises(VkDelegateError, match=re.escape(
            "method 'forward': node 0 calls aten.from_file.default, which a program's "
            "CPU part may not call (not on the glue allow-list: file access)")):
        vkdelegate.load(path)
    assert victim.read_bytes() == b"keep me!"


@pytest.mark.parametrize("node,why", [
    (_node("aten.from_file.default", "/etc/passwd", False, 16), "file access"),
    (_node("aten.set_.source_Tensor", "X", "X"), "storage or raw memory access"),
    (_node("aten.resize_.default", "X", [1 << 20]), "storage or raw memory access"),
    (_node("aten.as_strided.default", "X", [1 << 20], [1]),
     "storage or raw memory access"),
    (_node("aten._pin_memory.default", "X"), "memory pinning"),
    (_node("aten.fill_.Scalar", "X", 0.0), "writes its arguments"),
    (_node("aten.copy_.default", "X", "X"), "writes its arguments"),
    (_node("aten.add.out", "X", "X", out="X"), "writes its arguments"),
    (_node("aten.einsum.default", "ij->ji", ["X"]), "takes a str argument"),
    (_node("mylib.evil.default", "X"), "a custom operator"),
    (_node("builtins.eval", "1"), None),
])
def test_each_refused_class_is_named(tmp_path_factory, tmp_path, node, why):
    path = _crafted(tmp_path_factory, tmp_path, node)
    detail = "not on the glue allow-list" + (f": {why}" if why else ")")
    with pytest.raises(VkDelegateError, match=re.escape(
            f"node 0 calls {node['op']}, which a program's CPU part may not call "
            f"({detail}")):
        vkdelegate.load(path)


@pytest.mark.parametrize("node,text", [
    (_node("aten.gelu.default", "X", approximate="/etc/passwd"),
     "node 0 passes aten.gelu.default the string '/etc/passwd' as argument "
     "'approximate', which takes one of 'none', 'tanh'"),
    (_node("aten.div.Tensor_mode", "X", "X", rounding_mode="w"),
     "as argument 'rounding_mode', which takes one of 'trunc', 'floor'"),
    (_node("aten.add.Tensor", "X", "/etc/passwd"),
     "node 0 passes aten.add.Tensor the string '/etc/passwd' as argument 'other', "
     "which takes no string"),
    (_node("operator.mul", "a", 1 << 30), "passes operator.mul the string 'a'"),
    (_node("aten.zeros.default", [2], pin_memory=True),
     "node 0 calls aten.zeros.default with pin_memory=True"),
    (_node("aten.zeros.default", [2], device={"device": "cuda"}),
     "node 0 asks for device 'cuda'; the CPU part of a program runs on the CPU only"),
])
def test_bad_arguments_of_allowed_ops_are_refused(tmp_path_factory, tmp_path, node, text):
    with pytest.raises(VkDelegateError, match=re.escape(text)):
        vkdelegate.load(_crafted(tmp_path_factory, tmp_path, node))


def test_an_allowed_gelu_choice_loads_and_runs(tmp_path_factory, tmp_path):
    path = _crafted(tmp_path_factory, tmp_path,
                    _node("aten.gelu.default", "X", approximate="tanh"))
    x = torch.randn(3, 4)
    with vkdelegate.load(path) as program:
        torch.testing.assert_close(program(x), torch.relu(torch.sort(x, dim=-1)[0]))


def test_unbounded_creation_op_is_refused_at_load(tmp_path_factory, tmp_path):
    path = _crafted(tmp_path_factory, tmp_path, _node("aten.full.default", [2 ** 40], 1.0))
    with pytest.raises(ResourceLimitError, match=re.escape(
            "method 'forward': node 0 (aten.full.default): the tensor it makes, in "
            "bytes, is 4,398,046,511,104, over the load limit max_tensor_bytes=")):
        vkdelegate.load(path)


def test_creation_ops_of_a_method_are_summed(tmp_path_factory, tmp_path):
    # int64 zeros of 100 elements: 800 bytes each, 1,600 together.
    two = [_node("aten.zeros.default", [100], dtype={"dtype": "int64"})] * 2
    path = _crafted(tmp_path_factory, tmp_path, *two)
    limits = LoadLimits(max_tensor_bytes=800, max_host_bytes=1599)
    with pytest.raises(ResourceLimitError, match=re.escape(
            "node 1 (aten.zeros.default): host memory of the creation ops up to it, in "
            "bytes, is 1,600, over the load limit max_host_bytes=1,599")):
        vkdelegate.load(path, limits=limits)
    with pytest.raises(ResourceLimitError, match="is 800, over the load limit "
                                                 "max_tensor_bytes=799"):
        vkdelegate.load(path, limits=limits.replace(max_tensor_bytes=799))
    vkdelegate.load(path, limits=limits.replace(max_host_bytes=1600)).close()


def test_run_time_sized_creation_op_is_checked_before_the_call(tmp_path_factory, tmp_path):
    path = _crafted(tmp_path_factory, tmp_path,
                    _node("aten.sym_size.int", "X", 0),
                    _node("aten.full.default", [{"v": "crafted_0"}, 1 << 20, 1 << 20], 1.0))
    with vkdelegate.load(path) as program:  # the size is an input's, known at the call
        with pytest.raises(ResourceLimitError, match=re.escape(
                "method 'forward', node 1 (aten.full.default): the tensor it makes, in "
                "bytes, is "
                f"{3 * 4 << 40:,}, over the load limit max_tensor_bytes=")):
            program(torch.randn(3, 4))


@pytest.mark.parametrize("nodes,op", [
    # a [3, 4] input grown 2**20 x 2**20 times: 48 TiB of float32
    ([_node("aten.repeat.default", "X", [1 << 20, 1 << 20])], "aten.repeat.default"),
    ([_node("aten.constant_pad_nd.default", "X", [0, 1 << 40], 0.0)],
     "aten.constant_pad_nd.default"),
    # expand is a view (nothing allocated); its copy is the allocation
    ([_node("aten.expand.default", "X", [1 << 30, 3, 4]),
      _node("aten.clone.default", {"v": "crafted_0"})], "aten.clone.default"),
    # a [3, 4, 1] + [1, 1, 2**36] broadcast (the second an expanded one-element tensor)
    ([_node("aten.unsqueeze.default", "X", 2),
      _node("aten.new_ones.default", "X", [1, 1, 1]),
      _node("aten.expand.default", {"v": "crafted_1"}, [1, 1, 1 << 36]),
      _node("aten.add.Tensor", {"v": "crafted_0"}, {"v": "crafted_2"})],
     "aten.add.Tensor"),
])
def test_glue_that_grows_a_tensor_is_sized_before_it_runs(tmp_path_factory, tmp_path,
                                                          nodes, op):
    """Known limit closed: a crafted glue op that grows a small input (repeat, pad, a
    copy of an expanded view, broadcasting) is sized on the meta device before it runs
    and refused over the limits, instead of allocating what torch grants."""
    path = _crafted(tmp_path_factory, tmp_path, *nodes)
    with vkdelegate.load(path) as program:
        with pytest.raises(ResourceLimitError, match=re.escape(
                f"method 'forward', node {len(nodes) - 1} ({op}): the tensor it makes, "
                f"in bytes, is ")):
            program(torch.randn(3, 4))
        # the same ops within the limits run (the crafted nodes' results are unused)
    small = LoadLimits(max_host_bytes=64 << 20)
    with vkdelegate.load(_crafted(tmp_path_factory, tmp_path,
                                  _node("aten.repeat.default", "X", [2, 2])),
                         limits=small) as program:
        x = torch.randn(3, 4)
        torch.testing.assert_close(program(x), torch.relu(torch.sort(x, dim=-1)[0]))
    with vkdelegate.load(_crafted(tmp_path_factory, tmp_path,
                                  _node("aten.repeat.default", "X", [2048, 1024])),
                         limits=small) as program:
        with pytest.raises(ResourceLimitError, match="max_host_bytes=67,108,864"):
            program(torch.randn(3, 4))


class _TwiceOnTheCpu(torch.nn.Module):
    def forward(self, x):
        return torch.ops.vkd_allow_test.twice(torch.relu(x))


def test_lowering_refuses_a_custom_op_left_on_the_cpu():
    lib = torch.library.Library("vkd_allow_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    ep = torch.export.export(_TwiceOnTheCpu(), (torch.randn(3),))
    with pytest.raises(VkDelegateError, match=re.escape(
            "calls vkd_allow_test.twice.default, which a program's CPU part may not call "
            "(not on the glue allow-list: a custom operator); docs/LOWERING.md lists")):
        to_backend(ep, VulkanPartitioner({"executor": "reference"}))


class CheckedSlice(torch.nn.Module):
    """torch._check on a data-dependent size: the glue holds aten._assert_scalar."""

    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= 4)
        return x[:k] * 2


def test_asserts_of_a_dynamic_program_lower_and_raise_like_eager():
    x = torch.randn(5, 3)
    ep = torch.export.export(CheckedSlice(), (x, torch.tensor(2)))
    program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
    assert "aten._assert_scalar.default" in {n.op for n in program.report.cpu_nodes}
    torch.testing.assert_close(program(x, torch.tensor(3)), x[:3] * 2)
    with pytest.raises(VkDelegateError, match=r"aten._assert_scalar.default"):
        program(x, torch.tensor(7))


@pytest.mark.parametrize("node,arg", [
    (_node("aten._assert_scalar.default", True, "m" * 5000), "assert_msg"),
    (_node("aten._assert_async.msg", "X", "m" * 5000), "assert_msg"),
    (_node("aten._linalg_check_errors.default", "X", "m" * 5000, is_matrix=True),
     "api_name"),
])
def test_an_assert_message_over_the_bound_is_refused(tmp_path_factory, tmp_path, node,
                                                     arg):
    path = _crafted(tmp_path_factory, tmp_path, node)
    with pytest.raises(VkDelegateError, match=f"5000-character argument '{arg}'"):
        vkdelegate.load(path)


def test_empty_gives_zeros_not_uninitialised_memory(tmp_path_factory, tmp_path):
    path = _crafted(tmp_path_factory, tmp_path,
                    _node("aten.empty.memory_format", [4096], dtype={"dtype": "float32"}))
    with vkdelegate.load(path) as program:
        runner = program.runner("forward")
        runner.plan["outputs"].append({"v": "crafted_0"})
        out = runner.run_flat([torch.randn(3, 4)])[-1]
    assert torch.equal(out, torch.zeros(4096))
