"""Views that share their input's memory (OpSpec ``may_alias``, memory planning) and
permutes of size-1 dims lowered as views (passes/permute_to_view): values against eager,
and no copy dispatch for them."""
import pytest
import torch

from .harness import check_op


def _dispatched_ops(program, *inputs) -> list[str]:
    program.set_profiling(True)
    with torch.no_grad():
        program(*inputs)
    return [d.op for _, profile in program.last_profiles() for d in profile.dispatches]


def _delegated(program) -> list[str]:
    from .harness import delegated_nodes
    return [name for name, _ in delegated_nodes(program)]


class OneToken(torch.nn.Module):
    """An LLM decode step's head split: [1, 1, H*D] -> [1, H, 1, D] and back."""

    def forward(self, x, scale):
        q = (x * 2.0).view(1, 1, 4, 8).transpose(1, 2)
        q = torch.tanh(q) * scale                          # [1, 4, 1, 8]
        return q.transpose(1, 2).reshape(1, 1, 32) + x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_one_token_head_split_runs_without_copies(dtype):
    x = torch.randn(1, 1, 32, dtype=dtype)
    scale = torch.randn(1, 4, 1, 8, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-3  # fp16: tanh and two roundings
    program = check_op(OneToken(), (x, scale), ops=["aten.view.default"],
                       rtol=tol, atol=tol)
    assert "aten.permute.default" not in _delegated(program)
    ops = _dispatched_ops(program, x, scale)
    assert ops and not any("view" in op or "permute" in op for op in ops), ops


class ViewsOfIntermediates(torch.nn.Module):
    def forward(self, x):
        a = torch.tanh(x)
        v = a.view(-1).unsqueeze(0)                # aliases of a
        b = torch.exp(a) * 2.0                     # reads a while v is live
        c = v.squeeze(0).view(x.shape) + b         # the alias read after b
        return c.relu(), b.reshape(-1)             # an output view: copied


def test_views_of_intermediates_alias_and_resize():
    batch = torch.export.Dim("batch", min=1, max=16)
    x = torch.randn(6, 5)
    program = check_op(ViewsOfIntermediates(), (x,), ops=["aten.view.default"],
                       rtol=1e-5, atol=1e-5, dynamic_shapes=({0: batch},),
                       resize_inputs=[(torch.randn(3, 5),), (torch.randn(16, 5),)],
                       options={"fuse_elementwise": False})
    ops = _dispatched_ops(program, x)
    # Only the output's reshape copies (the program's result needs memory of its own).
    views = [op for op in ops if op in ("aten.view.default", "aten.unsqueeze.default",
                                        "aten.squeeze.dims")]
    assert views == ["aten.view.default"], ops


def test_permute_that_moves_data_stays_a_permute():
    def fn(x):
        return (torch.tanh(x).transpose(0, 2) * 3.0).contiguous()
    x = torch.randn(2, 1, 3)
    program = check_op(fn, (x,), ops=["aten.permute.default"], rtol=1e-5, atol=1e-5,
                       options={"fuse_elementwise": False})
    assert "aten.permute.default" in _dispatched_ops(program, x)
