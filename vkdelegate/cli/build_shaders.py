"""``vkdelegate build-shaders``: compile every declared shader variant ahead of time.

Fills the SPIR-V cache ($VKDELEGATE_CACHE, default ~/.cache/vkdelegate) so that the
first load of a model does not wait for glslang. Variants already cached are skipped.
Each variant is compiled twice: with uniform parameter blocks (GPUs) and with
PARAMS_IN_STORAGE (lavapipe; see vkdelegate.runtime.device.uniform_inlining_driver),
for the SPIR-V target of the device the runtime would use (its capability table,
vkdelegate/capabilities.py; variants requiring features it lacks are skipped), or of
``--target-env``; vulkan1.1 and every variant where no Vulkan device is found.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from vkdelegate.cli import help_description
from vkdelegate.errors import VkDelegateError
from vkdelegate.shaders.compiler import TARGET_ENVS


def _default_capabilities():
    """The capability table of the device the runtime would pick, else PORTABLE."""
    from vkdelegate.capabilities import PORTABLE

    try:
        from vkdelegate.runtime.device import list_devices
        from vkdelegate.runtime.device_info import select
        return select(list_devices(), os.environ.get("VKDELEGATE_DEVICE")).capabilities
    except (OSError, VkDelegateError):  # no loader, no device
        return PORTABLE


def run(args) -> int:
    from tqdm import tqdm

    from vkdelegate.ops.registry import load_all
    from vkdelegate.shaders.bindings import binding_defines
    from vkdelegate.shaders.compiler import ShaderCompiler
    from vkdelegate.shaders.variants import all_variants

    if args.jobs < 0:
        raise VkDelegateError(f"--jobs must be 0 (CPU count) or more, got {args.jobs}")
    load_all()
    caps = _default_capabilities()
    target = args.target_env or caps.target_env
    declared = all_variants(caps)
    unknown = sorted(set(args.shader) - {n for n, _ in declared})
    if unknown:
        every = {n for n, _ in all_variants()}
        lacking = [n for n in unknown if n in every]
        if lacking:
            raise VkDelegateError(f"the device lacks the Vulkan features that every "
                                  f"variant of {', '.join(lacking)} requires (see "
                                  f"vkdelegate devices)")
        raise VkDelegateError(f"no shader named {', '.join(unknown)}; shaders: "
                              f"{', '.join(sorted(every))}")
    compiler = ShaderCompiler(cache=args.cache)
    # A shader that needs a GLSL extension no glslang at hand compiles (e.g.
    # GL_NV_cooperative_matrix2 without a glslang 15) is skipped, as device creation
    # turns its features off (runtime/device.py).
    unbuilt = sorted(n for n in {n for n, _ in declared}
                     if (not args.shader or n in args.shader) and compiler.tool
                     and not compiler.builds(n))
    for name in unbuilt:
        print(f"skipping {name}: no glslang at hand compiles its GLSL extensions "
              f"({', '.join(e for e in compiler.required_extensions(name) if not compiler.supports(e))})")
    # The defines runtime.pipeline.compile_defines gives, so the cache keys match.
    variants = [(n, flavor) for n, d in declared if not args.shader or n in args.shader
                if n not in unbuilt
                for full in (binding_defines(n, d),)
                for flavor in (full, dict(full, PARAMS_IN_STORAGE="1"))]
    jobs = args.jobs or os.cpu_count() or 1
    # glslang runs as a subprocess, so threads compile in parallel.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(compiler.compile, name, defines, target)
                   for name, defines in variants]
        for fut in tqdm(futures, desc="compiling shaders", unit="variant",
                        disable=True if args.quiet else None):  # None: off without a TTY
            fut.result()
    print(f"{len(variants)} shader variants ready ({compiler.compiled} compiled, "
          f"{len(variants) - compiler.compiled} cached) in {compiler.cache} for {target}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("build-shaders", help="precompile every shader variant",
                              description=help_description(__doc__))
    p.add_argument("--cache", default=None, help="cache folder (default: "
                   "$VKDELEGATE_CACHE or ~/.cache/vkdelegate)")
    p.add_argument("-j", "--jobs", type=int, default=0,
                   help="parallel glslang processes (default: CPU count)")
    p.add_argument("--shader", action="append", default=[], metavar="NAME",
                   help="only variants of this shader (repeatable)")
    p.add_argument("--target-env", choices=TARGET_ENVS, default=None,
                   help="SPIR-V target (default: the device's, see vkdelegate devices)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
