"""Qwen3-VL-Reranker through the engine against the reference recipe on a tiny random checkpoint: the pair's
prompt as the model card lays it out (written here in Python, independently of the checkpoint's reranker.jinja
the engine renders), images through transformers' Qwen2VLImageProcessorPil with their <|image_pad|> expanded to
the processor's token count, transformers' Qwen3VLModel, and sigmoid(h . (W_true - W_false)) at the last
position with the 1_LogitScore module's token ids."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from engine.loading import registry
from engine.loading.formats import open_checkpoint as read
from engine.errors import InputTooLong, InvalidInput
from engine.multimodal.images import InvalidImage
from engine.types import ImageInput
from tests.engine.families.qwen3_vl_fixture import PREPROCESSOR, make_checkpoint, reference_hidden
from tests.engine.helpers import start_engine

TOLERANCE = 1e-4
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
SYSTEM = ("Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
          'Note that the answer can only be "yes" or "no".')
DEFAULT_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."
TRUE_ID, FALSE_ID = 123, 45  # 1_LogitScore's ids: not what "yes" / "no" tokenize to here

# The checkpoint's own template, as Qwen3-VL-Reranker ships one (roles system / query / document, string or typed
# contents); written apart from templates/qwen3_vl_reranker.jinja, the engine's fallback.
RERANKER_JINJA = """{%- set ns = namespace(task="Given a search query, retrieve relevant candidates that answer the query.") -%}
{%- macro flat(content) -%}{%- if content is string -%}{{ content }}{%- else -%}{%- for c in content -%}
{%- if c.type == 'image' or 'image' in c -%}<|vision_start|><|image_pad|><|vision_end|>
{%- elif 'text' in c -%}{{ c.text }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}
{%- for m in messages if m.role == 'system' -%}{%- set ns.task = flat(m.content) -%}{%- endfor -%}
<|im_start|>system
Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>
<|im_start|>user
<Instruct>: {{ ns.task }}<Query>:{%- for m in messages if m.role == 'query' -%}{{ flat(m.content) }}{%- endfor %}

<Document>:{%- for m in messages if m.role == 'document' -%}{{ flat(m.content) }}{%- endfor -%}<|im_end|>
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
           {"idx": 1, "name": "1", "path": "1_LogitScore",
            "type": "sentence_transformers.cross_encoder.modules.logit_score.LogitScore"}]


def png(width: int, height: int, seed: int, mode: str = "RGB") -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGBA").convert(mode).save(out, format="PNG")
    return out.getvalue()


IMAGES = [png(50, 70, 1), png(200, 90, 2, "RGBA"), png(330, 260, 3)]  # 4, 18 and 40 image tokens


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder, model = make_checkpoint(tmp_path_factory.mktemp("qwen3-vl-reranker") / "model")
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "reranker.jinja").write_text(RERANKER_JINJA, encoding="utf-8")
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    (folder / "modules.json").write_text(json.dumps(MODULES), encoding="utf-8")
    (folder / "1_LogitScore").mkdir()
    (folder / "1_LogitScore" / "config.json").write_text(
        json.dumps({"true_token_id": TRUE_ID, "false_token_id": FALSE_ID}), encoding="utf-8")
    return folder, model


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = start_engine(checkpoint[0], pooling=registry.Pooling.RANK)
    yield eng
    eng.close()


def flat(parts) -> tuple[str, list[bytes]]:
    """An item's parts -> its prompt text (images as vision markers) and its images."""
    return "".join(IMAGE if isinstance(p, bytes) else p for p in parts), [p for p in parts if isinstance(p, bytes)]


