"""benchmarks/quant_gemv.py: each case has its op's schema arity and the int4 / int8
cases compute what numpy computes from the same packed bytes (so the script times the
op it names)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quant_gemv  # noqa: E402

from vkdelegate.backend.reference import resolve  # noqa: E402


def _cases(m=2, k=256, n=40, group=64):
    return [quant_gemv._linear(m, k, n, "float32"), quant_gemv._int8(m, k, n, "float32"),
            quant_gemv._int8(m, k, n, "float16"),
            quant_gemv._int4(m, k, n, "float32", group),
            quant_gemv._int4(m, k, n, "float16", group), quant_gemv._8da4w(m, k, n, group)]


def test_cases_match_their_op_schemas():
    for node in _cases():
        (call,) = node.built.chain
        assert len(call.args) == len(resolve(call.name)._schema.arguments) + 1, node.name
        assert node.moved > 0


def test_quantized_cases_match_numpy(vk_device):
    for node in _cases():
        err = quant_gemv.rel_err(quant_gemv.first_output(node, vk_device),
                                 quant_gemv.reference(node))
        if err:  # fp32: summation order; fp16: the output's (and fp16 weights') rounding
            limit = 1e-5 if "float32" in node.name else 2e-3
            assert float(err) < limit, (node.name, err)


def test_main_prints_a_row_per_case(vk_device, capsys):
    quant_gemv.main(["--runs", "1", "--shapes", "64x32", "--group", "32"])
    out = capsys.readouterr().out
    assert out.count("64x32") == 7
