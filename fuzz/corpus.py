"""Seeds for the fuzz targets: real lowered programs, their blobs, ExecuTorch blobs.

``build_corpus(out)`` lowers a few small modules of the module suite
(``tests/program/modules.py``) covering the shapes of real programs: a conv net, an
MLP, a reduce/softmax model, a dynamic-shape one, one with SymInt values (two
symbolic view sizes, a symbolic arange), one with mutable state, one with CPU
glue between delegates, a multi-method one, one returning a namedtuple and a dict-like
record, and one on the reference executor. It
writes::

    out/program/<name>.vkp     LoweredProgram.save files (seeds of "program")
    out/blob/<name>.bin        their delegate blobs and tests/data/et_vk/*.bin
    out/pte/<name>.pte         ExecuTorch programs of tests/data/pte/ (seeds of "pte")
    out/inspect/<file>         all of the above (seeds of "inspect")
    out/named_data.json        {named key: hex bytes} of every blob's named constants
    out/fuzz.dict              libFuzzer dictionary: magics, manifest keys, edge values

Seeds are generated at run time (not committed): ``python -m fuzz.corpus OUT``.
Needs torch (lowering); the seed files themselves are plain bytes.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ET_VK_DIR = REPO / "tests" / "data" / "et_vk"
#: ExecuTorch 1.5.1 programs (made by tests/data/pte/generate.py in .venv-et).
PTE_DIR = REPO / "tests" / "data" / "pte"

#: (seed name, module-suite case names (one per method), partitioner options).
PROGRAMS = [
    ("conv_net", ["conv_bn_relu"], {}),
    ("conv_stride", ["conv_stack"], {}),
    ("mlp", ["linear_stack"], {}),
    ("reduce_softmax", ["softmax_mean"], {}),
    ("dynamic_batch", ["dynamic_linear"], {}),
    ("symbolic_sizes", ["dynamic_symbolic_sizes"], {}),
    ("mutable_state", ["mutable_buffer"], {}),
    ("glue_sort", ["mixed_sort"], {}),
    ("multi_method", ["add_relu", "broadcast_add"], {}),
    ("fused_chain", ["elementwise_chain", "scalar_and_alpha"], {}),
    ("named_outputs", ["named_outputs"], {}),
    ("reference_mlp", ["linear_bn"], {"executor": "reference"}),
    # vkdelegate.llm.lower's four methods (KV cache state, the host-side input checks
    # and the plans' "llm" record: vocabulary size and end-of-sequence ids).
    ("llm", "llm", {}),
]

# Dictionary entries: formats' magics, manifest keys and values that sit on edges
# (int32 / int64 / fp16 limits, JSON spellings of non-finite numbers).
_DICT_WORDS = [
    b"VH00", b"VK00", b"VKDPROG1", b"Infinity", b"-Infinity", b"NaN", b"1e309",
    b"65537", b"268435456", b"2147483647", b"2147483648", b"4294967296",
    b"9223372036854775807", b"18446744073709551616", b"-1", b"65504",
    b'"sym"', b'"expr"', b'"const"', b'"v"', b'"op"', b'"args"', b'"kwargs"',
    b'"out"', b'"delegate"', b'"getitem"', b'"index"', b'"shape"', b'"dtype"',
    b'"segment"', b'"segments"', b'"offset"', b'"size"', b'"named_data"', b'"blob"',
    b'"plan"', b'"nodes"', b'"inputs"', b'"outputs"', b'"ranges"', b'"state"',
    b'"state_updates"', b'"input_updates"', b'"constants"', b'"methods"',
    b'"options"', b'"executor"', b'"reference"', b'"vulkan"', b'"force_fp16"',
    b'"aten.from_file.default"', b'"aten.full.default"', b'"aten.empty.memory_format"',
    b'"bfloat16"', b'"float16"', b'"int64"', b'"bool"',
    b'"record"', b'"namedtuple"', b'"n"', b'"k"', b'"t"',
    # fused elementwise chains (kernels/elementwise_chain.py's grammar)
    b"vkdelegate.fused_elementwise.default", b"aten.mul.Tensor(r0,r1)", b"(r0)", b",s0",
    b",'tanh'", b"aten.clamp.default(r0,s0,s1)", b";",
    b"aten._to_copy.default(r0,'float16')", b",'float32'",
]


def _lower_llm():
    """A one-layer ReferenceDecoder through vkdelegate.llm.lower (cache of 16), with
    end-of-sequence ids recorded."""
    import torch

    from vkdelegate.llm import lower
    from vkdelegate.llm.lower import record_vocab_size
    from vkdelegate.llm.reference_decoder import ReferenceDecoder

    torch.manual_seed(0)
    model = ReferenceDecoder(vocab=64, dim=32, layers=1, heads=2, kv_heads=1, hidden=64,
                             max_seq_len=16)
    program = lower(model, 16)
    record_vocab_size(program, 64, [3, 7])
    return program


def _lower(case_names, options: dict):
    if case_names == "llm":
        return _lower_llm()
    import torch
    from tests.program.helpers import export
    from tests.program.modules import CASES

    from vkdelegate import VulkanPartitioner, to_backend

    by_name = {c.name: c for c in CASES}
    eps = {}
    for i, name in enumerate(case_names):
        torch.manual_seed(i)
        _, ep, _ = export(by_name[name])
        eps["forward" if i == 0 else name] = ep
    return to_backend(eps, VulkanPartitioner(options))


def _dict_line(word: bytes) -> str:
    # libFuzzer dictionary syntax: one quoted entry a line, every byte as \xNN.
    return '"' + "".join(f"\\x{b:02x}" for b in word) + '"\n'


def build_corpus(out, programs=None) -> Path:
    """Write the seed folders under ``out`` (see the module docstring); returns it.

    programs: a subset of PROGRAMS (default all of them), e.g. for a quick test.
    """
    out = Path(out)
    for sub in ("program", "blob", "inspect", "pte"):
        shutil.rmtree(out / sub, ignore_errors=True)
        (out / sub).mkdir(parents=True)
    named: dict[str, str] = {}
    for name, cases, options in PROGRAMS if programs is None else programs:
        program = _lower(cases, options)
        path = out / "program" / f"{name}.vkp"
        program.save(path)
        shutil.copy(path, out / "inspect" / path.name)
        for method, m in program.methods.items():
            for i, d in enumerate(m.delegates):
                blob = out / "blob" / f"{name}.{method}.{i}.bin"
                blob.write_bytes(d.blob)
                named.update({k: bytes(v).hex() for k, v in d.named_data.items()})
        program.close()
    for et in sorted(ET_VK_DIR.glob("*.bin")):
        shutil.copy(et, out / "blob" / f"et_{et.name}")
        shutil.copy(et, out / "inspect" / f"et_{et.name}")
        named_file = et.with_suffix(".named.json")
        if named_file.exists():
            named.update(json.loads(named_file.read_text()))
    for pte in sorted(PTE_DIR.glob("*.pte")):
        shutil.copy(pte, out / "pte" / pte.name)
        shutil.copy(pte, out / "inspect" / pte.name)
    (out / "named_data.json").write_text(json.dumps(named))
    (out / "fuzz.dict").write_text("".join(_dict_line(w) for w in _DICT_WORDS))
    return out


def load_named_data(seeds) -> dict[str, bytes]:
    """The named-constant pool written by build_corpus (key -> bytes)."""
    path = Path(seeds) / "named_data.json"
    return {k: bytes.fromhex(v) for k, v in json.loads(path.read_text()).items()}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m fuzz.corpus OUT_DIR")
    print(f"seeds written to {build_corpus(sys.argv[1])}")
