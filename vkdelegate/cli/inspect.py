"""``vkdelegate inspect FILE [--json]``: what is inside a delegate blob.

Prints the VH00 header regions, the values table (id, kind, dtype, dims, constant id,
mem_obj_id, list items), the op chain with arguments resolved to readable values,
and a constants summary; for a program file also its methods' signatures, shared
state and partition reports (the nodes left on the CPU, each with its reasons).
``--json`` prints the same as one JSON document. Reads our
blobs and ExecuTorch Vulkan (ET-VK) blobs alike. A malformed file is one error line
and exit status 2 (the CLI main turns VkDelegateError into that).

Program files (``vkdelegate.serialization.program_file``): ``blobs_in_file`` shows
each delegate blob the file holds. The hook for the program layer is a function
``program_file.list_delegate_blobs(path) -> list[(label, blob bytes, named_data
dict)]``; while that does not exist, every segment that starts like a blob is shown,
labelled by its segment index, with named constants left unresolved.
ExecuTorch programs (.pte): each VulkanBackend delegate, with the program's named data.
"""
from __future__ import annotations

import json
import sys

from tabulate import tabulate

from vkdelegate.cli import help_description
from vkdelegate.errors import VkDelegateError, printable
from vkdelegate.serialization.describe import describe_blob
from vkdelegate.serialization.header import HEADER_LENGTH, MAGIC


