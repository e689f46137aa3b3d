"""The harness itself: it must fail when an op is not delegated or results differ."""
import pytest
import torch

from tests.ops import coverage
from tests.ops.harness import assert_matches_eager, check_op


def test_check_op_passes_and_records_coverage():
    torch.manual_seed(0)
    check_op(torch.add, (torch.randn(3, 5), torch.randn(5)), ops=["aten.add.Tensor"])
    assert ("aten.add.Tensor", ("float32", "float32", "float32")) in coverage.RAN
    assert coverage.VARIANTS["aten.add.Tensor"]


def test_check_op_fails_when_the_op_is_not_delegated():
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="aten.mul.Tensor is not in any delegate"):
        check_op(torch.add, (torch.randn(3), torch.randn(3)), ops=["aten.mul.Tensor"])


def test_comparison_checks_values_dtype_and_shape():
    x = torch.arange(6.0).reshape(2, 3)
    assert_matches_eager(x.clone(), x, 1e-4, 1e-4)
    with pytest.raises(AssertionError):
        assert_matches_eager(x + 1e-2, x, 1e-4, 1e-4)
    with pytest.raises(AssertionError, match="dtype"):
        assert_matches_eager(x.half(), x, 1e-4, 1e-4)
    with pytest.raises(AssertionError, match="shape"):
        assert_matches_eager(x.reshape(3, 2), x, 1e-4, 1e-4)
    with pytest.raises(AssertionError, match="elements differ"):
        assert_matches_eager(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]), 0, 0)


def test_partial_selection_is_detected():
    # The registry coverage test may only judge a session that ran every op test.
    from types import SimpleNamespace

    from tests.ops import conftest

    here = conftest._HERE
    files = sorted(p.name for p in here.glob("test_*.py"))
    items = [SimpleNamespace(path=here / name, nodeid=f"tests/ops/{name}::t")
             for name in files]

    def config(keyword="", markexpr="", args=("tests",)):
        return SimpleNamespace(option=SimpleNamespace(keyword=keyword, markexpr=markexpr),
                               args=list(args))

    saved = list(conftest._deselected_here)
    conftest._deselected_here.clear()
    try:
        assert conftest._partial_reason(config(), items) is None
        assert "-k" in conftest._partial_reason(config(keyword="add"), items)
        assert "-m" in conftest._partial_reason(config(markexpr="slow"), items)
        assert "node id" in conftest._partial_reason(
            config(args=["tests/ops/test_unary.py::test_resize"]), items)
        assert files[0] in conftest._partial_reason(config(), items[1:])
        conftest._deselected_here.append("tests/ops/test_unary.py::test_resize")
        assert "deselected" in conftest._partial_reason(config(), items)
    finally:
        conftest._deselected_here[:] = saved
