"""Chat templates (vkdelegate/llm/chat.py, ``vkdelegate generate --chat``): the text and
ids transformers' ``AutoTokenizer.apply_chat_template(..., add_generation_prompt=True)``
gives for the same checkpoint folder, from chat_template.jinja or tokenizer_config.json
(a string or named templates), and the greedy tokens of HF on those ids through the
CLI; folders without a template, oversized or broken files and sandbox escapes give
one-line errors."""
import json

import pytest

from tests.llm.models import VOCAB, hf_greedy
from vkdelegate import VkDelegateError
from vkdelegate.cli import main
from vkdelegate.llm import chat

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|im_start|>", "<|im_end|>"]

# Llama 3's structure: BOS, a header per message, content trimmed, a default system
# message through a namespace, a role check, the assistant header to answer.
LLAMA3 = (
    "{{- bos_token }}\n"
    "{%- set ns = namespace(system='You are helpful.') %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set ns.system = messages[0]['content'] | trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- endif %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + ns.system + '<|eot_id|>' }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] not in ['user', 'assistant'] %}\n"
    "        {{- raise_exception('roles are user and assistant') }}\n"
    "    {%- endif %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "    {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")
# ChatML (Qwen2): no BOS, a loop with loop.first, tojson of a dict.
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nmeta ' + {'k': 'v<>'} | tojson + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _folder(tmp_path, template, *, as_file=False, named=False, name="ckpt"):
    """A checkpoint folder: tokenizer.json (words w0.. and the special tokens, all ids
    below VOCAB) and tokenizer_config.json, the template in it or in
    chat_template.jinja."""
    folder = tmp_path / name
    folder.mkdir()
    vocab = {f"w{i}": i for i in range(VOCAB - len(SPECIAL))}
    vocab.update({t: VOCAB - len(SPECIAL) + i for i, t in enumerate(SPECIAL)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.add_special_tokens(SPECIAL)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0],
              "eos_token": {"__type": "AddedToken", "content": "<|eot_id|>", "lstrip": False,
                            "normalized": False, "rstrip": False, "single_word": False,
                            "special": True}}
    if as_file:
        (folder / "chat_template.jinja").write_text(template)
        config["chat_template"] = "{{ 'the jinja file wins' }}"
    elif named:
        config["chat_template"] = [{"name": "tool_use", "template": "x"},
                                   {"name": "default", "template": template}]
    else:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder, tok


def _hf(folder, messages):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder))
    text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5: a BatchEncoding
        ids = ids["input_ids"]
    return text, list(ids)


@pytest.mark.parametrize("template,kw", [(LLAMA3, {}), (LLAMA3, {"as_file": True}),
                                         (CHATML, {}), (CHATML, {"named": True})],
                         ids=["llama3", "llama3_jinja_file", "chatml", "chatml_named"])
@pytest.mark.parametrize("system", [None, "  Be brief. "])
def test_prompt_equals_transformers(tmp_path, template, kw, system):
    pytest.importorskip("transformers")
    folder, tok = _folder(tmp_path, template, **kw)
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": " w5 w6 w7 "}]
    text, ids = _hf(folder, messages)
    ours = chat.chat_prompt(folder / "tokenizer.json", " w5 w6 w7 ", system=system)
    assert ours == text
    assert tok.encode(ours, add_special_tokens=False).ids == ids


