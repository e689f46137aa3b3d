"""The ``vkdelegate`` command line.

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
Any ``VkDelegateError`` becomes one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from vkdelegate.errors import VkDelegateError

# Subcommand modules, in the order `vkdelegate --help` lists them. A module that is
# missing (work in progress) is skipped rather than breaking the whole CLI.
_SUBCOMMANDS = ("demo", "run", "inspect", "devices", "build_shaders")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vkdelegate",
        description="Run torch.export programs on Vulkan devices.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"vkdelegate.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"vkdelegate.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except VkDelegateError as exc:
        print(f"vkdelegate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
