"""The allow-list: it covers what lowering and the registry need, the installed torch's
schemas of its ops follow its rules, docs/LOWERING.md lists it, and creation ops are
sized as torch allocates them."""
import pytest
import torch

from vkdelegate import VulkanPartitioner, to_backend
from vkdelegate.backend import allowed_ops, allowed_ops_doc, custom_ops, reference
from vkdelegate.backend.creation_ops import CREATION_OPS, UNKNOWN, creation_nbytes
from vkdelegate.ops.registry import load_all
from vkdelegate.errors import VkDelegateError

from tests.program.helpers import export
from tests.program.modules import CASES


def _overload(name):
    namespace, op, overload = name.split(".")
    packet = getattr(getattr(torch.ops, namespace), op, None)
    return getattr(packet, overload, None) if packet is not None else None


def test_every_registry_op_is_allowed():
    missing = [n for n in load_all() if not allowed_ops.is_allowed(n, reference=True)]
    assert missing == []


def test_reference_only_ops_are_the_reference_executors():
    assert "et_vk.prepack.default" in allowed_ops.REFERENCE_ONLY
    for name in allowed_ops.REFERENCE_ONLY:
        assert reference.resolve(name) is custom_ops.CUSTOM_OPS[name].cpu
    assert not allowed_ops.is_allowed("et_vk.prepack.default")  # not in the glue


def test_every_glue_op_of_the_module_suite_is_allowed():
    ops = set()
    for case in filter(lambda c: c.exportable(), CASES):  # torch 2.11: not all
        ep = export(case)[1]
        program = to_backend(ep, VulkanPartitioner({"executor": "reference"}))
        for method in program.methods.values():
            ops.update(n["op"] for n in method.plan["nodes"])
    assert "aten.sort.default" in ops and "aten.sym_size.int" in ops  # it saw glue
    assert sorted(ops - allowed_ops.ALLOWED - {"delegate", "getitem"}) == []


def test_the_list_has_no_duplicates_and_only_qualified_names():
    groups = (allowed_ops.CORE_ATEN + allowed_ops.REGISTRY_EXTRA + allowed_ops.NON_CORE
              + allowed_ops.LINALG
              + allowed_ops.SIZES_AND_CHECKS + allowed_ops.VALUE_CHECKS + allowed_ops.CREATION + allowed_ops.CUSTOM
              + allowed_ops.OPERATORS)
    assert len(groups) == len(set(groups)) == len(allowed_ops.ALLOWED)
    assert all(len(n.split(".")) == 3 for n in groups if not n.startswith("operator."))


def test_no_allowed_overload_writes_an_argument_or_takes_a_free_string():
    from vkdelegate.backend import custom_ops

    custom_ops.ensure_defined()  # our custom ops too (a str argument unlisted: refused)
    checked = 0
    for name in sorted(allowed_ops.ALLOWED):
        op = None if name.startswith("operator.") else _overload(name)
        if op is None:
            continue  # not defined by this torch (or an executorch-only op)
        checked += 1
        schema = op._schema
        writes = [a.name for a in schema.arguments
                  if a.alias_info is not None and a.alias_info.is_write]
        assert writes == [] and not schema.is_mutable, name
        strings = {a.name for a in schema.arguments if "str" in str(a.type)}
        assert strings == set(allowed_ops.STR_CHOICES.get(name, {})), name
        assert schema.overload_name != "out", name
    assert checked > 200  # the list resolves against this torch


def test_string_choices_are_accepted_by_torch():
    x = torch.randn(4)
    for value in allowed_ops.STR_CHOICES["aten.gelu.default"]["approximate"]:
        torch.ops.aten.gelu.default(x, approximate=value)
    for value in allowed_ops.STR_CHOICES["aten.div.Tensor_mode"]["rounding_mode"]:
        torch.ops.aten.div.Tensor_mode(x, x + 2, rounding_mode=value)
    for value in allowed_ops.STR_CHOICES["aten.scatter_reduce.two"]["reduce"]:
        torch.ops.aten.scatter_reduce.two(x, 0, torch.tensor([0, 1]), x[:2], value)
    edges = torch.tensor([0.0, 0.5, 1.0])
    for value in allowed_ops.STR_CHOICES["aten.searchsorted.Tensor"]["side"]:
        torch.ops.aten.searchsorted.Tensor(edges, x, side=value)
        torch.ops.aten.searchsorted.Scalar(edges, 0.5, side=value)