def test_template_errors_are_one_line(tmp_path):
    folder, _ = _folder(tmp_path, LLAMA3)
    with pytest.raises(VkDelegateError, match="roles are user and assistant"):
        chat.render(LLAMA3, [{"role": "tool", "content": "x"}], {"bos_token": "b"})
    with pytest.raises(VkDelegateError, match="TemplateSyntaxError"):
        chat.render("{% for %}", [])
    # The sandbox: no attribute walk out of the template's data.
    with pytest.raises(VkDelegateError, match="SecurityError|UndefinedError"):
        chat.render("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(VkDelegateError, match="no chat template"):
        chat.load_template(empty)
    (empty / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(VkDelegateError, match="not JSON"):
        chat.load_template(empty)
    (empty / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "x"}]}))
    with pytest.raises(VkDelegateError, match="no 'default'"):
        chat.load_template(empty)
    (empty / "chat_template.jinja").write_bytes(b"x" * (chat.MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(VkDelegateError, match="larger than"):
        chat.load_template(empty)


def test_cli_chat_gives_hf_greedy_tokens_of_the_templated_prompt(saved, tmp_path, capsys):
    pytest.importorskip("transformers")
    model, path = saved
    folder, tok = _folder(tmp_path, LLAMA3)
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w9 w8"}]
    _, ids = _hf(folder, messages)
    expected = hf_greedy(model, ids, 8)
    status = main(["generate", str(path), "--chat", "--system", "w1 w2", "--prompt", "w9 w8",
                   "--tokenizer", str(folder), "--max-new-tokens", "8"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.strip() == tok.decode(expected)
    assert f"prefill: {len(ids)} tokens" in err


@pytest.mark.parametrize("args,message", [
    (["--prompt-ids", "1,2", "--chat"], "--chat and --system take --prompt TEXT"),
    (["--prompt", "w1", "--tokenizer", "T", "--system", "s"], "--system needs --chat"),
])
def test_cli_chat_argument_errors(saved, capsys, args, message):
    _, path = saved
    assert main(["generate", str(path)] + args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_cli_chat_without_a_template(saved, tmp_path, capsys):
    _, path = saved
    folder, _ = _folder(tmp_path, LLAMA3)
    (folder / "tokenizer_config.json").write_text("{}")
    assert main(["generate", str(path), "--chat", "--prompt", "w1",
                 "--tokenizer", str(folder / "tokenizer.json")]) == 2
    assert "no chat template" in capsys.readouterr().err


def _reference_chat(model, folder, tok, lines, n, system=None):
    """The replies `vkdelegate chat` should print: per message, HF greedy on the
    whole conversation as transformers' apply_chat_template encodes it, the reply
    (decoded) joining the conversation."""
    messages = [{"role": "system", "content": system}] if system else []
    replies = []
    for line in lines:
        messages.append({"role": "user", "content": line})
        _, ids = _hf(folder, messages)
        text = tok.decode(hf_greedy(model, ids, n))
        replies.append(text)
        messages.append({"role": "assistant", "content": text})
    return replies


def test_cli_chat_turns(saved, tmp_path, capsys, monkeypatch):
    import io

    pytest.importorskip("transformers")
    model, path = saved
    folder, tok = _folder(tmp_path, LLAMA3)
    lines = ["w9 w8", "", "w3 w4 w5", "/reset", "w9 w8", "/exit", "w1"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["chat", str(path), "--tokenizer", str(folder), "--system", "w1 w2",
                 "--max-new-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    first = _reference_chat(model, folder, tok, ["w9 w8", "w3 w4 w5"], 6, system="w1 w2")
    assert out.splitlines() == first + first[:1]  # /reset: the first reply again
    stats = [line for line in err.splitlines() if line.startswith("[")]
    assert len(stats) == 3 and " 0 reused" in stats[0] and " 0 reused" not in stats[1]
    assert "(a new conversation)" in err


def test_cli_chat_past_the_cache_goes_on(saved, tmp_path, capsys, monkeypatch):
    import io

    model, path = saved
    folder, tok = _folder(tmp_path, LLAMA3)
    long = " ".join(f"w{i % 50}" for i in range(100))  # past max_seq_len 80
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{long}\nw9 w8\n"))
    assert main(["chat", str(path), "--tokenizer", str(folder), "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert "does not fit the KV cache (80 positions" in err and "/reset" in err
    assert out.splitlines() == _reference_chat(model, folder, tok, ["w9 w8"], 4)


def test_cli_chat_caps_a_reply_at_the_room_left(saved, tmp_path, capsys, monkeypatch):
    import io

    pytest.importorskip("transformers")
    model, path = saved
    folder, tok = _folder(tmp_path, LLAMA3)
    # 60 words: the templated prompt leaves a few positions of the 80.
    line = " ".join(f"w{i % 50}" for i in range(60))
    _, ids = _hf(folder, [{"role": "user", "content": line}])
    room = 80 - len(ids) + 1
    assert 1 <= room < 20
    monkeypatch.setattr("sys.stdin", io.StringIO(line + "\n"))
    assert main(["chat", str(path), "--tokenizer", str(folder), "--max-new-tokens", "256"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == tok.decode(hf_greedy(model, ids, room))
    assert "cache 80 of 80" in err
    # Without --max-new-tokens: half the room, so that the chat can go on.
    monkeypatch.setattr("sys.stdin", io.StringIO(line + "\n"))
    assert main(["chat", str(path), "--tokenizer", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == tok.decode(hf_greedy(model, ids, max(1, room // 2)))


def test_cli_chat_a_refused_message_is_dropped(saved, tmp_path, capsys, monkeypatch):
    import io

    _, path = saved
    refusing = LLAMA3.replace("not in ['user', 'assistant']",
                              "not in ['user', 'assistant'] or message['content'] == 'w3'")
    folder, _ = _folder(tmp_path, refusing)
    monkeypatch.setattr("sys.stdin", io.StringIO("w3\nw9 w8\n"))
    assert main(["chat", str(path), "--tokenizer", str(folder), "--max-new-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert "roles are user and assistant; the message was dropped" in err
    assert len(out.splitlines()) == 1  # the second message's reply
