"""Calling lowered programs: input checks, dynamic ranges, methods, mutation, options."""
import numpy as np
import pytest
import torch
from torch.export import Dim

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from vkdelegate.serialization.blob import read_blob
from vkdelegate.serialization.vkgraph import VkDataType, VkStorageType, VkTensor


class AddTanh(torch.nn.Module):
    def forward(self, x, y):
        return torch.tanh(x) + y


def _lower(module, inputs, executor="reference", dynamic=None, **options):
    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic)
    return to_backend(ep, VulkanPartitioner(dict(options, executor=executor)))


@pytest.fixture
def dynamic_program(executor):
    length = Dim("length", min=2, max=40)
    return _lower(AddTanh(), (torch.randn(3, 8), torch.randn(3, 8)), executor,
                  dynamic=({1: length}, {1: length}))


def test_sizes_in_range_run(dynamic_program):
    torch.manual_seed(0)
    for n in (2, 13, 40):
        x, y = torch.randn(3, n), torch.randn(3, n)
        torch.testing.assert_close(dynamic_program(x, y), AddTanh()(x, y), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("shapes,dtype,text", [
    (((3, 41), (3, 41)), torch.float32, r"input 'x' dim 1 is 41, allowed range 2\.\.40 of dynamic size length \(s\d+\)"),
    (((3, 1), (3, 1)), torch.float32, r"input 'x' dim 1 is 1, allowed range 2\.\.40"),
    (((4, 8), (4, 8)), torch.float32, r"input 'x' dim 0 is 4, expected 3, a static size \(input 'x' is float32\[3, 2\.\.40\]\)"),
    (((3, 8), (3, 9)), torch.float32, r"input 'y' dim 1 is 9 but input 'x' dim 1 is 8; both are the same dynamic size length \(s\d+\)"),
    (((3, 8), (3, 8)), torch.float64, r"input 'x' has dtype float64, expected float32"),
    (((3, 8, 1), (3, 8)), torch.float32, r"input 'x' has rank 3, expected 2"),
])
def test_bad_inputs_are_named(dynamic_program, shapes, dtype, text):
    args = [torch.randn(s).to(dtype) for s in shapes]
    with pytest.raises(VkDelegateError, match=text):
        dynamic_program(*args)


def test_wrong_argument_count():
    program = _lower(AddTanh(), (torch.randn(2), torch.randn(2)))
    with pytest.raises(VkDelegateError, match=r"forward takes 2 input\(s\) \(x, y\); "
                                              r"missing y"):
        program(torch.randn(2))


def test_numpy_in_numpy_out(executor):
    program = _lower(AddTanh(), (torch.randn(2, 3), torch.randn(2, 3)), executor)
    x, y = np.random.default_rng(0).standard_normal((2, 2, 3), dtype=np.float32)
    out = program(x, y)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, np.tanh(x) + y, rtol=1e-4, atol=1e-4)


class NonTensorOutputs(torch.nn.Module):
    def forward(self, x):
        return {"y": x + 1, "n": None, "k": 7, "f": 3.5}


def test_non_tensor_outputs_stay_python_values_with_numpy_inputs():
    """None and Python numbers come back as they are, as with torch inputs (they came
    back as 0-d arrays, None as an object array that np.save pickles)."""
    x = torch.randn(3, generator=torch.Generator().manual_seed(3))
    program = _lower(NonTensorOutputs(), (x,))
    want = NonTensorOutputs()(x)
    for arg in (x, x.numpy()):
        out = program(arg)
        assert out["n"] is None
        assert type(out["k"]) is int and out["k"] == 7
        assert type(out["f"]) is float and out["f"] == 3.5
        np.testing.assert_allclose(np.asarray(out["y"]), want["y"].numpy(), rtol=1e-6)
    assert isinstance(program(x.numpy())["y"], np.ndarray)


def test_repeated_runs_are_bit_identical(executor):
    torch.manual_seed(1)
    x, y = torch.randn(37, 11), torch.randn(37, 11)
    program = _lower(AddTanh(), (x, y), executor)
    first = program(x, y)
    for _ in range(3):
        assert torch.equal(program(x, y), first)


