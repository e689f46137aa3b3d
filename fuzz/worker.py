"""One fuzzing process: one target under atheris (libFuzzer), started by fuzz.run.

    python -m fuzz.worker --target blob --seeds SEEDS --workdir DIR --seconds 60

vkdelegate's modules are imported under atheris's coverage instrumentation (torch,
numpy and the Vulkan bindings are not: coverage of our code is what guides the
search). libFuzzer keeps the inputs that reached new code in ``DIR/corpus`` and saves
an input that crashed (an escaping exception), hung (``-timeout``) or went over its
RSS limit as ``DIR/crash-*``, ``timeout-*`` or ``oom-*``; the input running when the
process died of a signal is left in ``DIR/current-input``. A hard address-space limit
(RLIMIT_AS) keeps a runaway allocation from taking the machine down with it.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import pkgutil
import resource
import sys
from pathlib import Path

# Modules that run the CLI or import the examples' model packages at import time, and
# the ExecuTorch partitioner (importable only where executorch is installed).
_SKIP = ("vkdelegate.__main__", "vkdelegate.examples", "vkdelegate.cli.demo",
         "vkdelegate.backend.et_partitioner")


def _import_all_vkdelegate() -> None:
    import vkdelegate

    for info in pkgutil.walk_packages(vkdelegate.__path__, "vkdelegate."):
        if not info.name.startswith(_SKIP):
            importlib.import_module(info.name)


def _vm_size() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--seeds", required=True, help="folder built by fuzz.corpus")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--hang-s", type=float, default=5.0)
    parser.add_argument("--rss-budget-mb", type=int, default=2048)
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--stats", default=None)
    parser.add_argument("--seeds-only", action="store_true",
                        help="run the seeds under the checks once, then stop")
    args = parser.parse_args(argv)

    faulthandler.enable()  # a native crash prints the Python stacks too
    import numpy  # noqa: F401 - imported before instrumentation: not ours to cover
    import torch  # noqa: F401

    import atheris

    with atheris.instrument_imports(include=["vkdelegate"]):
        _import_all_vkdelegate()
    from fuzz import mutate
    from fuzz.checks import GiB, Guard, current_rss
    from fuzz.targets import make_target

    workdir = Path(args.workdir)
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    target = make_target(args.target, args.seeds, str(workdir))
    seed_dir = Path(args.seeds) / args.target
    # Warm-up, unguarded: the seeds' first run compiles their shaders (seconds each
    # on a cold cache), which must not count against the per-input hang limit. It
    # also creates the device (driver threads) before the address-space cap is set.
    # libFuzzer runs every seed again, under the checks, before it mutates.
    # Each input is written to DIR/current-input before it runs: a native crash
    # (SIGSEGV in the driver) kills the process before libFuzzer can save it, and
    # fuzz.run then keeps this copy.
    current = os.open(workdir / "current-input", os.O_RDWR | os.O_CREAT | os.O_TRUNC)

    def remember(data: bytes) -> None:
        os.ftruncate(current, 0)
        os.pwrite(current, data, 0)

    for seed in sorted(seed_dir.iterdir()):
        try:
            remember(seed.read_bytes())
            target(seed.read_bytes())
        except Exception:  # noqa: BLE001 - reported when libFuzzer runs it
            pass
    budget = args.rss_budget_mb << 20
    guard = Guard(args.target, hang_s=args.hang_s, rss_budget=budget,
                  findings_dir=workdir / "findings", keep_going=args.keep_going,
                  stats_path=args.stats)
    # The hard cap sits well above the per-input budget: the budget check reports a
    # big input; the cap only stops one that would exhaust the machine.
    cap = _vm_size() + 3 * budget + GiB
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    # libFuzzer's RSS limit catches slow growth over many inputs (a leak).
    rss_limit_mb = (current_rss() + 2 * budget) >> 20
    max_len = max(4096, 4 * max(p.stat().st_size for p in seed_dir.iterdir()))
    libfuzzer = [sys.argv[0], f"-max_total_time={args.seconds}",
                 f"-timeout={int(args.hang_s) + 1}", f"-rss_limit_mb={rss_limit_mb}",
                 f"-max_len={max_len}", f"-artifact_prefix={workdir}/",
                 f"-dict={Path(args.seeds) / 'fuzz.dict'}", "-print_final_stats=1",
                 str(corpus), str(seed_dir)] + (["-runs=0"] if args.seeds_only else [])

    def one_input(data: bytes) -> None:
        remember(data)
        guard.run(target, data)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        return mutate.mutate(data, max_size, seed, atheris.Mutate)

    atheris.Setup(libfuzzer, one_input,
                  custom_mutator=custom_mutator if args.target in ("program", "inspect")
                 else None)  # a .pte has no checksums: byte mutations reach it
    atheris.Fuzz()


if __name__ == "__main__":
    main()
