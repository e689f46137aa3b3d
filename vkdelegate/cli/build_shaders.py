"""``vkdelegate build-shaders``: compile every declared shader variant ahead of time.

Fills the SPIR-V cache ($VKDELEGATE_CACHE, default ~/.cache/vkdelegate) so that the
first load of a model does not wait for glslang. Variants already cached are skipped.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor


def run(args) -> int:
    from tqdm import tqdm

    from vkdelegate.backend.registry import load_all
    from vkdelegate.shaders.compiler import ShaderCompiler
    from vkdelegate.shaders.variants import all_variants

    load_all()
    variants = [(n, d) for n, d in all_variants() if not args.shader or n in args.shader]
    compiler = ShaderCompiler(cache=args.cache)
    jobs = args.jobs or os.cpu_count() or 1
    # glslang runs as a subprocess, so threads compile in parallel.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(compiler.compile, name, defines) for name, defines in variants]
        for fut in tqdm(futures, desc="compiling shaders", unit="variant",
                        disable=args.quiet):
            fut.result()
    print(f"{len(variants)} shader variants ready ({compiler.compiled} compiled, "
          f"{len(variants) - compiler.compiled} cached) in {compiler.cache}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("build-shaders", help="precompile every shader variant",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default=None, help="cache folder (default: "
                   "$VKDELEGATE_CACHE or ~/.cache/vkdelegate)")
    p.add_argument("-j", "--jobs", type=int, default=0,
                   help="parallel glslang processes (default: CPU count)")
    p.add_argument("--shader", action="append", default=[], metavar="NAME",
                   help="only variants of this shader (repeatable)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