def register(subparsers) -> None:
    p = subparsers.add_parser("inspect", help="show the contents of a delegate blob",
                              description=help_description(__doc__))
    p.add_argument("file", metavar="FILE", help="delegate blob (VH00) or program file")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def blobs_in_file(path: str) -> list[tuple[str, bytes, dict | None]]:
    """(label, blob bytes, named data or None) for each delegate blob in ``path``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise VkDelegateError(f"cannot read {path}: {exc.strerror or exc}") from None
    # Without a whole magic there is nothing to compare it with: say what is wrong.
    if not data:
        raise VkDelegateError(f"{path} is empty (0 bytes), not a delegate blob or "
                              f"program file")
    if data[4:8] == MAGIC:
        return [(path, data, None)]
    if len(data) < HEADER_LENGTH:
        raise VkDelegateError(f"{path} is {len(data)} bytes, too short for a header "
                              f"(a delegate blob's VH00 header is {HEADER_LENGTH} bytes)")
    from vkdelegate.serialization import program_file, pte_reader

    if pte_reader.is_pte(data[:8]):
        return _pte_blobs(path, pte_reader.read_pte(data, path))

    if data[:len(program_file.MAGIC)] == program_file.MAGIC:
        lister = getattr(program_file, "list_delegate_blobs", None)
        if lister is not None:
            return list(lister(path))
        # Until the program layer names its blobs: every segment that is a blob.
        _, segments = program_file.read_program(path)
        return [(f"{path} segment {i}", bytes(seg), None)
                for i, seg in enumerate(segments) if bytes(seg[4:8]) == MAGIC]
    raise VkDelegateError(f"{path}: not a delegate blob, program file or .pte (bytes "
                          f"4..8 are {data[4:8]!r}, a blob's {MAGIC!r}; bytes 0..8 "
                          f"{data[:8]!r}, a program file's {program_file.MAGIC!r})")


def _pte_blobs(path: str, program) -> list[tuple[str, bytes, dict]]:
    """The VulkanBackend blobs of an ExecuTorch program, with its named data; a
    delegate of another backend is a VkDelegateError naming it."""
    found = []
    for plan in program.plans:
        for k, d in enumerate(plan.delegates):
            if d.backend != "VulkanBackend":
                raise VkDelegateError(f"{path}: method {plan.name!r} delegate {k} is for "
                                      f"backend {d.backend!r}; vkdelegate reads "
                                      f"VulkanBackend delegates only")
            found.append((f"{path} method {plan.name!r} delegate {k}", d.data,
                          program.named_data))
    return found


def _placement(row: dict) -> str:
    """Storage type / memory layout of a tensor row, blank when both are defaults."""
    storage, layout = row.get("storage_type"), row.get("memory_layout")
    if storage in (None, "DEFAULT_STORAGE") and layout in (None, "DEFAULT_LAYOUT"):
        return ""
    return f"{storage}/{layout}"


def _cell(value):
    """A table cell: a string from the file (a String value, a named key) with its
    control characters escaped (``printable``); anything else as it is."""
    return printable(value) if isinstance(value, str) else value


def _text(label: str, d: dict) -> str:
    h, g = d["header"], d["graph"]
    out = [f"== {label}: delegate blob, {d['size']} bytes",
           tabulate([["header", 0, 30],
                     ["flatbuffer", h["flatbuffer_offset"], h["flatbuffer_size"]],
                     ["constants", h["constants_offset"], h["constants_size"]]],
                    headers=["region", "offset", "size"]),
           "",
           f"version {g['version']!r}, {g['value_count']} values, {g['op_count']} ops, "
           f"inputs {g['input_ids']}, outputs {g['output_ids']}, storage override "
           f"{g['storage_type_override']}, layout override {g['memory_layout_override']}",
           "", "Values"]
    rows = [[v["id"], v["kind"], v.get("dtype", ""), v.get("dims", ""),
             v.get("constant_id", ""), v.get("mem_obj_id", ""), _placement(v),
             _cell(v.get("items", v.get("value", "")))] for v in d["values"]]
    out.append(tabulate(rows, headers=["id", "kind", "dtype", "dims", "constant",
                                       "mem_obj", "storage/layout", "value / items"]))
    out += ["", "Op chain"]
    chain = [[op["node_id"], printable(op["name"]),
              ", ".join(op["readable"][:-1]) + " -> " + (op["readable"][-1] if op["readable"] else "")]
             for op in d["chain"]]
    out.append(tabulate(chain, headers=["node", "op", "args -> output"]))
    c = d["constants"]
    out += ["", f"Constants: {c['count']} ({c['total_bytes']} bytes); inline "
                f"{c['inline']['count']} ({c['inline']['bytes']} bytes), named "
                f"{c['named']['count']} ({c['named']['bytes']} bytes)"]
    if c["items"]:
        out.append(tabulate([[e["id"], e["storage"], e.get("offset", ""), e["length"],
                              _cell(e.get("named_key", ""))] for e in c["items"]],
                            headers=["id", "storage", "offset", "length", "named key"]))
    return "\n".join(out)


def _json_safe(x):
    # JSON has no inf/nan: spell them as strings ("inf", "-inf", "nan").
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return repr(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def program_manifest(path: str) -> "dict | None":
    """The manifest of a program file (read and checked once for the three views
    below), None for a bare blob or a .pte. Raises VkDelegateError for a malformed
    file."""
    from vkdelegate.serialization import program_file

    with open(path, "rb") as f:
        if f.read(len(program_file.MAGIC)) != program_file.MAGIC:
            return None
    return program_file.read_program(path)[0]


def method_signatures(manifest: "dict | None", path: str) -> list[str]:
    """One line per method of a program file (``manifest``, from ``program_manifest``
    of ``path``): its name and its inputs' types, dynamic dims as their ranges
    (``forward(input: float32[1..64, 8])``); [] for a bare blob or a .pte (None).
    Raises VkDelegateError for a malformed manifest."""
    from vkdelegate.backend.input_checks import describe

    if manifest is None:
        return []
    lines = []
    try:
        for name, method in manifest["methods"].items():
            plan = method.get("plan")
            if plan is None:  # not loadable, but its blobs can still be listed
                continue
            ranges = plan.get("ranges", {})
            names = plan.get("dim_names")
            names = names if isinstance(names, dict) else None
            args = [f"{printable(spec.get('name', i))}: {describe(spec, ranges, names)}"
                    for i, spec in enumerate(plan["inputs"])]
            lines.append(f"{printable(name)}({', '.join(args)})")
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise VkDelegateError(f"program file {path}: malformed method plan "
                              f"({type(exc).__name__}: {exc})") from exc
    return lines


def program_state(manifest: "dict | None", path: str) -> dict:
    """What a program file's methods share: ``{"state": ["fqn: dtype[shape]", ...]}``
    (its mutable buffers, FQNs as in the module's state_dict) and, for a program of
    ``vkdelegate.llm.lower``, ``"llm": {"max_seq_len": S, "vocab_size": V,
    "eos_token_ids": [...]}`` (the KV cache's length; the vocabulary and the model's
    end-of-sequence ids recorded at lowering, absent in older files or without any); {}
    for a bare blob, a .pte (``manifest`` None) or a program without state. Raises
    VkDelegateError for a malformed manifest."""
    from vkdelegate.backend.llm_checks import CACHE_PREFIX, PLAN_KEY

    if manifest is None:
        return {}
    out: dict = {}
    try:
        state = manifest.get("initial_state") or {}
        if state:
            out["state"] = [f"{printable(fqn)}: {printable(e['dtype'])}"
                            f"[{', '.join(str(int(d)) for d in e['shape'])}]"
                            for fqn, e in state.items()]
        cache = [e for fqn, e in state.items() if fqn.startswith(CACHE_PREFIX)]
        vocab = {m.get("plan", {}).get(PLAN_KEY, {}).get("vocab_size")
                 for m in manifest["methods"].values()} - {None}
        eos = {tuple(m.get("plan", {}).get(PLAN_KEY, {}).get("eos_token_ids") or ())
               for m in manifest["methods"].values()} - {()}
        if cache and len(cache[0]["shape"]) == 4:
            out["llm"] = {"max_seq_len": int(cache[0]["shape"][2])}
            if len(vocab) == 1:
                out["llm"]["vocab_size"] = int(vocab.pop())
            if len(eos) == 1:
                out["llm"]["eos_token_ids"] = [int(i) for i in eos.pop()]
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise VkDelegateError(f"program file {path}: malformed state or plan "
                              f"({type(exc).__name__}: {exc})") from exc
    return out


def program_reports(manifest: "dict | None", path: str) -> dict:
    """Each method's partition report stored in a program file (``{name:
    PartitionReport}``, methods lowered without one left out); {} for a bare blob or a
    .pte (``manifest`` None). Raises VkDelegateError for a malformed manifest or
    report."""
    from vkdelegate.backend.report import PartitionReport

    if manifest is None:
        return {}
    try:
        methods = manifest["methods"].items()
        return {name: PartitionReport.from_json(m["report"]) for name, m in methods
                if m.get("report") is not None}
    except VkDelegateError as exc:
        raise VkDelegateError(f"program file {path}: {exc}") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise VkDelegateError(f"program file {path}: malformed method entry "
                              f"({type(exc).__name__}: {exc})") from exc


def _printable_report(report) -> str:
    """``str(report)`` with every name, op, reason and note from the file passed
    through ``printable`` (one table row per node, whatever the file holds)."""
    from vkdelegate.backend.report import NodeDecision, PartitionReport

    clean = [NodeDecision(printable(d.name), printable(d.op),
                          [printable(r) for r in d.reasons], d.partition,
                          [printable(n) for n in d.notes]) for d in report.decisions]
    return str(PartitionReport(clean, report.num_partitions))


def _report_json(report) -> dict:
    """What --json prints of a report: its summary line and the CPU nodes with reasons."""
    return {"summary": report.summary(),
            "cpu_nodes": [{"node": d.name, "op": d.op, "reasons": d.reasons}
                          for d in report.cpu_nodes]}


def run(args) -> int:
    described = [(label, describe_blob(data, named)) for label, data, named in
                 blobs_in_file(args.file)]
    manifest = program_manifest(args.file)
    if args.json:
        doc = described[0][1] if len(described) == 1 and described[0][0] == args.file \
            else {"blobs": [{"label": label, **d} for label, d in described]}
        methods = method_signatures(manifest, args.file)
        if methods:
            reports = {name: _report_json(r)
                       for name, r in program_reports(manifest, args.file).items()}
            doc = {"methods": methods, **program_state(manifest, args.file),
                   **({"reports": reports} if reports else {}), **doc}
        json.dump(_json_safe({"file": args.file, **doc}), sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
    elif not described:
        print(f"{args.file}: no delegate blobs")
    else:
        methods = method_signatures(manifest, args.file)
        if methods:
            # Blob dims below are the upper bounds the tensors are allocated for.
            print("== methods (dynamic dims as low..high)\n" +
                  "\n".join(f"  {m}" for m in methods) + "\n")
            shared = program_state(manifest, args.file)
            if "llm" in shared:
                print("== LLM (vkdelegate.llm): " + ", ".join(
                    f"{k} {v}" for k, v in shared["llm"].items()) + "\n")
            if "state" in shared:
                print("== state (shared by the methods)\n" +
                      "\n".join(f"  {line}" for line in shared["state"]) + "\n")
            for name, report in program_reports(manifest, args.file).items():
                print(f"== partition report ({printable(name)}): what runs on the CPU, "
                      f"and why\n{_printable_report(report)}\n")
        print("\n\n".join(_text(label, d) for label, d in described))
    return 0