@pytest.fixture(scope="module")
def reference(checkpoint):
    """(query parts, document parts, instruction) -> (P(true), the prompt's token count), the reference way."""
    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    folder, model = checkpoint
    tok = AutoTokenizer.from_pretrained(str(folder))
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    head = model.lm_head.weight.detach().double().numpy()
    direction = head[TRUE_ID] - head[FALSE_ID]

    def score(query, document, instruction: str = DEFAULT_INSTRUCTION, size: dict | None = None) -> tuple[float, int]:
        """size: pixel bounds ({"shortest_edge": min_pixels, "longest_edge": max_pixels}) for this call."""
        (query_text, query_images), (doc_text, doc_images) = flat(query), flat(document)
        text = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}"
                f"<Query>:{query_text}\n<Document>:{doc_text}<|im_end|>\n<|im_start|>assistant\n")
        images = [Image.open(io.BytesIO(data)) for data in query_images + doc_images]
        patches, grids = None, []
        if images:
            out = processor(images, return_tensors="np", **({"size": size} if size else {}))
            patches, grids = out["pixel_values"], [tuple(int(v) for v in g) for g in out["image_grid_thw"]]
            pieces = text.split("<|image_pad|>")
            text = pieces[0] + "".join("<|image_pad|>" * (t * h * w // 4) + piece
                                       for (t, h, w), piece in zip(grids, pieces[1:], strict=True))
        ids = tok(text, add_special_tokens=False).input_ids
        last = reference_hidden(model, ids, patches, grids)[-1]
        return float(1 / (1 + np.exp(-(last @ direction)))), len(ids)

    return score


def item(parts):
    return ImageInput(tuple(parts)) if any(isinstance(p, bytes) for p in parts) else "".join(parts)


DOCUMENTS = [["A chart of quarterly revenue"], [IMAGES[0]], [IMAGES[1], "revenue by quarter"],
             ["Gravity is a force.", IMAGES[2], " (a photo)"], ["yes no maybe"], [IMAGES[0], " vs ", IMAGES[1]]]


@pytest.mark.parametrize("query", [["a chart of quarterly revenue"], [IMAGES[1]], ["show: ", IMAGES[0], " please"]],
                         ids=["text", "image", "image-and-text"])
def test_mixed_documents_and_queries_match_the_reference(engine, reference, query):
    result = engine.rerank(item(query), [item(d) for d in DOCUMENTS])
    for document, got, n_tokens in zip(DOCUMENTS, result.scores, result.n_tokens, strict=True):
        expected, n_ids = reference(query, document)
        assert abs(got - expected) <= TOLERANCE, (document, got, expected)
        assert n_tokens == n_ids  # usage counts every expanded image token
    assert engine.info.modalities == ("text", "image") and engine.info.kind == "generative-reranker"


def test_the_instruction_reaches_the_template(engine, reference):
    query, document = ["revenue"], [IMAGES[0], "a chart"]
    got = engine.rerank(item(query), [item(document)], instruction="Find charts.").scores[0]
    assert abs(got - reference(query, document, "Find charts.")[0]) <= TOLERANCE
    assert abs(got - reference(query, document)[0]) > TOLERANCE  # the instruction changed the score


def test_a_score_does_not_depend_on_its_batch(engine):
    documents = [item(d) for d in DOCUMENTS]
    together = engine.rerank("revenue", documents).scores
    alone = [engine.rerank("revenue", [d]).scores[0] for d in documents]
    np.testing.assert_allclose(together, alone, atol=1e-6, rtol=0)


def test_truncation_cuts_texts_and_keeps_the_scaffold_and_images(checkpoint):
    eng = start_engine(checkpoint[0], pooling=registry.Pooling.RANK, max_seq=96)
    try:
        long_text = "Gravity is a force that attracts bodies. " * 20
        with pytest.raises(InputTooLong):
            eng.rerank("revenue", [ImageInput((IMAGES[0], long_text))])
        whole = eng.rerank("revenue", [ImageInput((IMAGES[0], "Gravity"))])
        cut = eng.rerank("revenue", [ImageInput((IMAGES[0], long_text))], truncate=True)
        assert cut.n_tokens == [eng.info.truncate_tokens] and whole.n_tokens[0] < 96
        assert 0 < cut.scores[0] < 1
        with pytest.raises(InvalidInput, match="nothing to cut"):  # 40 image tokens and the scaffold do not fit
            eng.rerank(ImageInput((IMAGES[2],)), [ImageInput((IMAGES[2], long_text))], truncate=True)
    finally:
        eng.close()


def test_image_token_bounds_give_the_reference_with_those_pixel_bounds(checkpoint, reference):
    """--image-min-tokens 8 / --image-max-tokens 12 move the 4-, 18- and 35-token images (checkpoint: 4 to 40) into
    8 x 32^2 .. 12 x 32^2 pixels, as the reference processor given those bounds."""
    eng = start_engine(checkpoint[0], pooling=registry.Pooling.RANK, image_min_tokens=8, image_max_tokens=12)
    try:
        documents = [[IMAGES[0]], [IMAGES[2], "revenue"]]
        result = eng.rerank(item([IMAGES[1]]), [item(d) for d in documents])
    finally:
        eng.close()
    size = {"shortest_edge": 8 * 32 * 32, "longest_edge": 12 * 32 * 32}
    for document, got, n_tokens in zip(documents, result.scores, result.n_tokens, strict=True):
        expected, expected_tokens = reference([IMAGES[1]], document, size=size)
        assert abs(got - expected) < 1e-4 and n_tokens == expected_tokens
    # query 200x90: 18 -> 10 tokens; 50x70: 4 -> 12; 330x260: 35 -> 9
    assert [n - reference([IMAGES[1]], d)[1] for n, d in zip(result.n_tokens, documents)] == [
        (10 - 18) + (12 - 4), (10 - 18) + (9 - 35)]


def test_bad_images_and_image_tokens_in_text_are_refused_naming_the_item(engine):
    with pytest.raises(InvalidImage, match="^document 1: not an image Pillow can decode"):
        engine.rerank("q", ["fine", ImageInput((b"not an image",))])
    with pytest.raises(InvalidImage, match="^query: "):
        engine.rerank(ImageInput((b"\x89PNG broken",)), ["fine"])
    with pytest.raises(InvalidInput, match="^query: the text holds <\\|image_pad\\|>, which only an image"):
        engine.rerank("sneaky <|image_pad|>", ["fine"])
    with pytest.raises(InvalidInput, match="^document 1: the text holds <\\|image_pad\\|>"):
        engine.rerank("q", ["fine", ImageInput((IMAGES[0], "sneaky <|image_pad|>"))])


def test_detection_needs_rank_mode_and_reads_the_logit_score_module(checkpoint, tmp_path):
    ckpt = read(checkpoint[0])
    assert ckpt.logit_score == (TRUE_ID, FALSE_ID)
    assert registry.kind_of(ckpt, rank=True) == registry.GENERATIVE_RERANKER
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("config.json", "modules.json"):
        (bad / name).write_text((checkpoint[0] / name).read_text())
    (bad / "1_LogitScore").mkdir()
    (bad / "1_LogitScore" / "config.json").write_text(json.dumps({"true_token_id": "yes"}))
    with pytest.raises(Exception, match="LogitScore module needs integer true_token_id and false_token_id"):
        read(bad)


def test_without_its_template_the_checkpoint_renders_ours_the_same(checkpoint, tmp_path):
    from engine.multimodal.builders.qwen3_vl_reranker import input_builder

    bare = tmp_path / "bare"
    shutil.copytree(checkpoint[0], bare, ignore=shutil.ignore_patterns("additional_chat_templates"))
    ckpt = read(bare)
    ours = input_builder(ckpt, ckpt.format.open_tokenizer(ckpt))
    assert ours.source.name == "qwen3_vl_reranker.jinja"
    own = input_builder(read(checkpoint[0]), ckpt.format.open_tokenizer(ckpt))
    query, document = ({"type": "text", "text": "q?"},), ({"type": "image"}, {"type": "text", "text": "d."})
    for instruction in (None, "Find charts."):
        expected = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<Instruct>: "
                    f"{instruction or DEFAULT_INSTRUCTION}<Query>:q?\n<Document>:{IMAGE}d.<|im_end|>\n"
                    f"<|im_start|>assistant\n")
        assert ours.render(query, document, instruction) == own.render(query, document, instruction) == expected


