"""Torch-free input/output structure: round trip against torch's pytree."""
import pytest
import torch
import torch.utils._pytree as pytree

from vkdelegate.backend import pytree_spec
from vkdelegate.errors import VkDelegateError


@pytest.mark.parametrize("value", [
    (1, 2), [1, (2, 3)], {"a": 1, "b": (2, [3, 4])}, 7, (None, 5), ((), {"k": [1]}),
])
def test_matches_torch_pytree(value):
    leaves, spec = pytree.tree_flatten(value)
    ours = pytree_spec.from_treespec(spec)
    pytree_spec.validate(ours)
    assert pytree_spec.flatten(value, ours) == leaves
    assert pytree_spec.num_leaves(ours) == len(leaves)
    assert pytree_spec.unflatten(leaves, ours) == value


def test_mismatch_names_position():
    spec = pytree_spec.from_treespec(pytree.tree_flatten(((1, 2), {}))[1])
    with pytest.raises(VkDelegateError, match=r"arguments\[0\]: expected 2 items, got 3"):
        pytree_spec.flatten(((1, 2, 3), {}), spec, "arguments")


def test_unsupported_container():
    """A pytree node that is neither a sequence, a dict, a namedtuple nor a dict-like
    record (torch.utils._pytree registers deque) is refused by name."""
    from collections import deque, namedtuple

    with pytest.raises(VkDelegateError, match="container type deque .* not supported"):
        pytree_spec.from_treespec(pytree.tree_flatten(deque([1, 2]))[1])
    Point = namedtuple("Point", "x y")  # supported since 2026-12-05
    spec = pytree_spec.from_treespec(pytree.tree_flatten(Point(1, 2))[1])
    assert spec == {"t": "namedtuple", "n": "Point", "k": ["x", "y"],
                    "c": [{"t": "leaf"}, {"t": "leaf"}]}
    assert pytree_spec.unflatten([3, 4], spec) == (3, 4)


def test_torch_return_types():
    """A torch.return_types structseq: its fields by name; unflatten gives the torch
    class back only when asked (torch_types), else a namedtuple of the same fields."""
    x = torch.tensor([3.0, 1.0, 2.0])
    result = torch.topk(x, 2)
    leaves, spec = pytree.tree_flatten(result)
    ours = pytree_spec.from_treespec(spec)
    assert ours == {"t": "structseq", "n": "topk", "k": ["values", "indices"],
                    "c": [{"t": "leaf"}, {"t": "leaf"}]}
    pytree_spec.validate(ours)
    assert pytree_spec.flatten(result, ours) == leaves
    again = pytree_spec.unflatten(leaves, ours, torch_types=True)
    assert type(again) is torch.return_types.topk
    assert torch.equal(again.values, result.values)
    plain = pytree_spec.unflatten(leaves, ours)
    assert type(plain).__name__ == "topk" and plain._fields == ("values", "indices")
    assert torch.equal(plain.indices, torch.tensor([0, 2]))
    # A name or fields this torch has no class for: a namedtuple still.
    other = dict(ours, k=["values", "where"])
    assert pytree_spec.unflatten(leaves, other, torch_types=True)._fields == (
        "values", "where")


@pytest.mark.parametrize("bad", [{"t": "set"}, {"t": "tuple"}, {"t": "dict", "k": [1],
                                                                  "c": [{"t": "leaf"}]}])
def test_validate_rejects_malformed(bad):
    with pytest.raises(VkDelegateError, match="malformed tree spec"):
        pytree_spec.validate(bad)
