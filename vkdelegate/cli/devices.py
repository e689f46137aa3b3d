"""``vkdelegate devices``: list the Vulkan devices and what matters for compute.

For each device: index (usable as ``VKDELEGATE_DEVICE``), name, type, driver, API
version, 8/16-bit storage and arithmetic, subgroup size and operations, cooperative
matrix support and the main compute limits. The device the runtime would pick by
default is marked with ``*``. Then each device's capability table
(vkdelegate/capabilities.py): effective API version, SPIR-V target, every Vulkan
feature the runtime may enable, subgroup size range, cooperative-matrix shapes.
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
        print(json.dumps([_as_json(d, chosen) for d in infos], indent=2))
        return 0
    # One narrow row per device (fits 100 columns); the features are in each
    # device's capability table below.
    rows = [[f"{'*' if d.index == chosen else ' '}{d.index}", d.name, d.type, d.driver,
             d.api_version, f"{d.max_storage_buffer_range >> 20} MiB"] for d in infos]
    print(tabulate(rows, headers=["#", "name", "type", "driver", "api", "max SSBO"]))
    if not infos:
        print("no Vulkan devices found")
        return 1
    for d in infos:
        print(f"\ncapabilities of {d.index}: {d.name}")
        rows = _capability_rows(d.capabilities) + [
            ["subgroup operations", ", ".join(d.subgroup_ops) or "-"],
            ["maxComputeWorkGroupInvocations", str(d.max_workgroup_invocations)],
            ["maxComputeWorkGroupCount", "x".join(map(str, d.max_workgroup_count))],
            ["uniform texel buffers", f"{', '.join(sorted(d.texel_formats)) or '-'} "
             f"(maxTexelBufferElements {d.max_texel_buffer_elements})"]]
        print(tabulate(rows, headers=["capability", "value"]))
    print(f"\nshader compilers (the first builds what it can): {_compilers()}")
    return 0


def _compilers() -> str:
    """The glslangValidators at hand and the GLSL extensions with a probe each builds:
    a device enables cooperative-matrix features only where one of them builds the
    extension (runtime/device.py), whatever its capability table above says."""
    from vkdelegate.shaders.compiler import PROBED_EXTENSIONS, ShaderCompiler
    try:
        compiler = ShaderCompiler()
    except VkDelegateError as exc:
        return str(exc)
    if not compiler.tools:
        return "none (glslangValidator not found)"
    parts = []
    for tool, env in compiler.tools:
        builds = [ext for ext in PROBED_EXTENSIONS if compiler.tool_supports(tool, env, ext)]
        parts.append(f"{tool} ({', '.join(builds) or 'no probed extension'})")
    return "; ".join(parts)


def _capability_rows(caps) -> list:
    """(name, value) rows of a capability table: versions, features, sizes."""
    table = caps.as_dict()
    rows = [["api version (effective)", table["api_version"]],
            ["SPIR-V target", table["target_env"]]]
    rows += [[name, _yes(on)] for name, on in table["features"].items()]
    lo, hi = table["subgroup_size_range"]
    rows += [["subgroupSize", f"{caps.subgroup_size} (range {lo}..{hi})"],

             ["maxStorageBufferRange", f"{caps.max_storage_buffer_range} bytes"]]
    rows += [["cooperative matrix", f"{s.m}x{s.n}x{s.k} {s.a}*{s.b}+{s.c}->{s.result}"]
             for s in caps.cooperative_matrix_shapes]
    rows += [["flexible cooperative matrix",
              f"multiples of {s.m}x{s.n}x{s.k} (up to {caps.cooperative_matrix_max_dimension}) "
              f"{s.a}*{s.b}+{s.c}->{s.result} {s.scope.lower()} scope"
              + (f", {s.workgroup_invocations} invocations" if s.scope == "WORKGROUP" else "")]
             for s in caps.flexible_matrix_shapes]
    return rows


def _as_json(d, chosen: int) -> dict:
    """One device as JSON: DeviceInfo's fields, its flags and the capability table."""
    out = {k: v for k, v in asdict(d).items() if k != "capabilities"}
    out.update(extensions=sorted(d.extensions), texel_formats=sorted(d.texel_formats),
               default=d.index == chosen,
               capabilities=d.capabilities.as_dict(),
               **{k: getattr(d, k) for k in ("storage_8bit", "storage_16bit",
                                             "float16_arith", "int8_arith",
                                             "subgroup_size", "cooperative_matrix",
                                             "max_storage_buffer_range")})
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("devices", help="list Vulkan devices and their compute "
                              "properties", description=help_description(__doc__))
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)