@pytest.mark.parametrize("name,why", [
    ("aten.from_file.default", "file access"),
    ("aten._pin_memory.default", "memory pinning"),
    ("aten.set_.source_Storage", "storage or raw memory access"),
    ("aten.fill_.Scalar", "writes its arguments (in-place or out= overload)"),
    ("aten.add.out", "writes its arguments (in-place or out= overload)"),
    ("aten.einsum.default", "takes a str argument"),
    ("aten.as_strided.default", "storage or raw memory access"),
])
def test_refusal_names_the_class(name, why):
    assert not allowed_ops.is_allowed(name) and allowed_ops.refusal_class(name) == why
    assert str(allowed_ops.refusal(name, "node 3")) == (
        f"node 3 calls {name}, which a program's CPU part may not call (not on the glue "
        f"allow-list: {why})")


def test_lowering_doc_lists_the_module():
    text = allowed_ops_doc.DEFAULT_PATH.read_text()
    assert allowed_ops_doc.replaced(text) == text, (
        "docs/LOWERING.md is out of date: run python -m vkdelegate.backend.allowed_ops_doc")
    for name in allowed_ops.ALLOWED:
        assert f"`{name}`" in text


def test_doc_check_mode_detects_a_stale_section(tmp_path):
    path = tmp_path / "LOWERING.md"
    path.write_text(f"intro\n{allowed_ops_doc.BEGIN}\nold\n{allowed_ops_doc.END}\nrest\n")
    assert allowed_ops_doc.main(["--path", str(path), "--check"]) == 1
    assert allowed_ops_doc.main(["--path", str(path)]) == 0
    assert allowed_ops_doc.main(["--path", str(path), "--check"]) == 0
    assert path.read_text().startswith("intro\n") and path.read_text().endswith("rest\n")


_T = torch.zeros(2, dtype=torch.float16)

#: (op, args, kwargs) called for real: creation_nbytes must equal the storage torch
#: allocates.
_CALLS = [
    ("aten.full.default", [[3, 4], 1], {}),
    ("aten.full.default", [[3, 4], 1.5], {}),
    ("aten.full.default", [[5], True], {}),
    ("aten.full.default", [[2, 0, 7], 1.0], {}),
    ("aten.full.default", [[3], 1], {"dtype": torch.float16}),
    ("aten.zeros.default", [[6, 7]], {}),
    ("aten.ones.default", [[6]], {"dtype": torch.int8}),
    ("aten.empty.memory_format", [[2, 3, 4]], {"dtype": torch.float64}),
    ("aten.rand.default", [[9]], {}),
    ("aten.randn.default", [[2, 2]], {"dtype": torch.float64}),
    ("aten.empty_strided.default", [[2, 3], [1, 2]], {}),
    ("aten.empty_strided.default", [[4, 5], [10, 1]], {"dtype": torch.int32}),
    ("aten.arange.default", [10], {}),
    ("aten.arange.default", [2.5], {}),
    ("aten.arange.start", [3, 11], {"dtype": torch.float32}),
    ("aten.arange.start_step", [0, 10, 3], {}),
    ("aten.arange.start_step", [0.5, 2.0, 0.25], {}),
    ("aten.arange.start_step", [10, 0, -3], {}),
    ("aten.scalar_tensor.default", [2.0], {}),
    ("aten.randperm.default", [7], {}),
    ("aten.new_full.default", [_T, [3], 1], {}),
    ("aten.new_zeros.default", [_T, [4, 2]], {"dtype": torch.int64}),
    ("aten.new_ones.default", [_T, [5]], {}),
    ("aten.new_empty.default", [_T, [3, 3]], {}),
    ("aten.new_empty_strided.default", [_T, [2, 3], [3, 1]], {}),
]


@pytest.mark.parametrize("name,args,kwargs", _CALLS, ids=[c[0] for c in _CALLS])
def test_creation_nbytes_matches_what_torch_allocates(name, args, kwargs):
    out = _overload(name)(*args, **kwargs)
    assert creation_nbytes(name, args, kwargs) == out.untyped_storage().nbytes()


def test_every_sized_creation_op_is_allowed():
    assert CREATION_OPS <= set(allowed_ops.CREATION)


def test_creation_nbytes_of_values_known_only_at_run_time():
    assert creation_nbytes("aten.full.default", [[UNKNOWN, 4], 1.0]) is None
    assert creation_nbytes("aten.new_zeros.default", [UNKNOWN, [4]]) is None  # self's dtype
    assert creation_nbytes("aten.new_zeros.default", [UNKNOWN, [4]],
                           {"dtype": "int32"}) == 16
    assert creation_nbytes("aten.full.default", [[2 ** 40], 1.0]) == 4 << 40
    assert creation_nbytes("aten.add.Tensor", [UNKNOWN, UNKNOWN]) is None
    with pytest.raises(VkDelegateError, match="bounds must be finite"):
        creation_nbytes("aten.arange.default", [float("inf")])
