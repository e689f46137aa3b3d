"""The device-capability table against vulkaninfo, and what it drives: the SPIR-V
target (and cache key) of the compiler, and variant selection by ``requires=``."""
import json
import shutil
import subprocess

import pytest

from vkdelegate.capabilities import ALL_FEATURES, FEATURES, PORTABLE, Capabilities
from vkdelegate.errors import VkDelegateError
from vkdelegate.shaders import variants
from vkdelegate.shaders.compiler import ShaderCompiler

UNARY = {"OUT_T": "float", "IN_T": "float", "ACC_T": "float", "OP_EXPR": "x",
         "OUT_STORE(v)": "float(v)"}


@pytest.fixture
def own_variants(monkeypatch):
    """A private copy of the declared variants, so test declarations do not leak."""
    monkeypatch.setattr(variants, "_VARIANTS", dict(variants._VARIANTS))
    monkeypatch.setattr(variants, "_REQUIRES", dict(variants._REQUIRES))


def _vulkaninfo(tmp_path, name: str) -> dict:
    """vulkaninfo's JSON profile ("capabilities" -> "device") of the device ``name``."""
    if shutil.which("vulkaninfo") is None:
        pytest.skip("vulkaninfo is not installed (Debian package vulkan-tools)")
    for gpu in range(8):
        run = subprocess.run(["vulkaninfo", f"--json={gpu}"], cwd=tmp_path,
                             capture_output=True, text=True)
        files = sorted(tmp_path.glob("*.json"))
        if run.returncode != 0 or not files:
            break
        dev = json.loads(files[-1].read_text())["capabilities"]["device"]
        files[-1].unlink()
        if dev["properties"]["VkPhysicalDeviceProperties"]["deviceName"] == name:
            return dev
    pytest.skip(f"vulkaninfo --json did not describe {name}")


def test_table_has_what_vulkaninfo_reports(vk_device, tmp_path):
    caps = vk_device.capabilities
    dev = _vulkaninfo(tmp_path, vk_device.info.name)
    props = dev["properties"]
    api = props["VkPhysicalDeviceProperties"]["apiVersion"]
    assert caps.api_version == min(((api >> 22) & 0x7F, (api >> 12) & 0x3FF), (1, 3))
    for struct, names in FEATURES.items():
        reported = dev["features"].get(struct, {})
        for name in names:
            assert (name in caps.features) == bool(reported.get(name, False)), name
    assert caps.max_storage_buffer_range == \
        props["VkPhysicalDeviceProperties"]["limits"]["maxStorageBufferRange"]
    assert caps.subgroup_size == props["VkPhysicalDeviceVulkan11Properties"]["subgroupSize"]
    if "VkPhysicalDeviceVulkan13Properties" in props:
        v13 = props["VkPhysicalDeviceVulkan13Properties"]
        assert (caps.min_subgroup_size, caps.max_subgroup_size) == \
            (v13["minSubgroupSize"], v13["maxSubgroupSize"])
    assert ("cooperativeMatrix" in caps.features) <= \
        ("VK_KHR_cooperative_matrix" in dev["extensions"])
    # The flags the runtime reads come from the same table.
    assert vk_device.info.storage_16bit == ("storageBuffer16BitAccess" in caps.features)
    assert vk_device.info.float16_arith == ("shaderFloat16" in caps.features)


def test_target_env_follows_the_api_version_and_maintenance4():
    assert PORTABLE.target_env == "vulkan1.1"
    assert Capabilities(api_version=(1, 2)).target_env == "vulkan1.2"
    assert Capabilities(api_version=(1, 3)).target_env == "vulkan1.2"  # no LocalSizeId
    assert Capabilities(api_version=(1, 3),
                        features=frozenset({"maintenance4"})).target_env == "vulkan1.3"


def _spirv_version(spirv: bytes) -> tuple:
    word = int.from_bytes(spirv[4:8], "little")
    return (word >> 16) & 0xFF, (word >> 8) & 0xFF


