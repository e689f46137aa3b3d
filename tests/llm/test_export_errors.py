"""vkdelegate.llm.lower's export step: a failed export is a short VkDelegateError with
torch's error chained, and an attribute a trace assigned does not keep a fake tensor."""
import pytest
import torch
from torch import nn

from vkdelegate.errors import VkDelegateError
from vkdelegate.llm.lower import _export


class _Raises(nn.Module):
    def forward(self, x):
        raise AssertionError("the first line\n" + "\n".join(f"internal {i}" for i in range(60)))


def test_failed_export_is_a_few_lines_with_the_cause_chained():
    with pytest.raises(VkDelegateError) as info:
        _export(_Raises(), (torch.zeros(2),), None, "decode")
    lines = str(info.value).splitlines()
    assert len(lines) <= 3, lines
    assert lines[0].startswith("exporting method 'decode' failed: AssertionError: "
                               "the first line (raised at ")
    assert "test_export_errors.py" in lines[0] and "in forward" in lines[0]
    assert "__cause__" in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, AssertionError) and "internal 59" in str(cause)


class _Lazy(nn.Module):
    """Assigns a plain tensor attribute on its first forward (as transformers'
    LongRoPE does with ``long_inv_freq``)."""

    def forward(self, x):
        if getattr(self, "table", None) is None:
            self.table = torch.arange(4, dtype=torch.float32)
        return x + self.table


def test_attribute_assigned_during_export_holds_no_fake_tensor():
    from torch._subclasses.fake_tensor import FakeTensor

    module = _Lazy()
    for name in ("prefill", "decode"):  # the second export saw the first's fake tensor
        program = _export(module, (torch.ones(4),), None, name)
        assert not isinstance(getattr(module, "table", None), FakeTensor)
    assert torch.equal(program.module()(torch.ones(4)), torch.arange(1.0, 5.0))
