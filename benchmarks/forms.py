"""Kernel forms for a benchmark run: ``--form MODULE.CONSTANT=VALUE`` sets a module
constant of vkdelegate.kernels or vkdelegate.ops.families (``conv_pointwise.SPLIT_K=
false``) before the program is built, so that one script compares forms across runs.
VALUE is JSON (true, 132, "x"); forms are read when a program is built."""
from __future__ import annotations

import importlib
import json

PACKAGES = ("vkdelegate.kernels", "vkdelegate.ops.families")


def parse(items: list, error) -> dict:
    """{"module.CONSTANT": value} from ``MODULE.CONSTANT=VALUE`` strings; ``error``
    (argparse's ``ap.error``) for an item that is not of that form."""
    forms = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or "." not in name:
            error(f"--form {item!r}: expected MODULE.CONSTANT=VALUE")
        try:
            forms[name] = json.loads(value)
        except json.JSONDecodeError:
            error(f"--form {item!r}: VALUE is not JSON (true, 132, \"text\")")
    return forms


def apply(forms: dict, error) -> dict:
    """Set each form's module constant; returns the previous values (``apply`` them to
    restore). ``error`` for a module or constant that does not exist."""
    saved = {}
    for name, value in forms.items():
        module_name, _, const = name.rpartition(".")
        module = None
        for package in PACKAGES:
            try:
                module = importlib.import_module(f"{package}.{module_name}")
                break
            except ModuleNotFoundError:
                continue
        if module is None or not hasattr(module, const):
            error(f"--form {name}: no such module constant in {' or '.join(PACKAGES)}")
        saved[name] = getattr(module, const)
        setattr(module, const, value)
    return saved
