"""count_calls: exact call counts (the node-count independence test relies on them),
the previous profile function restored, exceptions passed through. Torch-free."""
import sys

import pytest

from vkdelegate.runtime.host_calls import count_calls


def _helper():
    return None


def test_counts_python_and_c_calls_exactly():
    base = count_calls(lambda: None)
    assert count_calls(lambda: (len("a"), len("b"), len("c"))) - base == 3
    assert count_calls(lambda: (_helper(), _helper(), abs(-1))) - base == 3


def test_restores_previous_profile_and_propagates_errors():
    seen = []

    def outer(frame, event, arg):
        seen.append(event)
    sys.setprofile(outer)
    try:
        with pytest.raises(ZeroDivisionError):
            count_calls(lambda: 1 / 0)
        restored = sys.getprofile()
    finally:
        sys.setprofile(None)
    assert restored is outer
