"""`vkdelegate generate` on a saved program: streamed ids or text, rates on stderr."""
import pytest
import torch

from tests.llm.models import VOCAB, hf_greedy
from vkdelegate.cli import main


@pytest.fixture(scope="module")
def saved(lowered, tmp_path_factory):
    model, program = lowered("llama")
    path = tmp_path_factory.mktemp("gen") / "llama.vkp"
    program.reset_state()
    program.save(path)
    return model, path


def test_prompt_ids(saved, capsys):
    model, path = saved
    status = main(["generate", str(path), "--prompt-ids", "3,14,15,92,65",
                   "--max-new-tokens", "10"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.strip() == " ".join(map(str, hf_greedy(model, [3, 14, 15, 92, 65], 10)))
    assert "prefill: 5 tokens" in err and "decode: 9 tokens" in err and "tokens/s" in err


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


def test_bad_arguments_exit_2(saved, capsys):
    _, path = saved
    assert main(["generate", str(path)]) == 2
    assert "--prompt-ids" in capsys.readouterr().err
    assert main(["generate", str(path), "--prompt-ids", "1,x"]) == 2
    assert "expected integers" in capsys.readouterr().err
    assert main(["generate", str(path), "--prompt-ids", "1", "--image", "a.png"]) == 2
    assert "--image-token-id" in capsys.readouterr().err
