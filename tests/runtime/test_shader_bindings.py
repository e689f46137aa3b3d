"""Every declared shader variant, compiled and reflected, against its Python bindings.

The GLSL names its bindings (TENSOR_OUT/TENSOR_IN/TENSOR_META/PARAMS) and the op
declares them in Python (shaders.bindings.shader_bindings, runtime.param_block): here
the SPIR-V's binding numbers, descriptor kinds, access and every parameter block's
member names, types and offsets must equal the declaration, for uniform blocks (GPUs)
and with PARAMS_IN_STORAGE (lavapipe); inputs declared as texel buffers must be
``uniform samplerBuffer`` variables of their name. Variants that differ only in define
values (dtypes, expressions) share their bindings, so one per set of define names is
compiled.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.runtime.spirv_reflect import Module
from vkdelegate.ops.registry import load_all
from vkdelegate.runtime.param_block import STRUCTS, ParamBlock
from vkdelegate.shaders.bindings import binding_defines, bindings_of
from vkdelegate.shaders.compiler import default_compiler
from vkdelegate.shaders.variants import all_variants


def _representatives() -> list[tuple[str, dict]]:
    load_all()
    chosen = {}
    for shader, defines in all_variants():
        chosen.setdefault((shader, tuple(sorted(defines))), (shader, defines))
    return list(chosen.values())


def _expected_members(block: ParamBlock) -> list:
    return [(name, type_, block.offsets[name]) for name, type_ in block.fields]


def _mismatches(shader: str, defines: dict, in_storage: bool, spirv: bytes) -> list[str]:
    declared = bindings_of(shader, defines)
    reflected = Module(spirv).bindings()
    names = declared.names()
    problems = []
    if sorted(reflected) != list(range(len(names))):
        problems.append(f"SPIR-V bindings {sorted(reflected)}, declared {names}")
    param_kind = "storage" if in_storage else "uniform"
    for index, name in enumerate(names):
        got = reflected.get(index)
        if got is None:
            continue
        is_output = index < len(declared.outputs)
        is_param = index >= len(declared.outputs) + len(declared.inputs)
        want_kind = param_kind if is_param else \
            ("texel" if declared.texel_format(name) else "storage")
        if got.set != 0 or got.kind != want_kind:
            problems.append(f"binding {index} ({name}): set {got.set} {got.kind}, "
                            f"expected set 0 {want_kind}")
        if is_param:
            block = declared.params[index - len(declared.outputs) - len(declared.inputs)]
            if got.members != _expected_members(block):
                problems.append(f"binding {index} ({name}): members {got.members}, "
                                f"declared {_expected_members(block)}:\n{block.glsl()}")
            for struct, members in got.structs.items():
                want = _expected_members(ParamBlock(struct, STRUCTS.get(struct, ())))
                if members != want:
                    problems.append(f"struct {struct}: {members}, declared {want}")
            if in_storage and not got.non_writable:
                problems.append(f"binding {index} ({name}): parameter block not readonly")
            continue
        if [m[0] for m in got.members] != [name]:
            problems.append(f"binding {index}: buffer {got.members}, declared {name}")
        # The error-flag words are read and written (atomicOr); tensors one way only.
        access = (got.non_writable, got.non_readable)
        want = (False, False) if name == "error_flags" else \
            ((False, True) if is_output else (True, False))
        if access != want:
            problems.append(f"binding {index} ({name}): (readonly, writeonly) {access}, "
                            f"expected {want}")
    return problems


def test_every_variant_matches_its_declared_bindings():
    compiler = default_compiler()
    # A shader this glslang cannot build (gemm_coopmat_wg.glsl's GL_NV_cooperative_
    # matrix2 before glslang 15) is never chosen here: device creation keeps its
    # features off.
    jobs = [(shader, defines, in_storage) for shader, defines in _representatives()
            if compiler.builds(shader) for in_storage in (False, True)]

    def check(job):
        shader, defines, in_storage = job
        full = binding_defines(shader, defines)
        if in_storage:
            full["PARAMS_IN_STORAGE"] = "1"
        problems = _mismatches(shader, defines, in_storage,
                               compiler.compile(shader, full))
        flavor = "storage" if in_storage else "uniform"
        return [f"{shader} ({flavor}) {sorted(defines)}: {p}" for p in problems]

    # glslang runs as a subprocess: two at a time (the suite runs with -n 2 at most).
    with ThreadPoolExecutor(2) as pool:
        problems = [p for found in pool.map(check, jobs) for p in found]
    assert {s for s, _, _ in jobs} >= {"binary_op", "conv2d", "pool2d", "linear"}
    assert not problems, "\n".join(problems)


def test_a_binding_the_python_side_does_not_declare_fails_to_compile(tmp_path):
    from vkdelegate.errors import VkDelegateError
    from vkdelegate.shaders.compiler import GLSL_DIR, ShaderCompiler
    (tmp_path / "extra.glsl").write_text(
        '#version 450\n#extension GL_GOOGLE_include_directive : require\n'
        '#include "common.h"\nTENSOR_OUT(out_data, float)\nTENSOR_IN(in_data, float)\n'
        'void main() { out_data[0] = in_data[0]; }\n')
    for header in GLSL_DIR.glob("*.h"):
        (tmp_path / header.name).write_text(header.read_text())
    compiler = ShaderCompiler(glsl_dir=tmp_path, cache=tmp_path / "cache")
    assert compiler.compile("extra", {"BINDING_out_data": "0", "BINDING_in_data": "1"})
    with pytest.raises(VkDelegateError, match=r"shader extra.glsl line 5: .*BINDING_in_data"):
        compiler.compile("extra", {"BINDING_out_data": "0"})
