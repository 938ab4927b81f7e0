"""Qwen3-VL-Reranker's (query, document) prompts and images, for the yes/no reranker on engine/families/qwen3_vl.py.

The checkpoint's own additional_chat_templates/reranker.jinja (else templates/qwen3_vl_reranker.jinja) renders a
pair from messages, in transformers' chat-template environment with add_generation_prompt: a "system" message
holding the instruction when one is given (the template has its own default), a "query" and a "document"
message whose contents are text and image items. The template writes one <|image_pad|> per image between the
vision markers; it grows to the image's token count (one per merged 2 x 2 block of patches), as the processor
does before tokenizing. The score is read at the prompt's last position (the assistant header).

The query and each document are prepared once per request (`side`: images through the Qwen2-VL processor with
the checkpoint's pixel bounds), then placed in one prompt per document (`pair`). An over-long pair is cut
only when asked: its query and document texts lose tokens longest-first (from the end of each), the scaffold
and every image token are kept.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jinja2 import TemplateError

from engine.text.chat_inputs import compile_template, template_variables
from engine.checkpoint import Checkpoint
from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.multimodal.qwen_images import QwenImageProcessor
from engine.text.prompts import CHECKPOINT_TEMPLATE, templates_dir
from engine.text.tokenizer import TextTokenizer
from engine.multimodal.builders.qwen3_vl import IMAGE_PAD, content_items, expand_image_pads, image_processor
from engine.multimodal.inputs import PreparedImage, PreparedInput
from engine.multimodal.pairs import PairBuilder, RerankSide

if TYPE_CHECKING:
    from PIL.Image import Image

FALLBACK_TEMPLATE = "qwen3_vl_reranker.jinja"
_MARK = "\ue000{}\ue001"  # stands for one text item while a pair is split for truncation


class Qwen3VLRerankInputs(PairBuilder):
    def __init__(self, checkpoint: Checkpoint, tokenizer: TextTokenizer, processor: QwenImageProcessor,
                 image_token_id: int):
        own = checkpoint.path / CHECKPOINT_TEMPLATE
        self.source = own if own.is_file() else templates_dir() / FALLBACK_TEMPLATE
        self.template = compile_template(checkpoint, self.source.read_text(encoding="utf-8"))
        self.variables = {**template_variables(checkpoint), "add_generation_prompt": True}
        self.tokenizer = tokenizer
        self.processor = processor
        self.image_token_id = image_token_id

    def side(self, parts: Sequence[str | Image]) -> RerankSide:
        """Text pieces and decoded images, in order -> content items and processed images."""
        if any(isinstance(part, str) and IMAGE_PAD in part for part in parts):  # refused here, naming its side
            raise InvalidInput(f"the text holds {IMAGE_PAD}, which only an image may stand for")
        content, images = content_items(self.processor, parts)
        return RerankSide(tuple(content), tuple(images))

    def render(self, query: Sequence[dict], document: Sequence[dict], instruction: str | None) -> str:
        messages = [{"role": "system", "content": [{"type": "text", "text": instruction}]}] if instruction else []
        messages += [{"role": "query", "content": list(query)}, {"role": "document", "content": list(document)}]
        try:
            return self.template.render(messages=messages, **self.variables)
        except TemplateError as exc:
            raise InvalidInput(f"the model's reranker template refused the input: {exc}") from exc

    def pair(self, query: RerankSide, document: RerankSide, instruction: str | None,
             limit: int | None = None) -> PreparedInput:
        """One prompt's ids (images expanded) and its images (the query's, then the document's). Over `limit`
        tokens, the texts are cut to fit (None: returned whole, for the caller to refuse)."""
        images = query.images + document.images
        ids = self.tokenizer.encode(self.render(query.content, document.content, instruction), add_special=False)
        ids = expand_image_pads(ids, images, self.image_token_id)
        if limit is None or len(ids) <= limit:
            return PreparedInput(ids, images)
        return PreparedInput(self._cut(query, document, instruction, images, limit), images)

    def _cut(self, query: RerankSide, document: RerankSide, instruction: str | None,
             images: tuple[PreparedImage, ...], limit: int) -> list[int]:
        """The pair's tokens with its texts cut longest-first to `limit` (scaffold and images whole). Pieces are
        tokenized apart, as the text reranker's truncation does."""
        texts: list[tuple[str, str]] = []  # (side, text) of every text item, in prompt order

        def marked(side_name: str, side: RerankSide) -> list[dict]:
            items = []
            for item in side.content:
                if item["type"] == "text":
                    items.append({"type": "text", "text": _MARK.format(len(texts))})
                    texts.append((side_name, item["text"]))
                else:
                    items.append(item)
            return items

        rendered = self.render(marked("query", query), marked("document", document), instruction)
        pieces: list[tuple[str | None, list[int]]] = []  # (side or None for scaffold, ids)
        for k, (side_name, text) in enumerate(texts):
            before, rendered = rendered.split(_MARK.format(k), 1)
            pieces += [(None, self.tokenizer.encode(before, add_special=False)),
                       (side_name, self.tokenizer.encode(text, add_special=False))]
        pieces.append((None, self.tokenizer.encode(rendered, add_special=False)))
        # each image's placeholder (one scaffold token) grows to its run
        scaffold = sum(len(ids) for side, ids in pieces if side is None) + sum(i.n_tokens - 1 for i in images)
        keep = {name: sum(len(ids) for side, ids in pieces if side == name) for name in ("query", "document")}
        budget = limit - scaffold
        if budget < 2:
            raise InvalidInput(f"the pair's template and images alone take {scaffold} tokens, over the "
                               f"{limit} allowed: nothing to cut")
        while keep["query"] + keep["document"] > budget:  # longest first, as transformers' truncation does
            keep["document" if keep["document"] >= keep["query"] else "query"] -= 1
        out: list[int] = []
        for side, ids in pieces:
            if side is not None:
                ids, keep[side] = ids[:keep[side]], max(0, keep[side] - len(ids))
            out += ids
        return expand_image_pads(out, images, self.image_token_id)


def input_builder(checkpoint: Checkpoint, tokenizer: TextTokenizer) -> Qwen3VLRerankInputs:
    builder = Qwen3VLRerankInputs(checkpoint, tokenizer, *image_processor(checkpoint, tokenizer))
    probe = builder.render([{"type": "text", "text": "\ue000q"}, {"type": "image"}],
                           [{"type": "text", "text": "\ue000d"}], None)
    if probe.count(IMAGE_PAD) != 1 or probe.count("\ue000q") != 1 or probe.count("\ue000d") != 1:
        raise UnsupportedCheckpoint(f"{builder.source}: the reranker template must place the query and the "
                                    f"document once each, and one {IMAGE_PAD} per image item")
    return builder
