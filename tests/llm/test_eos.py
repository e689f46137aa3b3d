"""End-of-sequence ids: ``lower`` records the model's ``generation_config.eos_token_id``
in the program (saved with it), and ``generate`` / ``vkdelegate generate`` stop there
by default as HF ``generate`` does; ``eos_token_id=[]`` / ``--ignore-eos`` run every
step; a crafted record is refused at load."""
import pytest
import torch

from tests.llm.conftest import MAX_SEQ_LEN
from tests.llm.models import VOCAB, hf_greedy, make_model
from tests.vulkan_skip import vulkan_unavailable
from vkdelegate import VkDelegateError
from vkdelegate.backend import llm_checks
from vkdelegate.cli import main
from vkdelegate.llm import eos_token_ids, generate

PROMPT = [5, 17, 33, 2, 9]


@pytest.fixture(scope="module")
def with_eos(tmp_path_factory):
    """(HF model whose generation config has two end-of-sequence ids, one of them the
    6th token its greedy run makes, the program lowered from it, its saved file)."""
    reason = vulkan_unavailable()
    if reason:
        pytest.skip(reason)
    from vkdelegate.llm import lower

    model = make_model("llama", seed=4)
    run = hf_greedy(model, PROMPT, 24)
    first = run[5]
    other = next(i for i in range(VOCAB) if i not in run)  # never made
    model.generation_config.eos_token_id = [other, first]
    program = lower(model, MAX_SEQ_LEN)
    path = tmp_path_factory.mktemp("eos") / "llama.vkp"
    program.save(path)
    return model, program, path, run, sorted([other, first])


def _hf(model, n: int) -> list:
    """HF generate's new tokens, stopping at the generation config's ids."""
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False)
    return out[0, len(PROMPT):].tolist()


def test_generate_stops_at_the_models_eos_as_hf_does(with_eos):
    model, program, _, run, eos = with_eos
    assert eos_token_ids(program) == eos
    expected = _hf(model, 24)
    stop = run.index(run[5])  # the first time the eos id comes
    assert expected == run[:stop + 1]
    assert generate(program, PROMPT, 24) == expected
    assert generate(program, PROMPT, 24, decode_chunk=1) == expected
    assert generate(program, PROMPT, 24, eos_token_id=[]) == run  # never stop early
    assert generate(program, PROMPT, 24, eos_token_id=run[2]) == run[:run.index(run[2]) + 1]


def test_the_ids_are_saved_with_the_program(with_eos):
    import vkdelegate

    _, _, path, run, eos = with_eos
    loaded = vkdelegate.load(path)
    try:
        assert eos_token_ids(loaded) == eos
        assert generate(loaded, PROMPT, 24) == run[:run.index(run[5]) + 1]
    finally:
        loaded.close()


def test_cli_stops_at_the_models_eos(with_eos, capsys):
    _, _, path, run, _ = with_eos
    prompt = ",".join(map(str, PROMPT))
    stop = run.index(run[5]) + 1
    assert main(["generate", str(path), "--prompt-ids", prompt, "--max-new-tokens", "24"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in run[:stop]]
    assert main(["generate", str(path), "--prompt-ids", prompt, "--max-new-tokens", "24",
                 "--ignore-eos"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in run]
    assert main(["generate", str(path), "--prompt-ids", prompt, "--max-new-tokens", "24",
                 "--eos-token-id", str(run[1]), "--eos-token-id", str(run[3])]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in run[:run.index(run[1]) + 1]]
    assert main(["generate", str(path), "--prompt-ids", prompt, "--ignore-eos",
                 "--eos-token-id", "3"]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_model_without_eos_records_none(lowered):
    _, program = lowered("llama")  # tests/llm/models.py: eos_token_id None
    assert eos_token_ids(program) == []
    assert "eos_token_ids" not in program.methods["decode"].plan[llm_checks.PLAN_KEY]


@pytest.mark.parametrize("record,message", [
    ({"vocab_size": 10, "eos_token_ids": 3}, "must be a list of at most 64 ints"),
    ({"vocab_size": 10, "eos_token_ids": [1, "2"]}, "must be a list of at most 64 ints"),
    ({"vocab_size": 10, "eos_token_ids": [True]}, "must be a list of at most 64 ints"),
    ({"vocab_size": 10, "eos_token_ids": list(range(65))}, "at most 64"),
    ({"vocab_size": 10, "eos_token_ids": [10]}, "token id 10 at plan.llm.eos_token_ids[0]"
                                                " >= vocab size 10"),
    ({"vocab_size": 10, "eos_token_ids": [-1]}, "is negative"),
])
def test_crafted_records_are_refused(record, message):
    with pytest.raises(VkDelegateError, match=None) as info:
        llm_checks.eos_token_ids({llm_checks.PLAN_KEY: record})
    assert message in str(info.value)
    assert llm_checks.eos_token_ids({llm_checks.PLAN_KEY: {"vocab_size": 10}}) == []
    assert llm_checks.eos_token_ids({}) == []


def test_a_crafted_record_in_a_file_fails_at_load(with_eos, tmp_path):
    import json

    import vkdelegate
    from vkdelegate.serialization import program_file

    _, _, path, _, _ = with_eos
    manifest, segments = program_file.read_program(path)
    manifest["methods"]["decode"]["plan"]["llm"]["eos_token_ids"] = [VOCAB + 5]
    bad = tmp_path / "bad.vkp"
    program_file.write_program(bad, json.loads(json.dumps(manifest)), segments)
    with pytest.raises(VkDelegateError, match=r"eos_token_ids\[0\] >= vocab size"):
        vkdelegate.load(bad)


def test_inspect_shows_the_ids(with_eos, capsys):
    _, _, path, _, eos = with_eos
    assert main(["inspect", str(path)]) == 0
    assert f"eos_token_ids {eos}" in capsys.readouterr().out
    import json

    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["llm"]["eos_token_ids"] == eos
