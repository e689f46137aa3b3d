"""``vkdelegate devices``: list the Vulkan devices and what matters for compute.

For each device: index (usable as ``VKDELEGATE_DEVICE``), name, type, driver, API
version, 8/16-bit storage and arithmetic, subgroup size and operations, cooperative
matrix support and the main compute limits. The device the runtime would pick by
default is marked with ``*``.
"""
from __future__ import annotations

import json
from dataclasses import asdict

from vkdelegate.cli import help_description
from vkdelegate.errors import VkDelegateError


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def run(args) -> int:
    from tabulate import tabulate

    try:
        from vkdelegate.runtime.device import list_devices
        from vkdelegate.runtime.device_info import select
    except OSError as exc:  # the vulkan binding could not load libvulkan
        raise VkDelegateError(f"no Vulkan loader (libvulkan.so.1, Debian package "
                              f"libvulkan1): {exc}") from None

    infos = list_devices()
    chosen = select(infos, None).index if infos else -1
    if args.json:
        print(json.dumps([dict(asdict(d), extensions=sorted(d.extensions),
                               default=d.index == chosen) for d in infos], indent=2))
        return 0
    rows = []
    for d in infos:
        rows.append([
            f"{'*' if d.index == chosen else ' '}{d.index}", d.name, d.type, d.driver,
            d.api_version,
            f"storage {_yes(d.storage_16bit)}, math {_yes(d.float16_arith)}",
            f"storage {_yes(d.storage_8bit)}, math {_yes(d.int8_arith)}",
            f"{d.subgroup_size} ({', '.join(d.subgroup_ops) or '-'})",
            _yes(d.cooperative_matrix),
            f"{d.max_storage_buffer_range >> 20} MiB",
            f"{d.max_workgroup_invocations} / {'x'.join(map(str, d.max_workgroup_count))}",
        ])
    print(tabulate(rows, headers=["#", "name", "type", "driver", "api", "fp16", "int8",
                                  "subgroup", "coop. matrix", "max SSBO",
                                  "max invocations / groups"]))
    if not infos:
        print("no Vulkan devices found")
        return 1
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("devices", help="list Vulkan devices and their compute "
                              "properties", description=help_description(__doc__))
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)
