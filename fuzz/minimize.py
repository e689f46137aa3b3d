"""Shrink a saved finding to a smaller input with the same signature.

    python -m fuzz.minimize --target program IN OUT [--seeds DIR]

For a program file, manifest entries are dropped one at a time (dict keys, list
items, whole methods) and the file re-encoded with valid checksums (fuzz.mutate),
keeping each drop after which the input still fails with the same signature
(exception type + innermost vkdelegate frame). For any input, the tail is then cut
as long as the signature holds. Exceptions only: a hang or a memory finding is saved
as it was found.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from fuzz import mutate
from fuzz.checks import Guard


def _signature(target, data: bytes) -> str | None:
    guard = Guard("minimize", keep_going=True, hang_s=10.0, quiet=True)
    guard.run(target, data)
    return next(iter(guard.findings), None)


def _drops(node, path=()):
    """Paths (tuples of keys) of every entry of a JSON tree, outermost first."""
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    items = list(items)
    for key, _ in items:
        yield path + (key,)
    for key, value in items:
        yield from _drops(value, path + (key,))


def _without(tree, path):
    tree = json.loads(json.dumps(tree, allow_nan=True))
    node = tree
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return tree


def minimize(target, data: bytes, max_tries: int = 3000) -> bytes:
    """A smaller input with ``target``'s signature on ``data`` (``data`` if none)."""
    want = _signature(target, data)
    if want is None:
        return data
    tries = 0
    decoded = mutate.decode(data)
    if decoded is not None:
        manifest, segments = decoded
        manifest = {k: v for k, v in manifest.items() if k != "segments"}
        changed = True
        while changed and tries < max_tries:
            changed = False
            for path in list(_drops(manifest)):
                tries += 1
                try:
                    smaller = _without(manifest, path)
                except (KeyError, IndexError, TypeError, RecursionError, ValueError):
                    continue
                candidate = mutate.encode(smaller, segments)
                if _signature(target, candidate) == want:
                    manifest, data, changed = smaller, candidate, True
                    break
    step = len(data) // 2
    while step >= 1 and tries < max_tries:
        tries += 1
        if len(data) > step and _signature(target, data[:-step]) == want:
            data = data[:-step]
        else:
            step //= 2
    return data


def main(argv=None) -> int:
    from fuzz.targets import TARGETS, make_target

    parser = argparse.ArgumentParser(prog="python -m fuzz.minimize",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, choices=TARGETS)
    parser.add_argument("--seeds", default="out/fuzz/seeds")
    parser.add_argument("input")
    parser.add_argument("output")
    args = parser.parse_args(argv)
    target = make_target(args.target, args.seeds)
    data = Path(args.input).read_bytes()
    small = minimize(target, data)
    Path(args.output).write_bytes(small)
    print(f"{args.input}: {len(data)} -> {len(small)} bytes, signature "
          f"{_signature(target, small)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
