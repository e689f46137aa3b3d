"""Calling a lowered program by keyword, clear errors for wrong arguments, and
state_dict's value type before and after a call."""
import numpy as np
import pytest
import torch

from vkdelegate import VkDelegateError, VulkanPartitioner, to_backend


class Scale(torch.nn.Module):
    def forward(self, x, y):
        return x * 2.0 - y


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x)
        return self.total * 1.5


def _lower(module, args, kwargs=None):
    ep = torch.export.export(module, args, kwargs)
    return to_backend(ep, VulkanPartitioner({"executor": "reference"}))


@pytest.fixture(scope="module")
def scale():
    torch.manual_seed(0)
    return _lower(Scale(), (torch.randn(4), torch.randn(4)))


def test_keyword_calls_match_eager(scale):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    want = Scale()(x, y)
    torch.testing.assert_close(scale(x=x, y=y), want)
    torch.testing.assert_close(scale(y=y, x=x), want)
    torch.testing.assert_close(scale(x, y=y), want)


@pytest.mark.parametrize("call, text", [
    (lambda p, x: p(x, x, x), r"forward takes 2 input\(s\) \(x, y\); got 3 positional"),
    (lambda p, x: p(x, z=x), r"forward takes 2 input\(s\) \(x, y\); got unexpected "
                             r"keyword 'z'"),
    (lambda p, x: p(x, x=x), r"got 'x' both by position and by keyword"),
    (lambda p, x: p(y=x), r"forward takes 2 input\(s\) \(x, y\); missing x"),
    (lambda p, x: p(), r"missing x, y"),
])
def test_wrong_arguments_name_the_inputs(scale, call, text):
    with pytest.raises(VkDelegateError, match=text):
        call(scale, torch.randn(4))


def test_exported_keyword_inputs():
    torch.manual_seed(2)
    x, y = torch.randn(4), torch.randn(4)
    program = _lower(Scale(), (x,), {"y": y})
    torch.testing.assert_close(program(x, y=y), Scale()(x, y))
    torch.testing.assert_close(program(x=x, y=y), Scale()(x, y))
    with pytest.raises(VkDelegateError, match=r"keyword input\(s\) \(y\); missing y"):
        program(x)


def test_state_dict_is_torch_before_and_after_calls():
    gen = torch.Generator().manual_seed(3)
    program = _lower(Counter(), (torch.zeros(3),))
    eager = Counter()
    before = program.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in before.values())
    for _ in range(2):
        x = torch.randn(3, generator=gen)
        eager(x)
        program(x)
        after = program.state_dict()
        assert list(after) == list(before)
        assert all(isinstance(v, torch.Tensor) for v in after.values())
        # program-level state is keyed by the buffer's FQN (issue 14)
        torch.testing.assert_close(after["total"], eager.total)
    # numpy inputs leave numpy arrays in the runner; state_dict still gives tensors
    x = np.random.default_rng(4).standard_normal(3).astype(np.float32)
    eager(torch.from_numpy(x))
    program(x)
    (value,) = program.state_dict().values()
    assert isinstance(value, torch.Tensor)
    torch.testing.assert_close(value, eager.total)