def test_the_rerank_route_and_mlx_rerank_give_the_engines_scores(checkpoint, engine, tmp_path, capsys):
    import base64

    import orjson
    from falcon.testing import TestClient

    from compat.app import create_app
    from compat.cli import rerank_main
    from compat.settings import parse_settings

    (tmp_path / "page.png").write_bytes(IMAGES[0])
    (tmp_path / "query.png").write_bytes(IMAGES[1])
    expected = engine.rerank(ImageInput((IMAGES[1], "revenue")), ["a chart", ImageInput.image(IMAGES[0])])
    client = TestClient(create_app(parse_settings(["--reranking", "--media-path", str(tmp_path)], {},
                                                  system_config_files=[]), engine))
    body = {"query": {"text": "revenue", "image": "file://query.png"},
            "documents": ["a chart", {"type": "image_url", "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(IMAGES[0]).decode()}}]}
    res = client.simulate_post("/v1/rerank", json=body).json
    assert {r["index"]: r["relevance_score"] for r in res["results"]} == dict(enumerate(expected.scores))
    assert res["usage"]["prompt_tokens"] == sum(expected.n_tokens)
    props = client.simulate_get("/props").json
    assert props["modalities"]["vision"] and props["input_modalities"] == ["text", "image"]
    assert rerank_main(["-m", str(checkpoint[0]), "-q", "revenue", "--query-image", str(tmp_path / "query.png"),
                        "-d", "a chart", "--image", str(tmp_path / "page.png"), "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["kind"] == "generative-reranker" and out["prompt_tokens"] == sum(expected.n_tokens)
    np.testing.assert_allclose(out["scores"], expected.scores, atol=1e-6, rtol=0)


def test_max_chunks_is_refused_naming_the_reranker(engine):
    """Long-document windows are for text rerankers: this one builds pairs that may hold images."""
    with pytest.raises(InvalidInput, match=r"only for text rerankers; this one \(Qwen3VL"):
        engine.rerank("revenue", ["a chart"], max_chunks=2)
    assert len(engine.rerank("revenue", ["a chart"], max_chunks=0).scores) == 1
