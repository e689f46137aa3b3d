"""`vkdelegate generate` on a saved program: streamed ids or text, rates on stderr."""
import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy
from vkdelegate.cli import main


def test_prompt_ids(saved, capsys):
    model, path = saved
    status = main(["generate", str(path), "--prompt-ids", "3,14,15,92,65",
                   "--max-new-tokens", "10"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.strip() == " ".join(map(str, hf_greedy(model, [3, 14, 15, 92, 65], 10)))
    assert "prefill: 5 tokens" in err and "decode: 9 tokens" in err and "tokens/s" in err
    for chunk in ("1", "4"):  # one decode call per token; 4 steps per submit
        assert main(["generate", str(path), "--prompt-ids", "3,14,15,92,65",
                     "--max-new-tokens", "10", "--decode-chunk", chunk]) == 0
        assert capsys.readouterr().out == out


def test_prompt_text_with_tokenizer(saved, tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(tmp_path / "tokenizer.json"))
    model, path = saved
    status = main(["generate", str(path), "--prompt", "w7 w8 w9 w10",
                   "--tokenizer", str(tmp_path / "tokenizer.json"), "--max-new-tokens", "6"])
    out, err = capsys.readouterr()
    assert status == 0, err
    expected = hf_greedy(model, [7, 8, 9, 10], 6)
    assert out.strip() == tok.decode(expected)
    assert "note: the tokenizer" not in err
    # Another model's tokenizer (fewer ids than the program's vocabulary): a note.
    small = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {f"w{i}": i for i in range(VOCAB // 2)}, unk_token="w0"))
    small.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    small.save(str(tmp_path / "small.json"))
    assert main(["generate", str(path), "--prompt", "w7 w8", "--tokenizer",
                 str(tmp_path / "small.json"), "--max-new-tokens", "2"]) == 0
    assert (f"note: the tokenizer has {VOCAB // 2} ids and the program's vocabulary "
            f"{VOCAB}: is it this model's tokenizer?") in capsys.readouterr().err


def test_prompt_ids_separators(saved, capsys):
    _, path = saved
    outs = []
    for ids in ("3,14,15", "3, 14, 15", "3 14 15", " 3 14,15, "):
        assert main(["generate", str(path), "--prompt-ids", ids, "--max-new-tokens", "3"]) == 0
        outs.append(capsys.readouterr())
    assert len({o.out for o in outs}) == 1 and "prefill: 3 tokens" in outs[0].err
    for bad in ("1_2,3", "1.5", "0x10", "1;2"):
        assert main(["generate", str(path), "--prompt-ids", bad]) == 2
        assert "expected integers separated by commas or spaces" in capsys.readouterr().err


def test_tokenizer_paths(saved, tmp_path, capsys):
    _, path = saved
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    for arg, message in ((tmp_path, "the folder has no tokenizer.json"),
                         (tmp_path / "none.json", "no such file"),
                         (tmp_path / "config.json", "not a HF tokenizers file")):
        assert main(["generate", str(path), "--prompt", "w1", "--tokenizer", str(arg)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err


def test_bad_arguments_exit_2(saved, capsys):
    _, path = saved
    assert main(["generate", str(path)]) == 2
    assert "--prompt-ids" in capsys.readouterr().err
    assert main(["generate", str(path), "--prompt-ids", "1,x"]) == 2
    assert "expected integers" in capsys.readouterr().err
    # An empty id between commas was dropped silently (a new user's trial).
    assert main(["generate", str(path), "--prompt-ids", "1,,2"]) == 2
    assert "expected integers" in capsys.readouterr().err
    assert main(["generate", str(path), "--prompt-ids", "1", "--image", "a.png"]) == 2
    assert "--image-token-id" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--max-new-tokens", "-3"], "max_new_tokens must be an int >= 0, got -3"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--top-p", "1.5"], "top_p must be a number in [0, 1]"),
    (["--top-k", "-2"], "top_k must be an int >= 0"),
    (["--max-new-tokens", "500"], "max_new_tokens 500 does not fit the KV cache: 5 prompt "
     "tokens + 500 new need 504 cache positions (the last new token is not stored); the "
     "program has 80 (max_seq_len), so at most 76 new tokens fit this prompt"),
    (["--decode-chunk", "0"], "decode_chunk must be an int >= 1, got 0"),
])
def test_bad_sampling_and_lengths_are_one_line(saved, capsys, extra, message):
    _, path = saved
    assert main(["generate", str(path), "--prompt-ids", "1,2,3,4,5"] + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("ids,message", [
    ("1,2 --eos-token-id 999",
     f"token id 999 (eos_token_id) >= vocab size {VOCAB} (ids are 0..{VOCAB - 1})"),
    ("1,2,300", f"token id 300 at prompt_ids[2] >= vocab size {VOCAB} (ids are 0..{VOCAB - 1})"),
    ("-4,2", f"token id -4 at prompt_ids[0] is negative (ids are 0..{VOCAB - 1})"),
])
def test_prompt_ids_outside_the_vocabulary_are_one_line(saved, capsys, ids, message):
    _, path = saved
    ids, *rest = ids.split(" ")
    for form in ([f"--prompt-ids={ids}"], ["--prompt-ids", ids]):  # "-4,2" as a value too
        assert main(["generate", str(path)] + form + rest) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_a_missing_package_names_the_extra(saved, capsys, monkeypatch):
    """Without torch (a program-only install), generate said ModuleNotFoundError in a
    bare traceback: now one line naming the package and the extra that installs it."""
    import vkdelegate.llm

    def missing(*_args, **_kwargs):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(vkdelegate.llm, "generate", missing)
    _, path = saved
    assert main(["generate", str(path), "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert err == ("vkdelegate generate: error: this command needs the Python package "
                   "'torch', which is not installed: pip install 'vkdelegate[torch]' "
                   "(torch==2.13.0)\n"), err


def test_zero_new_tokens(saved, capsys):
    _, path = saved
    assert main(["generate", str(path), "--prompt-ids", "1,2", "--max-new-tokens", "0"]) == 0
    assert capsys.readouterr().out.strip() == ""


def test_not_an_llm_program(tmp_path, capsys):
    from vkdelegate import VulkanPartitioner, to_backend

    ep = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),))
    to_backend(ep, VulkanPartitioner({"executor": "reference"})).save(tmp_path / "lin.vkp")
    assert main(["generate", str(tmp_path / "lin.vkp"), "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert "not a program of vkdelegate.llm.lower: it has no embed_text, prefill, decode " \
           "methods (its methods: forward)" in err, err


def test_default_max_new_tokens_that_does_not_fit_names_the_flag(saved, capsys):
    # 60 prompt tokens + the default 32 new ones need 91 positions of 80: the message
    # says the count came from the flag's default.
    _, path = saved
    ids = ",".join(str(i % 50 + 1) for i in range(60))
    assert main(["generate", str(path), "--prompt-ids", ids]) == 2
    err = capsys.readouterr().err
    assert "max_new_tokens 32 does not fit the KV cache" in err
    assert "--max-new-tokens was not given: its default is 32; pass a smaller N" in err
    assert err.count("\n") == 1


def test_inspect_shows_the_llm_state(saved, capsys):
    # `vkdelegate inspect` of a saved LLM program: the cache length, the vocabulary
    # and each state buffer with the shape the model's config gives it.
    from tests.llm.conftest import MAX_SEQ_LEN

    model, path = saved
    cfg = model.config
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"== LLM (vkdelegate.llm): max_seq_len {MAX_SEQ_LEN}, vocab_size {VOCAB}" in out
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for i in range(cfg.num_hidden_layers):
        for kv in "kv":
            assert (f"  decoder.kv_cache.{kv}_{i}: float32[1, {cfg.num_key_value_heads}, "
                    f"{MAX_SEQ_LEN}, {head_dim}]") in out
    assert f"  loop.history: int64[{MAX_SEQ_LEN + 1}]" in out


def test_device_option(saved, capsys):
    """--device N picks the Vulkan device (as `vkdelegate run`); a bad index is one
    line naming it."""
    model, path = saved
    assert main(["generate", str(path), "--prompt-ids", "3,14,15", "--max-new-tokens", "4",
                 "--device", "0"]) == 0
    out, _ = capsys.readouterr()
    assert out.strip() == " ".join(map(str, hf_greedy(model, [3, 14, 15], 4)))
    with pytest.raises(SystemExit):
        main(["generate", str(path), "--prompt-ids", "3", "--device", "-1"])
    assert "device index must be >= 0" in capsys.readouterr().err
    assert main(["generate", str(path), "--prompt-ids", "3", "--device", "99"]) == 2
    assert "99" in capsys.readouterr().err