def test_methods():
    class Sub(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) - 1.0

    x = torch.randn(4)
    eps = {"add": torch.export.export(AddTanh(), (x, x)),
           "sub": torch.export.export(Sub(), (x,))}
    program = to_backend(eps, VulkanPartitioner({"executor": "reference"}))
    assert program.method_names == ["add", "sub"]
    torch.testing.assert_close(program.sub(x), Sub()(x))
    torch.testing.assert_close(program.run("add", x, x), AddTanh()(x, x))
    with pytest.raises(VkDelegateError, match=r"no method 'mul'; it has \['add', 'sub'\]"):
        program.run("mul", x)
    with pytest.raises(VkDelegateError, match="call program.run"):
        program(x)
    # No default method: the report is every method's, by name.
    assert list(program.report) == ["add", "sub"]
    assert program.report["sub"] is program.methods["sub"].report
    assert "method 'add':" in str(program.report)
    assert program.methods["sub"].report.decisions


def test_input_mutation_as_in_eager(executor):
    class Mutate(torch.nn.Module):
        def forward(self, x):
            x.add_(1.0)
            return torch.relu(x)

    x = torch.randn(5)
    program = _lower(Mutate(), (x.clone(),), executor)
    mine, theirs = x.clone(), x.clone()
    torch.testing.assert_close(program(mine), Mutate()(theirs))
    torch.testing.assert_close(mine, theirs)


def test_mutated_input_sharing_memory_with_another_is_refused(executor):
    """p(x, x) with ``a.mul_(2); return a + b``: eager sees the update through both
    names (4); the program reads its inputs first (it gave 3): refused, the caller's
    tensor untouched. Disjoint views of one tensor are fine."""
    class MulAdd(torch.nn.Module):
        def forward(self, a, b):
            a.mul_(2)
            return a + b

    program = _lower(MulAdd(), (torch.ones(3), torch.ones(3)), executor)
    x = torch.ones(3)
    with pytest.raises(VkDelegateError, match="inputs 0 and 1 share memory, and the "
                                              "program mutates input 0 in place"):
        program(x, x)
    torch.testing.assert_close(x, torch.ones(3))
    with pytest.raises(VkDelegateError, match="share memory"):
        program(x[:3], x.view(1, 3)[0])
    z = np.ones(3, np.float32)
    with pytest.raises(VkDelegateError, match="share memory"):
        program(z, z)
    mine, theirs = torch.arange(6.0), torch.arange(6.0)
    torch.testing.assert_close(program(mine[:3], mine[3:]),
                               MulAdd()(theirs[:3], theirs[3:]))
    torch.testing.assert_close(mine, theirs)


def test_to_backend_rejects_non_programs():
    with pytest.raises(VkDelegateError, match=r"expected a torch.export.ExportedProgram, "
                                              r"got AddTanh; export it first"):
        to_backend(AddTanh())
    with pytest.raises(VkDelegateError, match=r"expected a torch.export.ExportedProgram, "
                                              r"got str$"):
        to_backend("model.pt")
    ep = torch.export.export(AddTanh(), (torch.randn(2), torch.randn(2)))
    with pytest.raises(VkDelegateError, match="must be a Python identifier"):
        to_backend({"not valid": ep})


def test_to_backend_rejects_options_where_the_partitioner_goes():
    """An options dict as the second argument: one line saying where options go (it
    was an AttributeError from inside to_backend)."""
    ep = torch.export.export(AddTanh(), (torch.randn(2), torch.randn(2)))
    with pytest.raises(VkDelegateError, match=r"second argument is a VulkanPartitioner, "
                                              r"got a dict; .*VulkanPartitioner\(options\)"):
        to_backend(ep, {"force_fp16": True})
    with pytest.raises(VkDelegateError, match="must be a VulkanPartitioner, got str"):
        to_backend(ep, "vulkan")
    x, y = torch.randn(2), torch.randn(2)
    torch.testing.assert_close(to_backend(ep, None)(x, y), AddTanh()(x, y))


