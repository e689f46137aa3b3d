"""GLSL -> SPIR-V with glslangValidator, cached on disk.

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
        self.tool = shutil.which("glslangValidator")
        self._version: str | None = None
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
                                 text=True)
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
            out = subprocess.run(cmd, capture_output=True, text=True)
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
