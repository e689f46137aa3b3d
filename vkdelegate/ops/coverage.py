"""The operator coverage table (docs/OPS.md), generated from the registry.

    python -m vkdelegate.ops.coverage            # rewrite docs/OPS.md
    python -m vkdelegate.ops.coverage --check    # exit 1 if it is out of date

One section per op family (the module under ``vkdelegate.ops.families`` that registers
the op), one row per ATen overload: accepted dtypes (per-argument overrides after
them), whether the op runs on resized inputs (dynamic shapes), the largest rank and
the OpSpec's notes. Torch-free. tests/ops/test_ops_table.py fails when the committed
file differs from ``render()``.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

from vkdelegate.ops.et_vk_registry import not_run
from vkdelegate.ops.registry import OpSpec, load_all

#: docs/OPS.md in a source checkout.
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "docs" / "OPS.md"

HEADER = """# Supported operators

Generated from the operator registry by `python -m vkdelegate.ops.coverage`; do
not edit by hand (a test checks that this file is current).

Every op below runs on Vulkan when its node's dtypes, rank and arguments pass the op's
checks; otherwise the partitioner leaves the node on the CPU and the partition report
(`program.report`) says why. *dtypes* apply to every tensor argument and output
unless an argument position (`arg i`, in ATen schema order) lists its own.
*dynamic*: the op runs on inputs resized within their `Dim` ranges without
re-lowering. Notes state the ATen semantics kept and the known limits.

Lowering first decomposes the program to core ATen, so many PyTorch functions arrive as
the ops below: `relu6` and `hardtanh` as `hardtanh`, `hardsigmoid` as
add/clamp/div (`hardswish` stays whole), `silu` as sigmoid and mul, `softplus`/`mish` through log1p and
where, `std` as `var` and `sqrt`, `all` as `logical_not` around `any`, `x ** 2` as
`pow.Tensor_Scalar`, `x > 0` as `gt.Scalar`, `torch.where(c, x, 0.0)` as
`scalar_tensor` (on the CPU) and `where.self`.

Adding an op (docs/RUNTIME.md, "How to add an op"): test it in
`tests/ops/test_<family>.py` with `tests.ops.harness.check_op`, which compares the
lowered program with eager and records what ran on Vulkan. A full `pytest tests/ops`
run ends with `tests/ops/test_registry_coverage.py`, which fails for any claimed
(op, dtype) no test ran and any dispatched shader variant that was not declared. Then
regenerate this file.
"""


def family(spec: OpSpec) -> str:
    """The op family: the registering module's name under vkdelegate.ops.families."""
    module = getattr(spec.impl, "__module__", "") or ""
    return module.rsplit(".", 1)[-1] if module.startswith("vkdelegate.ops.families.") \
        else "other"


def dtypes_cell(spec: OpSpec) -> str:
    cell = ", ".join(sorted(spec.dtypes))
    for i in sorted(spec.arg_dtypes):
        cell += f"; arg {i}: {', '.join(sorted(spec.arg_dtypes[i]))}"
    return cell


def render(registry: "dict[str, OpSpec] | None" = None) -> str:
    """The whole Markdown document for ``registry`` (default: every registered op)."""
    registry = load_all() if registry is None else registry
    families = defaultdict(list)
    for name, spec in registry.items():
        families[family(spec)].append(spec)
    parts = [HEADER, f"{len(registry)} operators in {len(families)} families.\n"]
    for fam in sorted(families):
        rows = [(f"`{s.name}`", dtypes_cell(s), "yes" if s.resizable else "no",
                 s.max_rank, s.notes) for s in sorted(families[fam], key=lambda s: s.name)]
        parts.append(f"## {fam}\n")
        parts.append(tabulate(rows, headers=("op", "dtypes", "dynamic", "max rank",
                                             "notes"), tablefmt="github") + "\n")
    missing = not_run(registry)
    parts.append("## ExecuTorch Vulkan ops not run here\n")
    parts.append(f"{len(missing)} ops of ExecuTorch 1.5.1's Vulkan op registry "
                 "(`backends/vulkan/op_registry.py`) have no entry above, so a blob "
                 "that uses them fails to load with an error naming the op. From "
                 "`vkdelegate/ops/et_vk_registry.py`.\n")
    parts.append(tabulate([(f"`{op}`", why) for op, why in missing],
                          headers=("ExecuTorch op", "why not yet"),
                          tablefmt="github") + "\n")
    return "\n".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH,
                        help="the file to write or check (default: docs/OPS.md)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the file differs from the registry")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text() if args.path.exists() else None
        if current != text:
            print(f"{args.path} is out of date: run python -m vkdelegate.ops.coverage",
                  file=sys.stderr)
            return 1
        return 0
    args.path.write_text(text)
    print(f"wrote {args.path} ({len(load_all())} operators)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