def test_pickle_and_copy_say_to_save_and_load(tmp_path):
    """pickle / copy of a program or a method: one line pointing at save / load (a
    TypeError too, as pickle raises); it was "cannot pickle '_thread.RLock' object"."""
    import copy
    import pickle

    from vkdelegate import load
    from vkdelegate.errors import NotPicklableError

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    program = _lower(AddTanh(), (x, y))
    program(x, y)  # built: its delegate holds a lock and a loaded graph
    for value, what in ((program, "a lowered program"),
                        (program.forward, "method 'forward' of a lowered program")):
        for fn in (pickle.dumps, copy.deepcopy, copy.copy):
            with pytest.raises(NotPicklableError, match=rf"^{what} cannot be pickled or "
                                                        rf"copied .*program\.save\(path\) "
                                                        rf".*vkdelegate\.load\(path\)$"):
                fn(value)
    assert issubclass(NotPicklableError, TypeError)
    assert issubclass(NotPicklableError, VkDelegateError)
    program.save(tmp_path / "p.vkp")  # the way to a second program
    torch.testing.assert_close(load(tmp_path / "p.vkp")(x, y), AddTanh()(x, y))


def _blob_graphs(program):
    return [read_blob(d.blob).graph for d in program.methods["forward"].delegates]


def test_overrides_and_fp16_are_recorded_in_blobs():
    program = _lower(AddTanh(), (torch.randn(2, 3), torch.randn(2, 3)),
                     storage_type_override="BUFFER", force_fp16=True)
    (graph,) = _blob_graphs(program)
    assert graph.storage_type_override == VkStorageType.BUFFER
    tensors = [v for v in graph.values if isinstance(v, VkTensor)]
    assert tensors and all(t.datatype == VkDataType.FLOAT16 for t in tensors)
    plain = _lower(AddTanh(), (torch.randn(2, 3), torch.randn(2, 3)))
    (graph,) = _blob_graphs(plain)
    assert graph.storage_type_override == VkStorageType.DEFAULT_STORAGE
    assert all(v.datatype == VkDataType.FLOAT32 for v in graph.values
               if isinstance(v, VkTensor))


class WithWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(7))

    def forward(self, x):
        return torch.tanh(x + self.w) - self.w


def test_force_fp16_runs_in_half_precision(executor):
    torch.manual_seed(3)
    x = torch.randn(5, 7)
    module = WithWeight()
    program = _lower(module, (x,), executor, force_fp16=True)
    out = program(x)
    assert out.dtype == torch.float32
    expected = module(x).detach()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
    # fp16 rounding shows: not bit-equal to the fp32 result.
    assert not torch.equal(out, expected)
    (delegate,) = program.methods["forward"].delegates
    (weight,) = delegate.named_data.values()
    assert weight == module.w.detach().numpy().astype("float16").tobytes()


def test_delegate_load_failure_names_method_and_delegate():
    from vkdelegate.serialization.blob import write_blob

    from .conftest import _vulkan_available

    if _vulkan_available():
        pytest.skip(_vulkan_available())
    program = _lower(AddTanh(), (torch.randn(2, 3), torch.randn(2, 3)), "vulkan")
    (delegate,) = program.methods["forward"].delegates
    decoded = read_blob(delegate.blob)
    decoded.graph.chain[0].name = "aten.sort.default"   # no Vulkan implementation
    delegate.blob = write_blob(decoded.graph, bytes(decoded.constants_section))
    with pytest.raises(VkDelegateError, match=r"^method 'forward', delegate 0: .*aten\.sort"):
        program(torch.randn(2, 3), torch.randn(2, 3))


def test_repr_context_manager_and_build(executor):
    with _lower(AddTanh(), (torch.randn(2), torch.randn(2)), executor) as program:
        assert repr(program) == "LoweredProgram(forward: 1 delegate(s), 0 CPU op(s))"
        (delegate,) = program.runner("forward").delegates
        assert delegate.loaded is None
        assert program.build() is program and delegate.loaded is not None
    assert delegate.loaded is None  # closed on exit


