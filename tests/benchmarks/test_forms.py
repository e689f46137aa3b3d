"""benchmarks/forms.py: a kernel form sets an UPPER_CASE module constant of the kernels
or op families for a run and restores it; a name that is not such a constant, a value
that is not JSON or not of the constant's type is refused before any work."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import forms  # noqa: E402

from vkdelegate.kernels import conv_pointwise  # noqa: E402


class Refused(Exception):
    pass


def _error(message):
    raise Refused(message)


def test_apply_and_restore():
    before = conv_pointwise.SPLIT_WORKGROUPS
    parsed = forms.parse(["conv_pointwise.SPLIT_WORKGROUPS=7", "conv_pointwise.SPLIT_K=false"],
                         _error)
    saved = forms.apply(parsed, _error)
    try:
        assert conv_pointwise.SPLIT_WORKGROUPS == 7 and conv_pointwise.SPLIT_K is False
    finally:
        forms.apply(saved, _error)
    assert conv_pointwise.SPLIT_WORKGROUPS == before and conv_pointwise.SPLIT_K is True


@pytest.mark.parametrize("item,reason", [
    ("conv_pointwise.SPLIT_K", "expected MODULE.CONSTANT=VALUE"),
    ("conv_pointwise.SPLIT_K=yes", "not JSON"),
    ("conv_pointwise.SPLIT_K=\"yes\"", "SPLIT_K is a bool"),
    ("conv_pointwise.SPLIT_WORKGROUPS=64.5", "SPLIT_WORKGROUPS is an int"),
    ("conv_pointwise.SPLIT_WORKGROUPS=true", "SPLIT_WORKGROUPS is an int"),
    ("conv_pointwise.np=1", "not an UPPER_CASE module constant"),
    ("nosuch.X=1", "no such module constant"),
])
def test_refused(item, reason):
    before = (conv_pointwise.SPLIT_K, conv_pointwise.SPLIT_WORKGROUPS)
    with pytest.raises(Refused, match=reason):
        forms.parse([item], _error, "--form")
    assert (conv_pointwise.SPLIT_K, conv_pointwise.SPLIT_WORKGROUPS) == before
