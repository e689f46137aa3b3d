"""Run the fuzz targets for a bounded time each, or replay saved inputs.

    python -m fuzz.run --target blob --seconds 60          # one target
    python -m fuzz.run --seconds 60                        # all three, one after another
    python -m fuzz.run --seconds 600 --keep-going          # collect distinct findings
    python -m fuzz.run --target program --replay FILE...   # re-run saved inputs

Seeds are built once into ``WORKDIR/seeds`` (``fuzz.corpus``; ``--rebuild-seeds``
builds them again). Each target runs in a child process (``fuzz.worker``, atheris)
that is killed if it outlives its time by more than a grace period. By default the
first finding stops a target; ``--keep-going`` records each distinct finding and goes
on (a hang or an over-limit input ends the child, which is restarted with the time
left). Findings land in ``WORKDIR/<target>/findings`` (exceptions: input + traceback)
and ``WORKDIR/<target>/`` (libFuzzer's ``timeout-*``, ``oom-*``, ``crash-*``, with
the child's log next to them). A summary (executions and findings per target) is
printed and written to ``WORKDIR/summary.json``; the exit status is 1 if anything was
found. Replay runs in this process with the same checks; a hang there prints the
stacks and exits.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fuzz.targets import TARGETS

REPO = Path(__file__).resolve().parent.parent
# Startup (imports, instrumentation, device) and libFuzzer's shutdown, per child.
_GRACE_S = 120
_MAX_RESTARTS = 25
_ARTIFACT = re.compile(r"^(crash|timeout|oom|leak|slow-unit)-[0-9a-f]+$")


def _seeds(workdir: Path, rebuild: bool) -> Path:
    seeds = workdir / "seeds"
    if rebuild or not (seeds / "named_data.json").exists():
        from fuzz.corpus import build_corpus

        print(f"building seeds in {seeds}", flush=True)
        build_corpus(seeds)
    return seeds


def _stack_signature(log: str) -> str:
    """Innermost vkdelegate frames of the thread running the input, from the stacks
    faulthandler printed when the input ran too long or the process died of a signal
    ("" if none was printed)."""
    for block in re.split(r"\n(?:Current thread|Thread) 0x", log)[1:]:
        if "checks.py" not in block:
            continue
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\w+)', block)
        ours = [f for f in frames if f"{os.sep}vkdelegate{os.sep}" in f[0]]
        if ours or frames:  # the two innermost: vk_call alone says too little
            return " < ".join(f"{Path(path).name}:{line} in {func}"
                              for path, line, func in (ours or frames)[:2])
    return ""


def _run_child(target: str, seeds: Path, tdir: Path, seconds: int, n: int,
               args) -> tuple[int, str, dict]:
    stats = tdir / f"stats-{n}.json"
    cmd = [sys.executable, "-m", "fuzz.worker", "--target", target, "--seeds", str(seeds),
           "--workdir", str(tdir), "--seconds", str(seconds), "--hang-s", str(args.hang_s),
           "--rss-budget-mb", str(args.rss_budget_mb), "--stats", str(stats)]
    if args.keep_going:
        cmd.append("--keep-going")
    if args.seeds_only:
        cmd.append("--seeds-only")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    log_path = tdir / f"log-{n}.txt"
    with open(log_path, "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 cwd=REPO)
        try:
            rc = child.wait(seconds + _GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            rc = child.wait()
            log.write(f"\nfuzz.run: killed the worker after {seconds + _GRACE_S} s\n")
    counts = json.loads(stats.read_text()) if stats.exists() else {}
    text = log_path.read_text(errors="replace")
    # The worker's own count lags by up to 2 s; libFuzzer's last report does not.
    reported = [int(m) for m in re.findall(r"^#(\d+)\s", text, re.M)] + [
        int(m) for m in re.findall(r"number_of_executed_units: (\d+)", text)]
    counts["executions"] = max([counts.get("executions", 0)] + reported)
    return rc, text, counts


def _kind(log: str, rc: int) -> str:
    for marker, kind in (("libFuzzer: timeout", "hang"), ("out-of-memory", "oom"),
                         ("Uncaught Python exception", "exception"),
                         ("deadly signal", "native crash"),
                         ("Fatal Python error", "native crash"),
                         ("killed the worker", "hang")):
        if marker in log:
            return kind
    return f"exit status {rc}"


def fuzz_target(target: str, seeds: Path, workdir: Path, args) -> dict:
    """Fuzz ``target`` for ``args.seconds``; returns its summary entry."""
    tdir = workdir / target
    tdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.seconds
    executions, findings, seen = 0, {}, set(p.name for p in tdir.iterdir())
    for n in range(_MAX_RESTARTS):
        left = int(deadline - time.monotonic())
        if left < 5 and n:
            break
        rc, log, counts = _run_child(target, seeds, tdir, max(left, 5), n, args)
        executions += counts.get("executions", 0)
        for sig, times in counts.get("findings", {}).items():
            findings.setdefault(sig, {"kind": "exception", "times": 0})["times"] += times
        new = sorted(p.name for p in tdir.iterdir() if p.name not in seen
                     and _ARTIFACT.match(p.name))
        seen.update(new)
        if rc == 0 or args.seeds_only:
            break
        kind = _kind(log, rc)
        current = tdir / "current-input"
        if not new and current.exists():  # died before libFuzzer could save it
            data = current.read_bytes()
            name = f"crash-{hashlib.sha1(data).hexdigest()}"
            (tdir / name).write_bytes(data)
            seen.add(name)
            new = [name]
        if kind != "exception" or not counts.get("findings"):
            where = _stack_signature(log) if kind in ("hang", "native crash") else ""
            sig = f"{kind}{' at ' + where if where else ''}"
            entry = findings.setdefault(sig, {"kind": kind, "times": 0})
            entry["times"] += 1
            entry.setdefault("inputs", []).extend(str(tdir / a) for a in new)
            entry.setdefault("logs", []).append(str(tdir / f"log-{n}.txt"))
        print(f"[{target}] worker {n} ended: {kind} (log {tdir / f'log-{n}.txt'})",
              flush=True)
        if not args.keep_going:
            break
    return {"executions": executions, "findings": findings,
            "findings_dir": str(tdir / "findings")}


def replay(target: str, files, seeds, hang_s: float = 5.0) -> dict[str, str]:
    """Run ``target`` once on each file in this process; signature -> traceback of
    every finding (empty: all fine). A hang prints the stacks and exits."""
    from fuzz.checks import Guard
    from fuzz.targets import make_target

    run = make_target(target, str(seeds))
    guard = Guard(target, hang_s=hang_s, keep_going=True, exit_on_hang=True)
    for f in files:
        guard.run(run, Path(f).read_bytes())
    return guard.reports


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", choices=TARGETS,
                        help="target to run (repeatable; default: all)")
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--workdir", default=str(REPO / "out" / "fuzz"))
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--rebuild-seeds", action="store_true")
    parser.add_argument("--hang-s", type=float, default=5.0)
    parser.add_argument("--rss-budget-mb", type=int, default=2048)
    parser.add_argument("--replay", nargs="+", metavar="FILE")
    parser.add_argument("--seeds-only", action="store_true",
                        help="run each target's seeds once under atheris and stop")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    seeds = _seeds(workdir, args.rebuild_seeds)
    targets = args.target or list(TARGETS)
    if args.replay:
        found = {}
        for target in targets:
            for sig, report in replay(target, args.replay, seeds, args.hang_s).items():
                found[f"{target}: {sig}"] = report
                print(report, file=sys.stderr)
        print(f"replayed {len(args.replay)} file(s) on {', '.join(targets)}: "
              f"{len(found)} finding(s)")
        return 1 if found else 0
    summary = {}
    for target in targets:
        print(f"fuzzing {target} for {args.seconds} s", flush=True)
        summary[target] = fuzz_target(target, seeds, workdir, args)
        s = summary[target]
        print(f"[{target}] {s['executions']} executions, {len(s['findings'])} "
              f"distinct finding(s)", flush=True)
        for sig, f in s["findings"].items():
            print(f"  - {sig} (x{f['times']})", flush=True)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    return 1 if any(s["findings"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
