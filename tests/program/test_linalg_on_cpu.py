"""torch.linalg.inv, torch.inverse, linalg.solve and linalg.cholesky: their
decomposition threads an effect token through the error check (``with_effects(token,
aten._linalg_check_errors, ...)``); lowering unwraps it, the linear algebra and the
check run on the CPU, the rest of the model on Vulkan, and a singular matrix raises as
in eager, also after save and load."""
import re

import pytest
import torch

import vkdelegate
from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend
from vkdelegate.backend.program_graph import from_exported_program
from torch.export.graph_signature import InputKind

from tests.torch_version import TORCH

#: On the GPU machine's torch 2.11 the export of torch.linalg.inv / solve / cholesky has
#: no error check (no aten._linalg_check_errors, no effect token), so a program lowered
#: there raises nothing for a singular matrix (seen on an H100 lease, 2026-12-06). torch
#: 2.13 (the pinned version) exports the check.
pytestmark = pytest.mark.skipif(
    TORCH < (2, 13), reason=f"torch {torch.__version__}'s export of linalg has no error "
                            f"check (aten._linalg_check_errors needs torch 2.13)")


class Inv(torch.nn.Module):
    def forward(self, a):
        return torch.linalg.inv(a) + 1


class Inverse(torch.nn.Module):
    def forward(self, a):
        return torch.inverse(a) * 2


class Solve(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(torch.linalg.solve(a, b))


class Cholesky(torch.nn.Module):
    def forward(self, a):
        return torch.linalg.cholesky(a @ a.mT + torch.eye(3)) - 1


class Det(torch.nn.Module):
    def forward(self, a):
        return torch.linalg.det(a) + 1


def _square(seed=0, batch=()):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, 3, 3, generator=g) + 3 * torch.eye(3)


#: (module, inputs, the op left on the CPU, the model's call it comes from)
CASES = {
    "inv": (Inv(), lambda s: (_square(s),), "aten.linalg_inv_ex.default", "linalg_inv"),
    "inverse": (Inverse(), lambda s: (_square(s, (2,)),), "aten.linalg_inv_ex.default",
                "inverse"),
    "solve": (Solve(), lambda s: (_square(s), torch.randn(3, 2)),
              "aten._linalg_solve_ex.default", "linalg_solve"),
    "cholesky": (Cholesky(), lambda s: (_square(s),), "aten.linalg_cholesky_ex.default",
                 "linalg_cholesky"),
}


def _lower(module, inputs, executor):
    return to_backend(torch.export.export(module, inputs), VulkanPartitioner(
        {"executor": executor}))


@pytest.mark.parametrize("case", sorted(CASES))
def test_linalg_runs_on_the_cpu_and_the_rest_on_vulkan(case, executor, tmp_path):
    module, inputs, op, call = CASES[case]
    program = _lower(module, inputs(0), executor)
    cpu = {d.op: d.reasons for d in program.report.cpu_nodes}
    assert cpu[op] == [f"no Vulkan implementation of {op} (from the model's {call})"]
    # Only the linear algebra stays on the CPU: the model's other ops run on Vulkan.
    assert set(cpu) == {op, "operator.getitem", "aten._linalg_check_errors.default"}
    assert program.report.num_partitions >= 1
    assert [i["name"] for i in program.methods["forward"].plan["inputs"]] == [
        s.arg.name for s in torch.export.export(module, inputs(0)).graph_signature
        .input_specs]  # no token input
    for seed in (1, 2):
        args = inputs(seed)
        torch.testing.assert_close(program(*args), module(*args), rtol=1e-5, atol=1e-5)
    program.save(tmp_path / "p.vkdp")
    with vkdelegate.load(tmp_path / "p.vkdp") as loaded:
        args = inputs(3)
        torch.testing.assert_close(loaded(*args), module(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case,bad,eager_text", [
    ("inv", lambda: (torch.zeros(3, 3),), "linalg.inv: The diagonal element 1 is zero"),
    ("inverse", lambda: (torch.stack([torch.eye(3), torch.zeros(3, 3)]),),
     "linalg.inv: (Batch element 1): The diagonal element 1 is zero"),
    ("solve", lambda: (torch.ones(3, 3), torch.randn(3, 2)),
     "torch.linalg.solve: The solver failed because the input matrix is singular"),
    ("cholesky", lambda: (torch.full((3, 3), float("nan")),), "linalg.cholesky"),
])
def test_a_singular_matrix_raises_as_in_eager(case, bad, eager_text, tmp_path):
    module, inputs, _, _ = CASES[case]
    program = _lower(module, inputs(0), "reference")
    with pytest.raises(RuntimeError, match=re.escape(eager_text)):
        module(*bad())
    program.save(tmp_path / "p.vkdp")
    with vkdelegate.load(tmp_path / "p.vkdp") as loaded:
        for runner in (program, loaded):
            with pytest.raises(VkDelegateError, match=re.escape(
                    "CPU op aten._linalg_check_errors.default (node "
                    "_linalg_check_errors_default) failed: _LinAlgError: "
                    + eager_text)):
                runner(*bad())


def test_the_token_is_gone_from_the_program_graph():
    ep = torch.export.export(Inv(), (_square(),))
    decomposed = ep.run_decompositions(torch.export.default_decompositions())
    assert InputKind.TOKEN in {s.kind for s in decomposed.graph_signature.input_specs}
    pg = from_exported_program(ep)
    assert pg.user_inputs == ["a"] and not pg.constants
    targets = [str(n.target) for n in pg.gm.graph.nodes if n.op == "call_function"]
    assert "aten._linalg_check_errors.default" in targets
    assert not any("with_effects" in t for t in targets)


def test_an_op_off_the_list_is_refused_naming_the_models_call():
    ep = torch.export.export(Det(), (_square(),))
    with pytest.raises(VkDelegateError, match=re.escape(
            "node _linalg_det (from the model's linalg_det), which stays on the CPU, calls "
            "aten._linalg_det.default, which a program's CPU part may not call (not on "
            "the glue allow-list); docs/LOWERING.md lists what it may call")):
        to_backend(ep, VulkanPartitioner({"executor": "reference"}))


_EFFECT_LIB = None


@pytest.mark.skipif(not hasattr(torch.library, "_register_effectful_op"),
                    reason=f"torch {torch.__version__} cannot declare an effectful op")
def test_an_effectful_custom_op_is_refused_by_name_not_as_a_token():
    global _EFFECT_LIB
    if _EFFECT_LIB is None:
        _EFFECT_LIB = torch.library.Library("vkd_effect_test", "FRAGMENT")
        _EFFECT_LIB.define("note(Tensor x) -> ()")
        _EFFECT_LIB.impl("note", lambda x: None, "CompositeExplicitAutograd")
        from torch._higher_order_ops.effects import _EffectType

        torch.library._register_effectful_op(torch.ops.vkd_effect_test.note.default,
                                             _EffectType.ORDERED)

    class Noted(torch.nn.Module):
        def forward(self, x):
            torch.ops.vkd_effect_test.note(x)
            return x + 1

    ep = torch.export.export(Noted(), (torch.randn(3),))
    decomposed = ep.run_decompositions(torch.export.default_decompositions())
    assert InputKind.TOKEN in {s.kind for s in decomposed.graph_signature.input_specs}
    with pytest.raises(VkDelegateError, match=re.escape(
            "calls vkd_effect_test.note.default, which a program's CPU part may not call "
            "(not on the glue allow-list: a custom operator)")):
        to_backend(ep, VulkanPartitioner({"executor": "reference"}))
