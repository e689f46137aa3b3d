"""The allow-list section of docs/LOWERING.md, generated from ``allowed_ops``.

    python -m vkdelegate.backend.allowed_ops_doc            # rewrite the section
    python -m vkdelegate.backend.allowed_ops_doc --check    # exit 1 if it is stale

The section sits between ``BEGIN`` and ``END`` markers in docs/LOWERING.md; the rest
of the file is hand-written. tests/backend/test_allowed_ops.py fails when the
committed section differs from ``render()``. Torch-free.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from vkdelegate.backend import allowed_ops

#: docs/LOWERING.md in a source checkout.
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "docs" / "LOWERING.md"
BEGIN = "<!-- BEGIN allow-list: python -m vkdelegate.backend.allowed_ops_doc -->"
END = "<!-- END allow-list -->"

_GROUPS = (
    ("Core ATen (pure functional overloads)", allowed_ops.CORE_ATEN),
    ("Implemented by the Vulkan registry, not core ATen", allowed_ops.REGISTRY_EXTRA),
    ("Pure ATen operators outside the core opset (`cumprod`, `var_mean`, `unfold`, "
     "`searchsorted`, `median`, `unique`, ...)", allowed_ops.NON_CORE),
    ("Linear algebra (`torch.linalg.inv`, `solve`, `cholesky`)", allowed_ops.LINALG),
    ("Sizes and checks of dynamic shapes", allowed_ops.SIZES_AND_CHECKS),
    ("Checks of tensor values (`F.one_hot`'s class range)", allowed_ops.VALUE_CHECKS),
    ("Creation ops (bytes checked against `max_tensor_bytes` and `max_host_bytes`)",
     allowed_ops.CREATION),
    ("Custom ops", allowed_ops.CUSTOM),
    ("Integer operators (int arguments only, results within int64)",
     allowed_ops.OPERATORS),
    ("Reference executor only", allowed_ops.REFERENCE_ONLY + allowed_ops.BLOB_SIZE_OPS),
)


def _wrap(text: str, indent: str = "  ") -> str:
    return textwrap.fill(text, 88, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def render() -> str:
    """The generated section, markers included."""
    lines = [BEGIN, ""]
    for title, names in _GROUPS:
        item = f"- {title} ({len(names)}): " + ", ".join(f"`{n}`" for n in sorted(names))
        lines.append(_wrap(item + "."))
    def listed(values) -> str:
        if values == allowed_ops.MESSAGE:
            return f"any text up to {allowed_ops.MAX_MESSAGE} characters"
        if values == allowed_ops.CHAIN:
            return ("a chain of fusable ATen ops in the grammar of "
                    "kernels/elementwise_chain.py, parsed at load")
        if values == allowed_ops.SWIGLU_CHAINS:
            return (f"one of the {len(values)} SwiGLU chains of kernels/swiglu.py "
                    f"(`CHAINS`)")
        return ", ".join(f"`{v}`" for v in values)

    choices = "; ".join(
        f"`{op}` {arg}: " + listed(values)
        for op, args in sorted(allowed_ops.STR_CHOICES.items())
        for arg, values in args.items())
    lines += ["", _wrap(f"String arguments take only these values: {choices}.", ""), "",
              END]
    return "\n".join(lines)


def replaced(text: str) -> str:
    """``text`` (the whole doc) with its section regenerated; ValueError if the
    markers are missing."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + render() + text[end:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the section is out of date")
    args = parser.parse_args(argv)
    text = args.path.read_text()
    new = replaced(text)
    if args.check:
        return 0 if new == text else 1
    args.path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
