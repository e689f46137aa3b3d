"""Calls with odd inputs: a VkDelegateError naming the input, or (for views numpy
and torch can copy) the same result as eager; never NotImplementedError, TypeError or
a torch RuntimeError."""
import warnings

import numpy as np
import pytest
import torch

import vkdelegate
from vkdelegate import VkDelegateError

from . import crafted


@pytest.fixture
def program(tmp_path):
    """A fresh program each test: its state (a call counter) starts at 0, as eager's."""
    return vkdelegate.load(crafted.write_raw(tmp_path / "p.vkp", crafted.manifest()))


def _eager(x):
    torch.manual_seed(0)
    return crafted.Glue()(torch.as_tensor(np.ascontiguousarray(x)))


def _odd(kind):
    x = crafted.example()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR and nested tensors are "beta"
        return {
            "meta": lambda: torch.empty(3, 4, device="meta"),
            "sparse_coo": lambda: x.to_sparse(),
            "sparse_csr": lambda: x.to_sparse_csr(),
            "nested": lambda: torch.nested.nested_tensor([x[0], x[1], x[2]]),
            "complex": lambda: torch.randn(3, 4, dtype=torch.complex64),
            "object_array": lambda: np.empty((3, 4), dtype=object),
            "zero_d": lambda: np.array(1.0, dtype=np.float32),
            "one_d": lambda: np.zeros(4, dtype=np.float32),
            "two_tensor": lambda: _two_tensor(x),
            "fake": lambda: _fake(x.shape),
        }[kind]()


def _two_tensor(x):
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(x.clone(), x.clone())


def _fake(shape):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(shape)


@pytest.mark.parametrize("kind, message", [
    ("meta", r"input 'x' is on the meta device, which holds no data"),
    ("sparse_coo", r"input 'x' has layout torch.sparse_coo; only dense \(strided\) "
                   r"tensors can be passed"),
    ("sparse_csr", r"input 'x' has layout torch.sparse_csr; only dense"),
    ("nested", r"input 'x' is a nested tensor; only dense"),
    ("complex", r"input 'x' has dtype complex64, expected float32\[3, 4\]"),
    ("object_array", r"input 'x' has dtype object, expected float32\[3, 4\]"),
    ("zero_d", r"input 'x' has rank 0, expected 2"),
    ("one_d", r"input 'x' has rank 1, expected 2"),
    # A RuntimeError from .numpy() until 2027-01.
    ("two_tensor", r"^input 'x' is a TwoTensor, a tensor subclass with its own "
                   r"__torch_dispatch__, which holds no plain data to pass; give a plain "
                   r"torch.Tensor$"),
    ("fake", r"^input 'x' is a FakeTensor, a tensor subclass"),
])
def test_odd_input_names_the_input(program, kind, message):
    with pytest.raises(VkDelegateError, match=message):
        program(_odd(kind))


class _Traced(torch.Tensor):
    """A subclass that only overrides __torch_function__: plain data underneath."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("wrap", [torch.nn.Parameter, lambda t: t.as_subclass(_Traced)],
                         ids=["parameter", "torch_function_subclass"])
def test_plain_tensor_subclasses_give_the_eager_result(program, wrap):
    x = crafted.example()
    got = program(wrap(x.clone()))
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, _eager(x.numpy()))


@pytest.mark.parametrize("view", [
    lambda a: np.repeat(a, 2, axis=1)[:, ::2],            # non-contiguous numpy
    lambda a: np.ascontiguousarray(a[::-1])[::-1],        # negative strides
    lambda a: torch.from_numpy(np.ascontiguousarray(a.T)).t(),  # transposed tensor
    lambda a: torch.from_numpy(-a)._neg_view(),           # torch's lazy negation bit
])
def test_views_give_the_eager_result(program, view):
    x = crafted.example().numpy()
    got = program(view(x))
    torch.testing.assert_close(torch.as_tensor(np.asarray(got)), _eager(x))