def test_python_scalar_input_is_the_exported_constant(executor):
    class Scale(torch.nn.Module):
        def forward(self, x, n: int):
            return torch.relu(x) + n

    x = torch.randn(4)
    program = _lower(Scale(), (x, 3), executor)
    torch.testing.assert_close(program(x, 3), Scale()(x, 3))
    with pytest.raises(VkDelegateError, match="input 'n' was exported as the constant 3; "
                                              "got 4"):
        program(x, 4)


def test_batch_norm_in_training_mode_says_to_call_eval():
    """Batch norm exported in training mode (it updates its running statistics) was
    refused by the internal op's name alone; the error now says to call model.eval()."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.BatchNorm2d(6))
    x = torch.randn(4, 3, 8, 8)
    with pytest.raises(VkDelegateError, match=r"calls aten\._native_batch_norm_legit_"
                                              r"functional\.default, .*exported in "
                                              r"training mode; call model\.eval\(\) "
                                              r"before torch\.export\.export$"):
        _lower(model.train(), (x,))
    program = _lower(model.eval(), (x,))
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), rtol=1e-4, atol=1e-5)


def test_control_flow_is_rejected():
    class Cond(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

    ep = torch.export.export(Cond(), (torch.randn(3),))
    with pytest.raises(VkDelegateError, match="node cond calls cond, which vkdelegate "
                                              "cannot run"):
        to_backend(ep)


def test_report_partitions_are_delegate_indexes():
    class TwoParts(torch.nn.Module):
        def forward(self, x):
            a = torch.relu(x) + 1.0
            b = torch.sort(a)[0]
            return torch.tanh(b) - 2.0

    program = _lower(TwoParts(), (torch.randn(3, 4),), fuse_elementwise=False)
    d = {n.name: n for n in program.report.decisions}
    assert (d["relu"].partition, d["tanh"].partition) == (0, 1)
    nodes = program.methods["forward"].plan["nodes"]
    assert [n["index"] for n in nodes if n["op"] == "delegate"] == [0, 1]


def test_fused_conv_clamp_on_the_cpu(executor):
    # The fused op a pass creates must also run in the CPU glue (here: blocklisted).
    from vkdelegate.ops import registry
    from vkdelegate.backend.passes.fuse_conv_clamp import FUSED

    if FUSED not in registry.load_all():
        pytest.skip("the registry has no fused conv op")
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU6(), torch.nn.Tanh())
    x = torch.randn(1, 3, 7, 7) * 3
    ep = torch.export.export(m, (x,))
    program = to_backend(ep, VulkanPartitioner({"executor": executor},
                                               operator_blocklist=[FUSED]))
    assert any(n.op == FUSED and n.reasons == ["in operator_blocklist"]
               for n in program.report.cpu_nodes)
    torch.testing.assert_close(program(x), m(x), rtol=1e-4, atol=1e-4)


def test_errors_use_the_signature_input_name():
    # nn.Sequential's input is "input", a builtin: the graph copy renames the
    # placeholder, but users see the name they know.
    program = _lower(torch.nn.Sequential(torch.nn.ReLU()), (torch.randn(2, 3),))
    with pytest.raises(VkDelegateError, match="input 'input' dim 1 is 4, expected 3"):
        program(torch.randn(2, 4))


class HalfRows(torch.nn.Module):
    """y [3, 2T, 2] read as [3, T, 4]: the graph relies on y's size being 2 * x's."""

    def forward(self, x, y):
        return torch.tanh(x) + y.reshape(x.shape[0], x.shape[1], 4)


@pytest.fixture
def derived_program(executor):
    t = Dim("T", min=2, max=16)
    return _lower(HalfRows(), (torch.randn(3, 6, 4), torch.randn(3, 12, 2)), executor,
                  dynamic=({1: t}, {1: 2 * t}))


def test_a_derived_size_is_recorded_without_an_expression_to_evaluate(derived_program):
    shapes = [i["shape"] for i in derived_program.methods["forward"].plan["inputs"]]
    sym = shapes[0][1]["sym"]
    assert shapes == [[3, {"sym": sym}, 4], [3, {"affine": [sym, 2, 0]}, 2]]


def test_derived_sizes_run_and_a_wrong_one_is_named(derived_program, tmp_path):
    torch.manual_seed(0)
    derived_program.save(tmp_path / "p.vkdp")
    with vkdelegate.load(tmp_path / "p.vkdp") as loaded:
        for program in (derived_program, loaded):
            for t in (2, 7, 16):
                x, y = torch.randn(3, t, 4), torch.randn(3, 2 * t, 2)
                torch.testing.assert_close(program(x, y), HalfRows()(x, y), rtol=1e-4,
                                           atol=1e-4)
            for t, n in ((5, 9), (5, 12), (16, 4)):
                with pytest.raises(VkDelegateError, match=(
                        rf"^input 'y' dim 1 is {n}, expected 2\*T = {2 * t} for T "
                        rf"\(s\d+\) = {t}, from input 'x' dim 1$")):
                    program(torch.randn(3, t, 4), torch.randn(3, n, 2))
            with pytest.raises(VkDelegateError, match=r"input 'y' has dtype float64, "
                                                      r"expected float32\[3, 2\*T, 2\]"):
                program(torch.randn(3, 5, 4), torch.randn(3, 10, 2, dtype=torch.float64))


class CatRows(torch.nn.Module):
    def forward(self, x, y):
        return torch.cat([x, y], 1) * 2


def test_a_derived_size_alone_must_be_one_of_its_range(executor):
    t = Dim("T", min=2, max=16)
    program = _lower(CatRows(), (torch.randn(3, 6), torch.randn(3, 12)), executor,
                     dynamic=(None, {1: 2 * t}))
    for n in (4, 10, 32):
        x, y = torch.randn(3, 6), torch.randn(3, n)
        torch.testing.assert_close(program(x, y), CatRows()(x, y))
    for n in (9, 2, 34):
        with pytest.raises(VkDelegateError, match=(
                rf"^input 'y' dim 1 is {n}, expected 2\*T for T \(s\d+\) in 2\.\.16 "
                rf"\(4, 6, \.\.\., 32\)$")):
            program(torch.randn(3, 6), torch.randn(3, n))


def test_a_root_size_export_writes_as_an_offset_is_checked_too(executor):
    # Export may write T as s + 1 and T - 1 as s: then x's size is the derived one.
    t = Dim("T", min=2, max=16)
    program = _lower(CatRows(), (torch.randn(3, 6), torch.randn(3, 5)), executor,
                     dynamic=({1: t}, {1: t - 1}))
    for n in (2, 9, 16):
        x, y = torch.randn(3, n), torch.randn(3, n - 1)
        torch.testing.assert_close(program(x, y), CatRows()(x, y))
    for n, m in ((6, 4), (6, 6), (9, 3)):
        with pytest.raises(VkDelegateError, match=r"input '[xy]' dim 1 is \d+, expected "):
            program(torch.randn(3, n), torch.randn(3, m))


class Flatten(torch.nn.Module):
    def forward(self, x, y):
        return x.reshape(-1) + y


def test_a_size_of_two_symbols_is_left_unchecked_with_a_warning(caplog):
    a, b = Dim("A", min=2, max=8), Dim("B", min=2, max=8)
    with caplog.at_level("WARNING", logger="vkdelegate"):
        program = _lower(Flatten(), (torch.randn(3, 4), torch.randn(12)),
                         dynamic=({0: a, 1: b}, {0: Dim.AUTO}))
    y_dim = program.methods["forward"].plan["inputs"][1]["shape"][0]
    assert list(y_dim) == ["expr"]
    assert (f"vkdelegate: input 'y' dim 0 has the size {y_dim['expr']}, which is not "
            f"a*s + b of one dynamic size; calls do not check it") in caplog.text
    x, y = torch.randn(2, 5), torch.randn(10)
    torch.testing.assert_close(program(x, y), Flatten()(x, y))
