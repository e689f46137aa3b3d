"""The fuzz harness (fuzz/) itself: every target runs its seeds clean, the checks
report what they promise, and the program-file mutator keeps checksums valid.

Quick (seconds): the corpus is a few small programs plus the ET-VK blobs, and nothing
is fuzzed here; ``make fuzz`` does that (docs/FUZZING.md).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import mutate
from fuzz.checks import GiB, Guard
from fuzz.corpus import PROGRAMS, build_corpus
from fuzz.run import replay
from fuzz.targets import TARGETS, check_message
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VkDelegateError
from vkdelegate.serialization import program_file

REPO = Path(__file__).resolve().parents[2]
_SMALL = [p for p in PROGRAMS if p[0] in ("conv_net", "glue_sort", "mutable_state", "llm")]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    return build_corpus(tmp_path_factory.mktemp("seeds"), programs=_SMALL)


@pytest.mark.parametrize("target", TARGETS)
def test_every_seed_runs_clean(seeds, target):
    files = sorted((seeds / target).iterdir())
    # ET-VK blobs too; the pte target's seeds are the committed .pte files.
    assert len(files) >= {"program": 3, "pte": 4}.get(target, 6)
    assert replay(target, files, seeds) == {}


def test_truncated_seeds_are_refused_not_crashed(seeds):
    # Every prefix of a program file must be refused with VkDelegateError only.
    data = (seeds / "program" / "glue_sort.vkp").read_bytes()
    cuts = sorted(set(range(0, len(data), max(1, len(data) // 40))))
    for target in ("program", "inspect"):
        from fuzz.targets import make_target

        guard = Guard(target, keep_going=True)
        run = make_target(target, str(seeds))
        for cut in cuts:
            guard.run(run, data[:cut])
        assert guard.findings == {}, guard.reports


def test_an_escaping_exception_is_a_finding_saved_with_its_input(tmp_path):
    def target(data):
        if data == b"bad":
            {}["missing"]
        raise VkDelegateError("refused")  # the accepted answer: no finding

    guard = Guard("demo", keep_going=True, findings_dir=tmp_path)
    for data in (b"ok", b"bad", b"bad"):
        guard.run(target, data)
    (sig, times), = guard.findings.items()
    assert sig.startswith("KeyError at test_fuzz_harness.py:") and times == 2
    saved, = tmp_path.glob("demo-*.bin")
    assert saved.read_bytes() == b"bad"
    assert "KeyError: 'missing'" in saved.with_suffix(".txt").read_text()
    with pytest.raises(KeyError):  # fail-fast mode raises it for atheris to report
        Guard("demo").run(target, b"bad")


def _refuse(name: str):
    raise VkDelegateError(f"operator {name} is not supported")


def test_an_error_message_that_is_not_one_printable_line_is_a_finding():
    """A string from the input echoed raw into a VkDelegateError (here \\x1c, which
    str.splitlines splits on): the finding is signed by the frame that raised it."""
    def target(data):
        try:
            _refuse(data.decode())
        except VkDelegateError as exc:
            check_message(exc)

    guard = Guard("demo", keep_going=True, quiet=True)
    for data in (b"aten.add.Tensor", b"'aten.add\\x1c'", b"aten.add\x1c", b"a\nb"):
        guard.run(target, data)
    (sig, times), = guard.findings.items()
    assert times == 2 and sig == (f"MessageTextError at test_fuzz_harness.py:"
                                  f"{_refuse.__code__.co_firstlineno + 1}")


def test_an_input_over_the_memory_budget_is_a_finding():
    def target(data):
        block = bytearray(96 << 20)  # bytearray zero-fills: the pages are touched
        del block

    guard = Guard("demo", keep_going=True, rss_budget=32 << 20)
    guard.run(target, b"")
    assert list(guard.findings) == ["MemoryBudgetError"]
    assert "(budget 0.03 GiB)" in guard.reports["MemoryBudgetError"]
    roomy = Guard("demo", keep_going=True, rss_budget=2 * GiB)
    roomy.run(target, b"")
    assert roomy.findings == {}


def test_a_hang_prints_the_stack_and_ends_the_run():
    code = ("import time\nfrom fuzz.checks import Guard\n"
            "def slow_target(data):\n    time.sleep(30)\n"
            "Guard('demo', hang_s=1, exit_on_hang=True).run(slow_target, b'')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=25)
    assert done.returncode != 0
    assert "Timeout (0:00:01)!" in done.stderr and "in slow_target" in done.stderr


def test_mutated_program_files_keep_valid_checksums(seeds, tmp_path):
    data = (seeds / "program" / "conv_net.vkp").read_bytes()
    manifest, segments = mutate.decode(data)
    assert mutate.encode(manifest, segments) == data
    reversed_bytes = lambda b, n: bytes(b)[::-1][:n]  # noqa: E731 - stands in for atheris
    past_checksums = 0
    for seed in range(40):
        out = mutate.mutate(data, 1 << 20, seed, reversed_bytes)
        path = tmp_path / "m.vkp"
        path.write_bytes(out)
        try:
            program_file.read_program(path)
            past_checksums += 1
        except VkDelegateError as exc:
            assert "checksum" not in str(exc) or out[:8] != program_file.MAGIC
        except RecursionError:
            past_checksums += 1  # deep JSON reached the parser (a finding, not ours)
    assert past_checksums >= 25


@pytest.mark.slow
def test_atheris_worker_runs_the_seeds(seeds, tmp_path):
    pytest.importorskip("atheris")
    (tmp_path / "seeds").symlink_to(seeds)  # fuzz.run uses WORKDIR/seeds as built
    done = subprocess.run([sys.executable, "-m", "fuzz.run", "--seeds-only",
                           "--target", "inspect", "--workdir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["inspect"]["findings"] == {}
    assert summary["inspect"]["executions"] >= len(list((seeds / "inspect").iterdir()))


FINDINGS = REPO / "fuzz" / "findings"


@pytest.mark.parametrize("target", TARGETS)
def test_every_saved_finding_is_fixed(seeds, target):
    """Each input a fuzz run found (fuzz/findings/) now gives a program or a
    VkDelegateError on every target that reads its kind of file."""
    kind = "program-" if target in ("program", "inspect") else "blob-"
    kind = ("pte-", "program-") if target == "pte" else kind  # program files: refused
    files = sorted(p for p in FINDINGS.iterdir() if p.name.startswith(kind))
    if target == "inspect":
        files += sorted(p for p in FINDINGS.iterdir() if p.name.startswith("blob-"))
    assert files
    assert replay(target, files, seeds) == {}
