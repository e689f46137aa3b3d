"""``vkdelegate run PROGRAM --input NAME=FILE.npy ...``: run a saved program.

Inputs are numpy files given by input name (``vkdelegate inspect`` or an error
message lists the names and expected shapes); each output leaf is written to
``OUTPUT_DIR/output_<path>.npy``, where <path> is its position in the returned
structure (``0``, ``logits``, ``b.1``); a Python number is written as a 0-d array, a
None output is not written (a line says so); other output_*.npy files already in the
folder are left in place and named in a note. ``--profile`` runs once more with GPU
timestamps and prints the slowest dispatches; ``--trace`` writes them as a Chrome trace.
Needs torch only when the program has CPU parts.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from vkdelegate.cli import device_index, help_description
from vkdelegate.errors import VkDelegateError, printable

TOP_N = 15
_NPY_MAGIC = b"\x93NUMPY"


def _parse_inputs(pairs: list[str]) -> dict[str, str]:
    inputs = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise VkDelegateError(f"--input {pair!r}: expected NAME=FILE.npy")
        if name in inputs:
            raise VkDelegateError(f"--input {name} given twice")
        inputs[name] = path
    return inputs


def _load_array(name: str, path: str) -> np.ndarray:
    """The .npy array at ``path``; VkDelegateError for a missing file, another format
    (numpy would offer to unpickle it) or an array of Python objects."""
    try:
        with open(path, "rb") as f:
            is_npy = f.read(len(_NPY_MAGIC)) == _NPY_MAGIC
        if not is_npy:
            raise VkDelegateError(f"input {name!r}: {path} is not a .npy array file "
                                  f"(write one with numpy.save)")
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if isinstance(exc, VkDelegateError):
            raise
        # allow_pickle=False: the only pickled content left is an object array.
        reason = ("holds Python objects, which are refused (give a numeric array)"
                  if "pickle" in str(exc) else f"is not a readable .npy file: {exc}")
        raise VkDelegateError(f"input {name!r}: {path} {reason}") from exc
    except OSError as exc:
        raise VkDelegateError(f"input {name!r}: cannot read {path}: "
                              f"{exc.strerror or exc}") from exc


def _flat_inputs(plan: dict, given: dict[str, str]) -> list:
    from vkdelegate.backend.input_checks import describe

    ranges = plan.get("ranges", {})
    names = [spec["name"] for spec in plan["inputs"] if "const" not in spec]
    unknown = sorted(set(given) - set(names))
    if unknown:
        takes = (f"input(s) {', '.join(repr(n) for n in names)}" if names
                 else "no inputs")
        raise VkDelegateError(f"unknown input {unknown[0]!r}; the method takes {takes}")
    flat = []
    for spec in plan["inputs"]:
        if "const" in spec:  # a Python scalar export specialized: nothing to give
            flat.append(spec["const"])
            continue
        if spec["name"] not in given:
            raise VkDelegateError(f"missing input {spec['name']!r} "
                                  f"({describe(spec, ranges, plan.get('dim_names'))}); "
                                  f"give --input "
                                  f"{printable(spec['name'])}=FILE.npy")
        flat.append(_load_array(spec["name"], given[spec["name"]]))
    return flat


def _leaf_paths(spec: dict, prefix: str = "") -> list[str]:
    """The output leaves' paths ("0", "logits", "1.past.0"), dict / record keys as
    file-name-safe text (``_file_part``): each names an output_PATH.npy."""
    kind = spec["t"]
    if kind == "leaf":
        return [prefix or "0"]
    if kind == "none":
        return []
    keys = [_file_part(k) for k in spec["k"]] if "k" in spec \
        else [str(i) for i in range(len(spec["c"]))]
    paths = []
    for key, child in zip(keys, spec["c"]):
        paths.extend(_leaf_paths(child, f"{prefix}.{key}" if prefix else str(key)))
    return paths


def _file_part(key: str) -> str:
    """An output key as part of a file name: letters, digits, '_' and '-' kept, any
    other character (a '/' or '.' of a key read from the program file included) '_',
    at most 64 characters, so output files stay inside --output-dir."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_"
                   for c in key[:64]) or "_"


def _unique(paths: list[str]) -> list[str]:
    """``paths`` with a "~N" suffix on every repeat (keys that map to the same text)."""
    seen: dict[str, int] = {}
    out = []
    for p in paths:
        n = seen.get(p, 0)
        seen[p] = n + 1
        out.append(p if n == 0 else f"{p}~{n}")
    return out


def _value_shapes(graph, loaded, vid: int) -> "tuple[list[str], bool]":
    """Shapes of value ``vid`` as "AxB" strings (a ValueList gives one per tensor) and
    whether they are this run's sizes (True) or the serialized upper bounds (False)."""
    from vkdelegate.serialization.vkgraph import ValueList, VkTensor

    value = graph.values[vid]
    if isinstance(value, ValueList):
        shapes, actual = [], True
        for item in value.items:
            got, ok = _value_shapes(graph, loaded, item)
            shapes.extend(got)
            actual = actual and ok
        return shapes, actual
    if not isinstance(value, VkTensor):
        return [], True
    dims, actual = value.dims, False
    resolve = getattr(loaded, "resolve", None)
    if resolve is not None:
        try:
            current = resolve(vid)
        except VkDelegateError:  # a value the executor never built
            current = None
        if hasattr(current, "shape"):
            dims, actual = current.shape, True
    return ["x".join(map(str, dims)) or "scalar"], actual


