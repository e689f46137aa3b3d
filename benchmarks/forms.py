"""Kernel forms for a benchmark run: ``MODULE.CONSTANT=VALUE`` sets an UPPER_CASE module
constant of vkdelegate.kernels or vkdelegate.ops.families
(``conv_pointwise.SPLIT_K=false``) before the program is
built, so that one script compares forms across runs (efficientnet.py ``--form``) or rows (llm_decode.py ``--quantization
int4+quantized_linear.VSG_ROWS=true``). VALUE is JSON (true, 132) of the constant's
current type (an int where it is a float is taken); forms are read when a program is
built. Most forms choose among GPU kernels: on CPU drivers (llvmpipe) several of them
(conv_pointwise.*, quantized_linear.V*) change nothing."""
from __future__ import annotations

import importlib
import json

PACKAGES = ("vkdelegate.kernels", "vkdelegate.ops.families")


def parse(items: list, error, flag: str = "--form") -> dict:
    """{"module.CONSTANT": value} from ``MODULE.CONSTANT=VALUE`` strings, each checked
    against the constant it names (``resolve``); ``error`` (argparse's ``ap.error``)
    for an item that is not of that form, names no such constant, or whose value is
    not JSON of the constant's type. ``flag`` names the option in messages."""
    forms = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or "." not in name:
            error(f"{flag} {item!r}: expected MODULE.CONSTANT=VALUE")
        try:
            forms[name] = json.loads(value)
        except json.JSONDecodeError:
            error(f"{flag} {item!r}: VALUE is not JSON (true, 132, \"text\")")
        resolve(name, forms[name], error, flag)
    return forms


def resolve(name: str, value, error, flag: str = "--form"):
    """The module that holds constant ``name`` (``module.CONSTANT``), after checking
    that CONSTANT is an UPPER_CASE constant there and ``value`` has its type; else
    ``error`` with the reason."""
    module_name, _, const = name.rpartition(".")
    if not const.isupper():
        error(f"{flag} {name}: {const!r} is not an UPPER_CASE module constant")
    module = None
    for package in PACKAGES:
        try:
            module = importlib.import_module(f"{package}.{module_name}")
            break
        except ModuleNotFoundError:
            continue
    if module is None or not hasattr(module, const):
        error(f"{flag} {name}: no such module constant in {' or '.join(PACKAGES)}")
    current = getattr(module, const)
    ok = (isinstance(value, bool) if isinstance(current, bool)
          else isinstance(value, (int, float)) and not isinstance(value, bool)
          if isinstance(current, float)
          else type(value) is type(current))
    if not ok:
        kind = type(current).__name__
        error(f"{flag} {name}={json.dumps(value)}: {const} is "
              f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({current!r} now)")
    return module


def apply(forms: dict, error, flag: str = "--form") -> dict:
    """Set each form's module constant (checked by ``resolve``); returns the previous
    values (``apply`` them to restore)."""
    saved = {}
    for name, value in forms.items():
        module = resolve(name, value, error, flag)
        const = name.rpartition(".")[2]
        saved[name] = getattr(module, const)
        setattr(module, const, value)
    return saved
