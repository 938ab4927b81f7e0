"""sentence-transformers' "message" modality for text embedders: a checkpoint whose sentence_bert_config.json
lists it has every text sent as a chat (a user message, after a system message holding the prompt when one
applies) rendered with the tokenizer's chat template, then tokenized without special tokens: what
sentence-transformers >= 6 does through transformers' apply_chat_template."""
from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from engine.checkpoint import Checkpoint, special_token_text
from engine.errors import InvalidInput, UnsupportedCheckpoint

if TYPE_CHECKING:  # jinja2 is imported where a template is compiled: a server without one never loads it
    from jinja2 import Template

# What sentence-transformers looks for in a template to decide that message content is a list of typed parts.
_STRUCTURED_HINTS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
# processing_kwargs["chat_template"] entries that size the tokenization instead of reaching the template.
_NOT_RENDER_KWARGS = {"restore_suffix", "padding", "truncation", "max_length", "return_tensors"}
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def chat_template(checkpoint: Checkpoint) -> str | None:
    """The tokenizer's chat template: chat_template.jinja, else tokenizer_config.json's (its "default" one when
    it holds several)."""
    path = checkpoint.path / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = checkpoint.tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def _raise_exception(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_template(checkpoint: Checkpoint, source: str) -> Template:
    """A chat template in transformers' rendering environment: trim_blocks, lstrip_blocks, loop controls,
    its tojson, raise_exception and strftime_now."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise UnsupportedCheckpoint(f"{checkpoint.path}: invalid chat template: {exc}") from exc


def template_variables(checkpoint: Checkpoint) -> dict[str, Any]:
    """The special tokens a template may name (bos_token, eos_token, ...), as transformers passes them."""
    specials = {**checkpoint.tokenizer_config, **checkpoint.special_tokens}
    return {key: text for key in _SPECIAL_TOKEN_KEYS if (text := special_token_text(specials.get(key))) is not None}


class ChatInputs:
    """Renders one text (and its prompt) as the checkpoint's chat template would."""

    def __init__(self, checkpoint: Checkpoint):
        source = chat_template(checkpoint)
        if source is None:
            raise UnsupportedCheckpoint(f"{checkpoint.path}: sentence_bert_config.json sends texts as chat messages "
                                        "(modality 'message') but the tokenizer has no chat template")
        self._template = compile_template(checkpoint, source)
        fmt = (checkpoint.message_modality or {}).get("format", "auto")
        if fmt == "auto":
            fmt = "structured" if any(hint in source for hint in _STRUCTURED_HINTS) else "flat"
        if fmt not in ("flat", "structured"):
            raise UnsupportedCheckpoint(f"{checkpoint.path}: message format {fmt!r} is not supported "
                                        "(flat, structured)")
        self.structured = fmt == "structured"
        self._variables = template_variables(checkpoint)
        self._variables["add_generation_prompt"] = False
        self._variables.update({k: v for k, v in checkpoint.chat_template_kwargs.items()
                                if k not in _NOT_RENDER_KWARGS})

    def _message(self, role: str, text: str) -> dict[str, Any]:
        return {"role": role, "content": [{"type": "text", "text": text}] if self.structured else text}

    def render(self, text: str, system: str | None = None) -> str:
        """The chat text of one input: [system prompt,] user text."""
        from jinja2 import TemplateError

        messages = ([self._message("system", system)] if system else []) + [self._message("user", text)]
        try:
            return self._template.render(messages=messages, **self._variables)
        except TemplateError as exc:
            raise InvalidInput(f"the model's chat template refused the input: {exc}") from exc
