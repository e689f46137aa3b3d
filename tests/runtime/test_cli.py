"""`vkdelegate devices` and `vkdelegate build-shaders`."""
import json
import re
import subprocess
import sys

from vkdelegate.cli import main


def test_devices_table_and_json(vk_device, capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert vk_device.info.name in out and "max SSBO" in out
    assert re.search(rf"SPIR-V target +{vk_device.capabilities.target_env}\n", out)
    assert main(["devices", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    mine = next(d for d in listed if d["name"] == vk_device.info.name)
    assert mine["storage_16bit"] == vk_device.info.storage_16bit
    caps = vk_device.capabilities
    assert mine["capabilities"]["target_env"] == caps.target_env
    assert mine["capabilities"]["features"]["storageBuffer8BitAccess"] == \
        ("storageBuffer8BitAccess" in caps.features)
    assert sum(d["default"] for d in listed) == 1


def test_build_shaders_compiles_then_hits_the_cache(tmp_path, capsys):
    args = ["build-shaders", "--cache", str(tmp_path), "--shader", "reduce_sum", "-q"]
    assert main(args) == 0
    first = re.search(r"(\d+) shader variants ready \((\d+) compiled, (\d+) cached\)",
                      capsys.readouterr().out)
    total, compiled, cached = map(int, first.groups())
    assert total >= 2 and compiled == total and cached == 0
    assert len(list((tmp_path / "spirv").glob("*.spv"))) == total
    assert main(args) == 0
    assert f"{total} shader variants ready (0 compiled, {total} cached)" in \
        capsys.readouterr().out


def test_build_shaders_argument_errors_are_one_line(capsys):
    from vkdelegate.cli import main

    assert main(["build-shaders", "--shader", "no_such_shader"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vkdelegate build-shaders: error: no shader named no_such_shader;")
    assert "binary_op" in err and err.count("\n") == 1
    assert main(["build-shaders", "-j", "-2"]) == 2
    assert "--jobs must be 0" in capsys.readouterr().err


def test_build_shaders_names_a_shader_the_device_cannot_run(vk_device, capsys):
    # A shader whose every variant needs features the device lacks (lavapipe: the
    # workgroup-scope cooperative matrices) is named as such, not as unknown. The
    # command reads the device's own table (a validated test device turns the
    # cooperative matrices off; a GPU then still builds the shader).
    from vkdelegate.cli.build_shaders import _default_capabilities
    from vkdelegate.kernels import gemm_core
    if not _default_capabilities().missing(gemm_core.COOPMAT_WG_REQUIRES):
        import pytest
        pytest.skip("the device runs gemm_coopmat_wg.glsl")
    assert main(["build-shaders", "--shader", "gemm_coopmat_wg"]) == 2
    err = capsys.readouterr().err
    assert "the device lacks the Vulkan features that every variant of gemm_coopmat_wg " \
        "requires" in err and err.count("\n") == 1


def test_closed_pipe_ends_quietly(tmp_path):
    # `vkdelegate devices --json | head -1`: no BrokenPipeError traceback.
    proc = subprocess.run(f"{sys.executable} -m vkdelegate devices --json | head -c 1",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
