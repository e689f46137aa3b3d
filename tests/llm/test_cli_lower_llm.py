"""`vkdelegate lower-llm`: a checkpoint folder (save_pretrained) to a program file that
`vkdelegate generate` runs to HF's greedy tokens, stopping at the checkpoint's
end-of-sequence id; int4 quantization through torchao; one-line errors before the slow
steps."""
import pytest

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import hf_greedy, make_model
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate.cli import main

PROMPT = [4, 8, 15, 16, 23]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    if vulkan_unavailable():
        pytest.skip(vulkan_unavailable())
    pytest.importorskip("transformers")
    model = make_model("qwen2", seed=7)
    run = hf_greedy(model, PROMPT, 12)
    model.generation_config.eos_token_id = run[6]
    folder = tmp_path_factory.mktemp("ckpt") / "qwen2"
    model.save_pretrained(folder)
    return model, folder, run


def test_lower_then_generate(checkpoint, tmp_path, capsys):
    import vkdelegate
    from vkdelegate.llm import generate

    model, folder, run = checkpoint
    out = tmp_path / "qwen2.vkp"
    assert main(["lower-llm", str(folder), "-o", str(out), "--max-seq-len",
                 str(MAX_SEQ_LEN)]) == 0
    printed = capsys.readouterr().out
    assert "decode: " in printed and f"end-of-sequence ids [{run[6]}]" in printed
    # the checkpoint has no tokenizer: the suggested command takes token ids
    assert f"run it: vkdelegate generate {out} --prompt-ids" in printed
    stop = run.index(run[6]) + 1
    assert main(["generate", str(out), "--prompt-ids", ",".join(map(str, PROMPT)),
                 "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in run[:stop]]
    program = vkdelegate.load(out)
    try:
        assert generate(program, PROMPT, 12, eos_token_id=[]) == run
    finally:
        program.close()


def test_lower_int4(checkpoint, tmp_path, capsys):
    pytest.importorskip("torchao")
    import vkdelegate
    from vkdelegate.llm import generate

    _, folder, _ = checkpoint
    out = tmp_path / "q4.vkp"
    assert main(["lower-llm", str(folder), "-o", str(out), "--max-seq-len",
                 str(MAX_SEQ_LEN), "--quantization", "int4", "--group-size", "32"]) == 0
    # Hidden size 64, FFN 128: at group size 128 only down_proj can be quantized, and
    # a warning names the linears that stay in float; at 256 none can: refused.
    with pytest.warns(UserWarning, match=r"int4 with group size 128: 13 of 15 linear "
                                         r"layers stay in floating point.*q_proj"):
        assert main(["lower-llm", str(folder), "-o", str(tmp_path / "g.vkp"),
                     "--max-seq-len", "8", "--quantization", "int4", "--group-size",
                     "128"]) == 0
    capsys.readouterr()
    assert main(["lower-llm", str(folder), "-o", str(tmp_path / "g2.vkp"), "--max-seq-len",
                 "8", "--quantization", "int4", "--group-size", "256"]) == 2
    assert "none would be quantized" in capsys.readouterr().err
    assert not (tmp_path / "g2.vkp").exists()
    # The reference: the same checkpoint quantized the same way, in eager.
    from vkdelegate.backend.quantize import quantize_for_vulkan
    from vkdelegate.llm.pretrained import load_causal_lm

    model = load_causal_lm(str(folder))
    quantize_for_vulkan(model, "int4", 32)
    # hf_greedy's min_new_tokens would keep the checkpoint's eos id from being picked.
    model.generation_config.eos_token_id = None
    program = vkdelegate.load(out)
    try:
        assert "linear_q4gsw" in str(program.methods["decode"].report.to_json())
        assert generate(program, PROMPT, 8, eos_token_id=[]) == hf_greedy(model, PROMPT, 8)
    finally:
        program.close()


@pytest.mark.parametrize("args,message", [
    (["--max-seq-len", "1"], "--max-seq-len must be >= 2, got 1"),
    (["--max-seq-len", "8", "-o", "/no/such/dir/p.vkp"], "folder /no/such/dir does not exist"),
    (["--max-seq-len", "8", "-o", "/tmp"], "cannot write /tmp: it is a folder"),
    (["--max-seq-len", "8", "--group-size", "64"],
     "--group-size applies to --quantization int4 and 8da4w, not none"),
    (["--max-seq-len", "8", "--quantization", "int8", "--group-size", "64"],
     "not int8"),
])
def test_errors_before_the_slow_steps(checkpoint, tmp_path, capsys, args, message):
    _, folder, _ = checkpoint
    argv = ["lower-llm", str(folder)] + (["-o", str(tmp_path / "p.vkp")]
                                         if "-o" not in args else []) + args
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_not_a_checkpoint(tmp_path, capsys):
    assert main(["lower-llm", str(tmp_path), "-o", str(tmp_path / "p.vkp"),
                 "--max-seq-len", "8"]) == 2
    assert "not a HF checkpoint folder (no config.json)" in capsys.readouterr().err
    assert main(["lower-llm", str(tmp_path / "nope"), "-o", str(tmp_path / "p.vkp"),
                 "--max-seq-len", "8"]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_a_cache_too_large_is_refused_before_it_is_allocated(checkpoint, tmp_path, capsys):
    """100 M positions: refused with the cache's size, not killed for memory."""
    _, folder, _ = checkpoint
    assert main(["lower-llm", str(folder), "-o", str(tmp_path / "p.vkp"),
                 "--max-seq-len", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "max_seq_len 100000000: the KV cache would take" in err, err
    assert "lower with a smaller max_seq_len" in err, err
    assert not (tmp_path / "p.vkp").exists()


def test_the_checkpoints_own_files_are_not_overwritten(checkpoint, tmp_path, capsys):
    """-o naming the checkpoint's weights (or any file that is not a program file) is
    refused before the slow steps, the file untouched."""
    import shutil

    _, folder, _ = checkpoint
    copy = tmp_path / "ckpt"
    shutil.copytree(folder, copy)
    weights = copy / "model.safetensors"
    before = weights.read_bytes()
    assert main(["lower-llm", str(copy), "-o", str(weights), "--max-seq-len", "8"]) == 2
    err = capsys.readouterr().err
    assert "exists and is not a vkdelegate program file" in err and \
        len(err.splitlines()) == 1, err
    assert weights.read_bytes() == before


def test_a_truncated_weights_file_is_one_line(checkpoint, tmp_path, capsys):
    import shutil

    _, folder, _ = checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert main(["lower-llm", str(bad), "-o", str(tmp_path / "p.vkp"),
                 "--max-seq-len", "8"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("loading ")]
    assert len(lines) == 1 and f"{bad}: cannot load the model (SafetensorError: " in \
        lines[0], err
