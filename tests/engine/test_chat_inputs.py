"""engine/text/chat_inputs.py: texts rendered through a checkpoint's chat template, compared with transformers'
apply_chat_template on the same template and messages (the end-to-end match with sentence-transformers is in
tests/server/test_prompts_dimensions.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import checkpoint
from engine.loading import formats
from engine.text.chat_inputs import ChatInputs
from engine.errors import UnsupportedCheckpoint
from tests.conftest import minilm_dir

FLAT = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}")
STRUCTURED = ("{% for m in messages %}{{ m['role'] }}:{% for part in m['content'] %}{% if part.type == 'text' %}"
              "{{ part.text | tojson }}{% endif %}{% endfor %}\n{% endfor %}")


def folder(root: Path, *, template: str | list, message: dict, chat_kwargs: dict | None = None) -> checkpoint.Checkpoint:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    tokenizer_config = {"chat_template": template, "bos_token": "<s>", "eos_token": {"content": "</s>"}}
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    sbert = {"modality_config": {"text": {}, "message": message}}
    if chat_kwargs:
        sbert["processing_kwargs"] = {"chat_template": chat_kwargs}
    (root / "sentence_bert_config.json").write_text(json.dumps(sbert))
    return formats.open_checkpoint(root)


def transformers_render(template: str, messages: list, **kwargs) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    tok.chat_template = template
    return tok.apply_chat_template(messages, tokenize=False, bos_token="<s>", eos_token="</s>", **kwargs)


def test_flat_messages_with_a_system_prompt_and_render_options(tmp_path):
    ckpt = folder(tmp_path, template=FLAT, message={"format": "flat"}, chat_kwargs={"add_generation_prompt": True,
                                                                                  "restore_suffix": False})
    chat = ChatInputs(ckpt)
    messages = [{"role": "system", "content": "query: "}, {"role": "user", "content": "Hello \"world\""}]
    assert chat.render('Hello "world"', "query: ") == transformers_render(FLAT, messages, add_generation_prompt=True)
    assert chat.render("x") == "<s><user>x</user><assistant></s>"


def test_structured_messages_are_inferred_from_the_template(tmp_path):
    ckpt = folder(tmp_path, template=[{"name": "default", "template": STRUCTURED}], message={"format": "auto"})
    chat = ChatInputs(ckpt)
    assert chat.structured
    messages = [{"role": "system", "content": [{"type": "text", "text": "p"}]},
                {"role": "user", "content": [{"type": "text", "text": "Zürich"}]}]
    # trim_blocks eats the newline after each block tag, in both renderers
    assert chat.render("Zürich", "p") == transformers_render(STRUCTURED, messages) == 'system:"p"user:"Zürich"'


def test_a_message_modality_without_a_chat_template_is_refused(tmp_path):
    ckpt = folder(tmp_path, template="", message={"format": "flat"})
    with pytest.raises(UnsupportedCheckpoint, match="has no chat template"):
        ChatInputs(ckpt)
