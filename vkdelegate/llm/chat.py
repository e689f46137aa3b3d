"""Chat prompts: a checkpoint's chat template applied to a conversation, as
transformers' ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
does, without transformers or torch (``vkdelegate generate --chat``).

Where the template comes from (a checkpoint folder, the one holding tokenizer.json):
``chat_template.jinja`` (what transformers >= 4.43 writes), else the
``chat_template`` of ``tokenizer_config.json`` (a string, or a list of named templates,
of which "default" is taken, as transformers does), else that of
``chat_template.json``. The template is Jinja run in jinja2's immutable sandbox with
the environment transformers gives it (trim_blocks, lstrip_blocks, loop controls,
``raise_exception``, ``strftime_now``, a ``tojson`` that does not escape HTML, the
``{% generation %}`` block rendered as its body), fed ``messages``,
``add_generation_prompt`` and the special tokens of tokenizer_config.json
(``bos_token``, ``eos_token``, ...). The rendered text already holds the special
tokens the template writes (Llama 3's ``<|begin_of_text|>``), so it is encoded without
adding any (``add_special_tokens=False``, as transformers does).
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

from vkdelegate.errors import VkDelegateError

#: The largest template file or tokenizer_config.json read (bytes): a checkpoint's
#: files are untrusted; real templates are a few KiB.
MAX_TEMPLATE_BYTES = 1 << 20
#: tokenizer_config.json's special-token entries a template may read.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                  "cls_token", "mask_token")


def _read(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise VkDelegateError(f"{path}: larger than {MAX_TEMPLATE_BYTES} bytes")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VkDelegateError(f"{path}: cannot read it ({exc})") from exc


def _json(path: Path) -> dict:
    try:
        data = json.loads(_read(path))
    except json.JSONDecodeError as exc:
        raise VkDelegateError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise VkDelegateError(f"{path}: not a JSON object")
    return data


def _pick(template, where: Path) -> str:
    """A template string from a config's ``chat_template``: a string, or a list of
    {"name", "template"} of which "default" is taken."""
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise VkDelegateError(f"{where}: chat_template lists {sorted(map(str, named))}, "
                                  f"no 'default'")
        template = named["default"]
    if not isinstance(template, str):
        raise VkDelegateError(f"{where}: chat_template is not a string")
    return template


def _special(value) -> "str | None":
    if isinstance(value, dict):  # an AddedToken written as {"content": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_template(folder) -> tuple:
    """(template text, special tokens {name: text}) of the checkpoint ``folder`` (or
    the folder of a tokenizer.json given instead; see the module docstring). Raises
    VkDelegateError naming the folder when it has no chat template, or a file that
    cannot be read (over MAX_TEMPLATE_BYTES, not UTF-8, not JSON)."""
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    config_path = folder / "tokenizer_config.json"
    config = _json(config_path) if config_path.is_file() else {}
    specials = {name: text for name in SPECIAL_TOKENS
                if (text := _special(config.get(name))) is not None}
    jinja_path = folder / "chat_template.jinja"
    if jinja_path.is_file():
        return _read(jinja_path), specials
    if "chat_template" in config:
        return _pick(config["chat_template"], config_path), specials
    other = folder / "chat_template.json"
    if other.is_file():
        data = _json(other)
        if "chat_template" in data:
            return _pick(data["chat_template"], other), specials
    raise VkDelegateError(f"{folder}: no chat template (looked for chat_template.jinja, "
                          f"tokenizer_config.json's chat_template, chat_template.json)")


def _environment():
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise VkDelegateError("chat templates need jinja2 (pip install 'jinja2>=3.1.6', "
                              "or the examples extra)") from None
    if tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit()) < (3, 1, 6):
        raise VkDelegateError(f"chat templates need jinja2 >= 3.1.6 (earlier ones have "
                              f"sandbox escapes); this is {jinja2.__version__}")

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: its body (transformers marks the
        assistant's tokens with it; nothing to mark here)."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body) \
                .set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env, jinja2


def render(template: str, messages: list, specials: "dict | None" = None, *,
           add_generation_prompt: bool = True, where: str = "chat template") -> str:
    """The text of ``messages`` (a list of {"role": ..., "content": ...}) under the
    Jinja ``template``, with ``specials`` (bos_token, ...) and
    ``add_generation_prompt`` (the assistant's header after the last message, so that
    the model answers). Raises VkDelegateError naming ``where`` for a template that
    does not parse or that fails (its own ``raise_exception``, an undefined call)."""
    env, jinja2 = _environment()
    try:
        return env.from_string(template).render(
            messages=messages, tools=None, documents=None,
            add_generation_prompt=add_generation_prompt, **(specials or {}))
    except jinja2.exceptions.TemplateError as exc:
        raise VkDelegateError(f"{where}: {type(exc).__name__}: {exc}") from exc


def chat_prompt(folder, user: str, *, system: "str | None" = None) -> str:
    """The prompt text of one user turn (after an optional system message) under the
    chat template of checkpoint ``folder`` (``load_template``), ending with the
    assistant's header. Raises VkDelegateError as ``load_template`` and ``render``."""
    template, specials = load_template(folder)
    messages = ([{"role": "system", "content": system}] if system is not None else []) \
        + [{"role": "user", "content": user}]
    return render(template, messages, specials, where=f"chat template of {folder}")
