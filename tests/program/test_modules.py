"""The module suite (modules.py) lowered and compared with eager within 1e-4."""
import pytest
import torch

from .helpers import lower_and_compare
from .modules import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_eager(case, executor):
    if not case.exportable():
        pytest.skip(f"torch {torch.__version__}'s export cannot trace {case.name} "
                    f"(it needs torch >= {'.'.join(map(str, case.min_torch))})")
    program = lower_and_compare(case, executor)
    report = program.report
    for node in report.cpu_nodes:
        assert node.reasons, f"{node.name} ({node.op}) on CPU without a reason"
    cpu_ops = {n.op for n in report.cpu_nodes}
    for op in case.cpu_ops:
        assert op in cpu_ops, f"{op} should be reported on the CPU"


def test_suite_size():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)
