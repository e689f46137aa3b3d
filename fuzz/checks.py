"""What counts as a finding, and how one input is run under watch.

``Guard.run(target, data)`` runs one input with

- a hang watchdog: ``faulthandler.dump_traceback_later`` prints every thread's stack
  when the input has run ``hang_s`` seconds (libFuzzer's ``-timeout`` then kills the
  process and saves the input; in replay mode the watchdog itself exits);
- a memory check: the process's peak RSS during the input (VmHWM, reset before it)
  minus its RSS before it must stay under ``rss_budget`` bytes (lavapipe's device
  memory is host memory, so this covers device allocations too);
- an exception check: anything but VkDelegateError escaping the target is a finding.

A finding is recorded once per signature (exception type + innermost vkdelegate
frame) under ``findings_dir`` as ``<target>-<sig hash>.bin`` (the input) and ``.txt``
(signature and traceback), then raised (fail fast: atheris prints it and stops) or,
with ``keep_going``, counted and the run continues.
"""
from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

from vkdelegate.errors import VkDelegateError

GiB = 1 << 30


class MemoryBudgetError(AssertionError):
    """One input grew the process's peak RSS past the budget."""


def current_rss() -> int:
    """Resident set size of this process now, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Start measuring the peak RSS afresh (Linux: VmHWM is reset by writing 5 to
    /proc/self/clear_refs); where that is not allowed the peak stays cumulative."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss() -> int:
    """Peak resident set size of this process since the last reset, bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def signature(exc: BaseException) -> str:
    """Exception type and the innermost frame inside vkdelegate (else the innermost
    frame): two findings with one signature are the same bug."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}vkdelegate{os.sep}" in f.filename]
    frame = (ours or frames or [None])[-1]
    where = f"{Path(frame.filename).name}:{frame.lineno}" if frame else "?"
    return f"{type(exc).__name__} at {where}"


class Guard:
    """Runs inputs of one target under the watchdog and checks (module docstring).

    hang_s: seconds one input may run. rss_budget: bytes of peak-RSS growth one input
    may cause. findings_dir/keep_going: see the module docstring. stats_path: where
    the execution count is written (JSON, every few seconds and at the end).
    """

    def __init__(self, target_name: str, hang_s: float = 5.0, rss_budget: int = 2 * GiB,
                 findings_dir=None, keep_going: bool = False, stats_path=None,
                 exit_on_hang: bool = False, quiet: bool = False):
        self.target_name = target_name
        self.hang_s = hang_s
        self.rss_budget = rss_budget
        self.findings_dir = Path(findings_dir) if findings_dir else None
        self.keep_going = keep_going
        self.stats_path = Path(stats_path) if stats_path else None
        self.exit_on_hang = exit_on_hang
        self.quiet = quiet
        self.executions = 0
        self.findings: dict[str, int] = {}  # signature -> times seen
        self.reports: dict[str, str] = {}   # signature -> traceback of the first
        self._last_stats = 0.0

    def run(self, target, data: bytes) -> None:
        """Run ``target(data)``; raise (or record) a finding as the docstring says."""
        reset_peak_rss()
        before = current_rss()
        faulthandler.dump_traceback_later(self.hang_s, exit=self.exit_on_hang)
        try:
            target(data)
        except VkDelegateError:
            pass  # the accepted answer (targets normally swallow it themselves)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - anything else is the finding
            self._finding(exc, data)
        finally:
            faulthandler.cancel_dump_traceback_later()
            self.executions += 1
            self._write_stats()
        grown = peak_rss() - before
        if grown > self.rss_budget:
            try:
                raise MemoryBudgetError(
                    f"one input grew peak RSS by {grown / GiB:.2f} GiB (budget "
                    f"{self.rss_budget / GiB:.2f} GiB)")
            except MemoryBudgetError as exc:
                self._finding(exc, data, sig="MemoryBudgetError")

    def _finding(self, exc: BaseException, data: bytes, sig: str | None = None) -> None:
        sig = sig or signature(exc)
        seen = self.findings.get(sig, 0)
        self.findings[sig] = seen + 1
        if seen == 0:
            report = (f"target: {self.target_name}\nsignature: {sig}\n\n"
                      + "".join(traceback.format_exception(exc)))
            self.reports[sig] = report
            if self.findings_dir is not None:
                self.findings_dir.mkdir(parents=True, exist_ok=True)
                name = f"{self.target_name}-{hashlib.sha1(sig.encode()).hexdigest()[:10]}"
                (self.findings_dir / f"{name}.bin").write_bytes(data)
                (self.findings_dir / f"{name}.txt").write_text(report)
            if not self.quiet:
                print(f"FINDING [{self.target_name}] {sig}: {str(exc)[:200]}",
                      file=sys.stderr, flush=True)
        self._write_stats(force=True)
        if not self.keep_going:
            raise exc

    def _write_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.stats_path is None or (not force and now - self._last_stats < 2.0):
            return
        self._last_stats = now
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"target": self.target_name,
                                   "executions": self.executions,
                                   "findings": self.findings}))
        os.replace(tmp, self.stats_path)
