"""The module suite: small modules that to_backend must run exactly like eager.

One ``Case`` per line. ``make`` builds the module, ``inputs`` gives (args, kwargs) with
seeded random data; ``dynamic`` gives torch.export dynamic_shapes and ``resized`` other
inputs in range to run after the export-size ones. ``cpu_ops`` names ops no Vulkan
implementation will take (the report must list them with a reason).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.export import Dim

nn = torch.nn


Pair = __import__("collections").namedtuple("Pair", ["total", "relu"])


class Record2(__import__("collections").OrderedDict):
    """A dict subclass torch's pytree flattens to its keys, as HF's ModelOutput."""


torch.utils._pytree.register_pytree_node(
    Record2, lambda r: (list(r.values()), list(r.keys())),
    lambda values, keys: Record2(zip(keys, values)),
    serialized_type_name="tests.program.modules.Record2")


class Fn(nn.Module):
    """A module whose forward is ``fn`` (no parameters)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class Counter(nn.Module):
    """Mutable state: a buffer incremented on every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count.add_(1.0)
        return x + self.count, self.count


class WithConstantBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.randn(5))

    def forward(self, x):
        return torch.relu(x - self.offset) + self.offset


class ReturnsParameterAndSize(nn.Module):
    """Outputs that are a parameter and a Python int (a dynamic size), not tensors."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return self.w, x.shape[0], torch.relu(x) + self.w


def conv_bn_relu():
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.Conv2d(4, 2, 1))
    m[1].running_mean.normal_()
    m[1].running_var.uniform_(0.5, 2.0)
    return m


def linear_bn():
    m = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3))
    m[1].running_mean.normal_()
    m[1].running_var.uniform_(0.5, 2.0)
    return m


def r(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype)


def ri(*shape, dtype=torch.int64):
    return torch.randint(-50, 50, shape, dtype=dtype)


def long_chain(x):
    for i in range(10):
        x = torch.relu(x + float(i)) - 0.5 * i
    return x


@dataclass
class Case:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple]
    dynamic: Optional[Callable[[], object]] = None
    resized: Optional[Callable[[], tuple]] = None
    cpu_ops: tuple = ()
    tol: float = 1e-4
    calls: int = 1
    #: (major, minor) of the oldest torch whose export handles the case
    min_torch: tuple = (0, 0)

    def exportable(self) -> bool:
        """Whether the installed torch's export handles this case (``min_torch``)."""
        version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
        return version >= self.min_torch


def _batch(lo=1, hi=32):
    return Dim("batch", min=lo, max=hi)


A = lambda *a: (a, {})  # noqa: E731  (positional args, no kwargs)