def print_profile(program, method: str, trace_path: "str | None") -> None:
    """Print the TOP_N slowest dispatches of the last profiled call of ``method`` (op,
    tensor shapes of this run, GPU time, share of the total); write a Chrome trace to
    ``trace_path``, one thread (tid) per delegate, the delegates one after the other."""
    from tabulate import tabulate

    from vkdelegate.serialization.blob import read_blob

    rows, events = [], []
    all_actual = True
    offset_us = 0.0  # delegates run in sequence: each starts after the previous ends
    delegates = program.methods[method].delegates
    runners = program.runner(method).delegates
    for index, profile in program.last_profiles(method):
        graph = read_blob(delegates[index].blob).graph
        loaded = runners[index].loaded
        calls = {c.node_id: c for c in graph.chain}
        for d in profile.dispatches:
            call = calls.get(d.node_id)
            shapes = []
            for vid in call.args if call else []:
                got, actual = _value_shapes(graph, loaded, vid)
                shapes.extend(got)
                all_actual = all_actual and actual
            rows.append((index, d.node_id, d.op, " ".join(shapes), d.duration_ns))
        end_us = offset_us
        for event in profile.chrome_trace()["traceEvents"]:
            events.append(dict(event, tid=index, ts=event["ts"] + offset_us))
            end_us = max(end_us, event["ts"] + event["dur"] + offset_us)
        offset_us = end_us
    total = sum(r[4] for r in rows) or 1.0
    top = sorted(rows, key=lambda r: -r[4])[:TOP_N]
    shapes_header = ("tensor shapes (output last)" if all_actual
                     else "tensor shapes, upper bounds (output last)")
    print(tabulate([(r[0], r[1], r[2], r[3], f"{r[4] / 1e3:.1f}",
                     f"{100 * r[4] / total:.1f}%") for r in top],
                   headers=["delegate", "node", "op", shapes_header, "GPU us", "share"]))
    print(f"total GPU time {total / 1e3:.1f} us over {len(rows)} dispatches")
    if trace_path:
        with open(trace_path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
        print(f"wrote Chrome trace {trace_path}")


def run(args) -> int:
    from vkdelegate.backend.interpreter import to_numpy
    from vkdelegate.backend.program import load

    program = load(args.program, device=args.device)
    method = args.method
    if method is None:
        if "forward" not in program.methods and len(program.methods) > 1:
            raise VkDelegateError(f"the program has methods "
                                  f"{', '.join(map(printable, program.method_names))}; "
                                  f"choose one with --method")
        method = program.default_method()
    runner = program.runner(method)
    flat = _flat_inputs(runner.plan, _parse_inputs(args.input or []))
    # Paths are checked before the program runs: a bad one fails fast, not after.
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise VkDelegateError(f"--output-dir {args.output_dir}: is a file, not a folder")
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as exc:
        raise VkDelegateError(f"--output-dir {args.output_dir}: cannot create it "
                              f"({exc.strerror or exc})") from exc
    if args.trace and not os.path.isdir(os.path.dirname(os.path.abspath(args.trace))):
        raise VkDelegateError(f"--trace {args.trace}: folder "
                              f"{os.path.dirname(os.path.abspath(args.trace))} does not exist")
    outputs = runner.call_flat(flat)
    written = set()
    for path, value in zip(_unique(_leaf_paths(runner.plan["out_spec"])), outputs):
        if value is None:  # np.save would write a pickled object array
            print(f"{path}: None (not written)")
            continue
        # A Python number the method returns: a 0-d int64 / float64 / bool array.
        array = to_numpy(value)
        if array.dtype.kind not in "biufc":
            print(f"{path}: {type(value).__name__} (not written: not a numeric array)")
            continue
        target = os.path.join(args.output_dir, f"output_{path}.npy")
        try:
            np.save(target, array)
        except OSError as exc:
            raise VkDelegateError(f"--output-dir {args.output_dir}: cannot write "
                                  f"{target} ({exc.strerror or exc})") from exc
        print(f"{path}: {array.dtype}{list(array.shape)} -> {target}")
        written.add(os.path.basename(target))
    _note_stale_outputs(args.output_dir, written)
    if args.profile or args.trace:
        program.set_profiling(True)
        runner.call_flat(flat)
        program.set_profiling(False)
        print_profile(program, method, args.trace)
    program.close()
    return 0


def _note_stale_outputs(folder: str, written: set) -> None:
    """Name the output_*.npy files in ``folder`` that this run did not write (an earlier
    run's, e.g. of a method with more outputs): they are left in place, since they are
    the user's files, but a reader should not take them for this run's results."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    stale = sorted(n for n in names
                   if n.startswith("output_") and n.endswith(".npy") and n not in written)
    if stale:
        shown = ", ".join(stale[:8]) + (f", ... ({len(stale)} in all)" if len(stale) > 8
                                        else "")
        print(f"note: {folder} also holds {shown}: not written by this run (left in "
              f"place)")


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run a saved program on .npy inputs",
                              description=help_description(__doc__))
    p.add_argument("program", help="program file written by LoweredProgram.save")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input by name (repeat for each input)")
    p.add_argument("--method", help="method to run (default: forward or the only one)")
    p.add_argument("--device", type=device_index,
                   help="Vulkan device index (vkdelegate devices)")
    p.add_argument("--output-dir", default=".",
                   help="where output_*.npy go (default .; created, with its parents, "
                        "if missing)")
    p.add_argument("--profile", action="store_true",
                   help="print the slowest dispatches by GPU time")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (implies "
                   "--profile)")
    p.set_defaults(func=run)