def test_compiler_target_and_cache_key_follow_the_table(tmp_path):
    compiler = ShaderCompiler(cache=tmp_path)
    keys, versions = set(), {}
    defines = dict(UNARY, BINDING_out_data="0", BINDING_in_data="1", BINDING_out_meta="2")
    for env, spirv in (("vulkan1.1", (1, 3)), ("vulkan1.2", (1, 5)), ("vulkan1.3", (1, 6))):
        keys.add(compiler.key("unary_op", defines, env))
        versions[env] = _spirv_version(compiler.compile("unary_op", defines, env))
        assert versions[env] == spirv, env
    assert len(keys) == 3 and compiler.compiled == 3
    with pytest.raises(VkDelegateError, match="target environment 'vulkan9' is not one"):
        compiler.compile("unary_op", defines, "vulkan9")


def test_the_device_pipelines_compile_for_its_target(vk_device, monkeypatch):
    from vkdelegate.ops.registry import load_all
    from vkdelegate.runtime import pipeline as pl

    load_all()  # declares the shaders' bindings
    seen = []
    real = pl.default_compiler()

    class Recording:
        def compile(self, name, defines, target_env):
            seen.append(target_env)
            return real.compile(name, defines, target_env)

    monkeypatch.setattr(pl, "default_compiler", Recording)
    params = pl.STORAGE if vk_device.params_in_storage else pl.UNIFORM
    made = pl.Pipeline(vk_device, "unary_op", dict(UNARY, TEST_VARIANT="target"),
                       (pl.STORAGE, pl.STORAGE, params), (64, 1, 1))
    made.destroy(vk_device.device)
    assert seen == [vk_device.capabilities.target_env]


def test_a_variant_needing_a_missing_feature_is_not_chosen(own_variants):
    shader = "unary_op"
    narrow = dict(UNARY, TEST_VARIANT="coopmat")
    plain = dict(UNARY, TEST_VARIANT="plain")
    variants.declare(shader, narrow, requires=("cooperativeMatrix", "shaderFloat16"))
    variants.declare(shader, plain)
    without = Capabilities(api_version=(1, 3), features=frozenset({"shaderFloat16"}))
    full = Capabilities(api_version=(1, 3), features=ALL_FEATURES)
    assert variants.choose(shader, [narrow, plain], without) == plain
    assert variants.choose(shader, [narrow, plain], full) == narrow
    assert narrow in [d for n, d in variants.all_variants(full) if n == shader]
    assert narrow not in [d for n, d in variants.all_variants(without) if n == shader]
    with pytest.raises(VkDelegateError, match=r"no variant of shader unary_op fits the "
                       r"device: .*TEST_VARIANT=coopmat needs cooperativeMatrix$"):
        variants.choose(shader, [narrow], without)
    with pytest.raises(VkDelegateError, match=r"shader unary_op \(.*TEST_VARIANT=coopmat"
                       r"\) needs Vulkan feature\(s\) cooperativeMatrix, which the device"):
        variants.check(shader, narrow, without)
    variants.check(shader, narrow, full)  # no error


def test_requires_names_must_be_vulkan_features(own_variants):
    with pytest.raises(VkDelegateError, match="requires unknown Vulkan feature.*float16_arith"):
        variants.declare("unary_op", UNARY, requires=("float16_arith",))
    with pytest.raises(VkDelegateError, match="unknown Vulkan feature 'fp16'"):
        PORTABLE.has("fp16")


def test_pipeline_creation_refuses_a_variant_the_device_cannot_run(vk_device, own_variants):
    from vkdelegate.runtime.pipeline import Pipeline

    defines = dict(UNARY, TEST_VARIANT="needs_absent")
    absent = sorted(ALL_FEATURES - vk_device.capabilities.features)
    if not absent:
        pytest.skip(f"{vk_device.info.name} has every feature of the table")
    variants.declare("unary_op", defines, requires=(absent[0],))
    with pytest.raises(VkDelegateError, match=f"needs Vulkan feature\\(s\\) {absent[0]}"):
        Pipeline(vk_device, "unary_op", defines, (), ())