CASES = [
    Case("add_relu", lambda: Fn(lambda x, y: torch.relu(x + y)), lambda: A(r(3, 5), r(3, 5))),
    Case("elementwise_chain", lambda: Fn(lambda x: torch.tanh(torch.sigmoid(x) - torch.exp(-x.abs()))), lambda: A(r(7, 11))),
    Case("sqrt_abs_neg", lambda: Fn(lambda x: -torch.sqrt(x.abs() + 1e-3)), lambda: A(r(29))),
    Case("sin_cos_mul", lambda: Fn(lambda x: torch.sin(x) * torch.cos(x) + x), lambda: A(r(5, 3))),
    Case("broadcast_add", lambda: Fn(lambda x, y: x + y - y.sum()), lambda: A(r(3, 1, 5), r(4, 1))),
    Case("scalar_and_alpha", lambda: Fn(lambda x, y: torch.sub(x + 2.5, y, alpha=2)), lambda: A(r(2, 3), r(2, 3))),
    Case("rank6", lambda: Fn(lambda x: torch.relu(x) + x), lambda: A(r(2, 1, 3, 1, 2, 3))),
    Case("multiple_outputs", lambda: Fn(lambda x, y: (x + y, x - y, torch.relu(x))), lambda: A(r(4, 4), r(4, 4))),
    Case("nested_outputs", lambda: Fn(lambda x, y: {"a": x + y, "b": [torch.relu(x), (x - y, None)]}), lambda: A(r(3, 2), r(3, 2))),
    Case("named_outputs", lambda: Fn(lambda x, y: {"pair": Pair(x + y, torch.relu(x)), "rest": Record2(diff=x - y)}), lambda: A(r(3, 2), r(3, 2))),
    Case("repeated_output", lambda: Fn(lambda x: (lambda y: (y, y))(x + 1)), lambda: A(r(6))),
    Case("output_is_input", lambda: Fn(lambda x, y: (x, x + y, y)), lambda: A(r(2, 5), r(2, 5))),
    Case("unused_input", lambda: Fn(lambda x, unused: torch.relu(x)), lambda: A(r(3), r(8))),
    Case("zero_d_tensors", lambda: Fn(lambda x, y: (x + y, torch.relu(x - y))), lambda: A(r(), r())),
    Case("size_one_dims", lambda: Fn(lambda x, y: x + y), lambda: A(r(1, 1, 7), r(1, 1, 1))),
    Case("int64_in_out", lambda: Fn(lambda x, y: (x + y, x * 3, (x - y).float() + 0.5)), lambda: A(ri(4, 3), ri(4, 3))),
    Case("int32_add", lambda: Fn(lambda x, y: torch.relu(x + y) - y), lambda: A(ri(5, 3, dtype=torch.int32), ri(5, 3, dtype=torch.int32))),
    Case("bool_where", lambda: Fn(lambda x, y: torch.where(x > 0, torch.relu(x + y), y)), lambda: A(r(3, 4), r(3, 4))),
    Case("mixed_sort", lambda: Fn(lambda x: torch.sigmoid(torch.sort(torch.relu(x) + 1.0, dim=-1)[0])), lambda: A(r(3, 9)), cpu_ops=("aten.sort.default",)),
    Case("mixed_sinh", lambda: Fn(lambda x: torch.relu(torch.sinh(torch.tanh(x))) - x), lambda: A(r(4, 6)), cpu_ops=("aten.sinh.default",)),
    Case("index_with_0d_tensor", lambda: Fn(lambda x, t: x[t] * 2), lambda: A(r(5, 3), torch.tensor(2)), cpu_ops=("aten._local_scalar_dense.default", "aten.select.int"), min_torch=(2, 13)),
    Case("diamond", lambda: Fn(lambda x: (lambda a: (a + 1.0) + (a - 2.0))(torch.relu(x))), lambda: A(r(5, 5))),
    Case("long_chain", lambda: Fn(long_chain), lambda: A(r(3, 37))),
    Case("linear_stack", lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), lambda: A(r(5, 8))),
    Case("linear_bn", linear_bn, lambda: A(r(7, 6))),
    Case("conv_stack", lambda: nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Conv2d(6, 4, 3, stride=2, padding=1)), lambda: A(r(2, 3, 11, 13))),
    Case("conv_bn_relu", conv_bn_relu, lambda: A(r(1, 3, 7, 5))),
    Case("conv_relu6_clamp", lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU6(), nn.Conv2d(3, 2, 1), nn.Hardtanh(-0.5, 0.5)), lambda: A(r(2, 2, 9, 8) * 4)),
    Case("matmul", lambda: Fn(lambda x, y: torch.relu(x @ y) + 1.0), lambda: A(r(5, 3), r(3, 7))),
    Case("softmax_mean", lambda: Fn(lambda x: (torch.softmax(x, -1), x.mean(dim=1, keepdim=True) + x)), lambda: A(r(4, 10))),
    Case("constant_buffer", WithConstantBuffer, lambda: A(r(2, 5))),
    Case("mutable_buffer", Counter, lambda: A(r(3)), calls=3),
    Case("fp16", lambda: Fn(lambda x, y: torch.relu(x + y) - y), lambda: A(r(4, 5, dtype=torch.float16), r(4, 5, dtype=torch.float16)), tol=1e-3),
    Case("dict_input", lambda: Fn(lambda d: d["a"] + torch.relu(d["b"])), lambda: A({"a": r(3, 3), "b": r(3, 3)})),
    Case("kwargs_input", lambda: Fn(lambda x, *, bias: torch.tanh(x + bias)), lambda: ((r(2, 6),), {"bias": r(6)})),
    Case("non_contiguous_input", lambda: Fn(lambda x, y: x + y), lambda: A(r(6, 4).t(), r(4, 6)[:, ::2].repeat(1, 2))),
    Case("dynamic_batch", lambda: Fn(lambda x: torch.relu(x + 1.0) * 2.0), lambda: A(r(4, 5)),
         dynamic=lambda: ({0: _batch()},), resized=lambda: A(r(17, 5))),
    Case("dynamic_length", lambda: Fn(lambda x, y: torch.tanh(x) - y), lambda: A(r(2, 8), r(2, 8)),
         dynamic=lambda: (lambda t: ({1: t}, {1: t}))(Dim("length", min=2, max=64)), resized=lambda: A(r(2, 63), r(2, 63))),
    Case("dynamic_with_cpu_op", lambda: Fn(lambda x: torch.sigmoid(torch.sort(x + 1.0)[0])), lambda: A(r(3, 6)),
         dynamic=lambda: ({0: _batch(2, 8)},), resized=lambda: A(r(8, 6)), cpu_ops=("aten.sort.default",)),
    Case("dynamic_reshape_permute", lambda: Fn(lambda x: (lambda y: (y.reshape(y.shape[0], -1) + 1.0, y.permute(0, 2, 1)))(torch.relu(x))), lambda: A(r(4, 3, 5)),
         dynamic=lambda: ({0: _batch(2, 16)},), resized=lambda: A(r(9, 3, 5))),
    Case("parameter_and_size_outputs", ReturnsParameterAndSize, lambda: A(r(4, 3)),
         dynamic=lambda: ({0: _batch(2, 8)},), resized=lambda: A(r(7, 3))),
    Case("dynamic_linear", lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU()), lambda: A(r(3, 4)),
         dynamic=lambda: ({0: _batch()},), resized=lambda: A(r(31, 4))),
    # Two symbolic view sizes and a symbolic arange end: SymInt values in the delegate.
    Case("dynamic_symbolic_sizes", lambda: Fn(lambda x: (x.reshape(x.shape[1], x.shape[0], 5) * 2.0, torch.arange(x.shape[0], dtype=torch.float32) + 1.0)), lambda: A(r(4, 3, 5)),
         dynamic=lambda: ({0: _batch(1, 9), 1: Dim("rows", min=1, max=9)},), resized=lambda: A(r(9, 2, 5))),
]
