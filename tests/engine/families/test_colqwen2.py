"""ColQwen2.5 and ColQwen2 (engine/families/colqwen2.py, engine/multimodal/builders/colqwen2.py) against colpali-engine's
ColQwen2_5 / ColQwen2, and transformers' ColQwen2ForRetrieval for its vlm.* layout, on tiny random checkpoints: the
reference processor's ids and pixel values, the same token vectors on mixed text and image batches, the same
MaxSim scores."""
from __future__ import annotations

import io
import json
import shutil

import mlx.core as mx
import numpy as np
import pytest

from engine import ImageInput, Pooling
from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.multimodal.builders import colqwen2 as builder
from tests.engine.families import colqwen2_fixture as fixture
from tests.engine.helpers import cosine, start_engine

# a palette page with a transparent entry: Pillow warns when converting it, as it does for the reference
pytestmark = pytest.mark.filterwarnings("ignore:Palette images with Transparency")
QUERIES = ["What was the total revenue in 2023?", "A woman playing with her dog on a beach", "gravity"]


def page(width: int, height: int, mode: str, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA").convert(mode)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


# odd sizes, so windows are partial; one page with transparency (colpali drops it rather than compositing)
PAGES = [page(200, 150, "RGB", 0), page(90, 260, "RGBA", 1), page(61, 70, "P", 2)]


@pytest.fixture(scope="module")
def colpali(tmp_path_factory):
    """(folder, colpali-engine's model on the same weights, the saved tokenizer)."""
    import transformers

    folder = tmp_path_factory.mktemp("colqwen2_5")
    reference = fixture.make_checkpoint(folder)
    return folder, reference, transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def engine(colpali):
    eng = start_engine(colpali[0])
    yield eng
    eng.close()


def reference_inputs(folder, tokenizer, text: str, images: list[bytes], size: dict | None = None) -> dict:
    """The torch model's inputs as colpali-engine's processor makes them: each page converted to RGB, then
    Qwen2-VL's image processor; each <|image_pad|> of the text repeated per merged patch block of its image.
    size: pixel bounds ({"shortest_edge": min_pixels, "longest_edge": max_pixels}) in place of the checkpoint's."""
    import torch
    import transformers
    from PIL import Image

    processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder, **({"size": size} if size else {}))
    processed = [processor([Image.open(io.BytesIO(data)).convert("RGB")], return_tensors="pt") for data in images]
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(images) + 1
    expanded = pieces[0] + "".join("<|image_pad|>" * (int(p["image_grid_thw"].prod()) // 4) + rest
                                   for p, rest in zip(processed, pieces[1:]))
    ids = torch.tensor([tokenizer(expanded)["input_ids"]])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if images:  # one padded [patches, dim] slab per image, as colpali's processor batches them
        inputs.update(pixel_values=torch.nn.utils.rnn.pad_sequence([p["pixel_values"] for p in processed],
                                                                   batch_first=True),
                      image_grid_thw=torch.cat([p["image_grid_thw"] for p in processed]),
                      mm_token_type_ids=(ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).int())
    return inputs


def reference_rows(colpali, text: str, images: list[bytes] = (), size: dict | None = None) -> np.ndarray:
    import torch

    folder, reference, tokenizer = colpali
    with torch.no_grad():
        return reference(**reference_inputs(folder, tokenizer, text, list(images), size))[0].numpy()


BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"


def document(*middle: str) -> str:
    """colpali-engine's page prompt with its image block and fixed text replaced by the given pieces."""
    prefix, suffix = fixture.colpali_prompts()["visual_prompt_prefix"].split(BLOCK + "Describe the image.")
    return prefix + "".join(middle) + suffix


# colpali-engine's query_prefix from 0.3.0 to 0.3.12 (BaseVisualRetrieverProcessor.query_prefix in 0.3.11 / 0.3.12,
# ColQwen2Processor's and ColQwen2_5_Processor's before): the releases the published checkpoints were trained with.
# 0.3.13 made the base class's "" (the installed 0.3.18 reads ""); engine/multimodal/builders/colqwen2.py has the
# evidence.
TRAINED_QUERY_PREFIX = "Query: "


def query(text: str) -> str:
    """colpali-engine's process_queries (installed 0.3.18's formula), with the training releases' prefix."""
    prompts = fixture.colpali_prompts()
    return TRAINED_QUERY_PREFIX + text + prompts["query_augmentation_token"] * 10


def assert_rows_match(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)  # the cosine alone misses a wrong image position
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("base", ["qwen2_5_vl", "qwen2_vl"])
def test_prompts_are_colpali_engines(base):
    prompts = fixture.colpali_prompts(base)
    assert builder.DOCUMENT_PROMPT == prompts["visual_prompt_prefix"]
    assert prompts.get("query_prefix", "") == ""  # 0.3.13+'s reading, which we do not follow
    assert builder.QUERY_PREFIX == TRAINED_QUERY_PREFIX
    assert builder.QUERY_SUFFIX == prompts["query_augmentation_token"] * 10


def transformers_processor(folder):
    """transformers' ColQwen2Processor on a checkpoint folder (its query_prefix from processor_config.json)."""
    import transformers

    kwargs = {}
    config = folder / "processor_config.json"
    if config.is_file():
        kwargs = {k: v for k, v in json.loads(config.read_text()).items() if k in ("query_prefix",)}
    return transformers.ColQwen2Processor(image_processor=transformers.Qwen2VLImageProcessorPil.from_pretrained(folder),
                                          tokenizer=transformers.AutoTokenizer.from_pretrained(folder), **kwargs)


def test_query_tokens_are_transformers_processors_without_its_newline(colpali, engine):
    """transformers' ColQwen2Processor: the same prefix and augmentation tokens, then a "\n" the training
    releases never had (it derives from ColPaliProcessor, whose PaliGemma queries end in one)."""
    folder, _, tokenizer = colpali
    processor = transformers_processor(folder)
    for text in QUERIES:
        theirs = processor.process_queries([text])["input_ids"][0].tolist()
        assert theirs[-1:] == tokenizer("\n")["input_ids"]
        assert engine._model.builder.build([text]).ids == theirs[:-1]


def test_a_checkpoints_own_query_prefix_is_honoured(colpali, tmp_path):
    """processor_config.json's query_prefix (what transformers' ColQwen2Processor saves and reads)."""
    import transformers

    folder, _, _ = colpali
    for item in folder.iterdir():
        (tmp_path / item.name).symlink_to(item)
    saved = tmp_path / "saved"
    transformers.ColQwen2Processor(image_processor=transformers.Qwen2VLImageProcessorPil.from_pretrained(folder),
                                   tokenizer=transformers.AutoTokenizer.from_pretrained(folder),
                                   query_prefix="Question: ").save_pretrained(saved)
    shutil.copy(saved / "processor_config.json", tmp_path / "processor_config.json")
    theirs = transformers.ColQwen2Processor.from_pretrained(saved).process_queries([QUERIES[0]])["input_ids"][0]
    eng = start_engine(tmp_path)
    try:
        assert eng._model.builder.build([QUERIES[0]]).ids == theirs.tolist()[:-1]
    finally:
        eng.close()
    (tmp_path / "processor_config.json").write_text(json.dumps({"query_prefix": 7}))
    with pytest.raises(UnsupportedCheckpoint, match="query_prefix must be a string"):
        start_engine(tmp_path)


def test_ids_and_pixels_are_the_reference_processors(colpali, engine):
    from PIL import Image

    folder, _, tokenizer = colpali
    for data in PAGES:
        prepared = engine._model.builder.build([Image.open(io.BytesIO(data))])
        theirs = reference_inputs(folder, tokenizer, document(BLOCK, "Describe the image."), [data])
        assert prepared.ids == theirs["input_ids"][0].tolist()
        (image,) = prepared.images
        np.testing.assert_allclose(image.arrays["pixel_values"], theirs["pixel_values"][0].numpy(), atol=1e-6)
        assert image.arrays["image_grid_thw"].tolist() == theirs["image_grid_thw"][0].tolist()
        assert image.n_tokens == int(theirs["image_grid_thw"].prod()) // 4
    prepared = engine._model.builder.build([QUERIES[0]])
    assert prepared.ids == tokenizer(query(QUERIES[0]))["input_ids"] and not prepared.images


def test_mixed_text_and_image_batches_match_colpali(colpali, engine):
    prompts = [[QUERIES[0]], ImageInput.image(PAGES[0]), [QUERIES[1]], ImageInput.image(PAGES[1]),
               ImageInput(("Look at ", PAGES[2], " and this: ", PAGES[0])), [QUERIES[2]], ImageInput.image(PAGES[2])]
    result = engine.embed_prompts(prompts)
    expected = [
        reference_rows(colpali, query(QUERIES[0])),
        reference_rows(colpali, document(BLOCK, "Describe the image."), [PAGES[0]]),
        reference_rows(colpali, query(QUERIES[1])),
        reference_rows(colpali, document(BLOCK, "Describe the image."), [PAGES[1]]),
        reference_rows(colpali, document("Look at ", BLOCK, " and this: ", BLOCK), [PAGES[2], PAGES[0]]),
        reference_rows(colpali, query(QUERIES[2])),
        reference_rows(colpali, document(BLOCK, "Describe the image."), [PAGES[2]]),
    ]
    for ours, theirs in zip(result.vectors, expected, strict=True):
        assert_rows_match(ours, theirs)
    assert result.n_tokens == [len(rows) for rows in expected]  # image tokens counted, padding trimmed


def test_maxsim_scores_match_colpali(colpali, engine):
    from engine.compute.maxsim import maxsim_scores

    queries = engine.embed_prompts([[q] for q in QUERIES]).vectors
    pages = engine.embed_prompts([ImageInput.image(data) for data in PAGES]).vectors
    ref_pages = [reference_rows(colpali, document(BLOCK, "Describe the image."), [data]) for data in PAGES]
    for ours_query, text in zip(queries, QUERIES, strict=True):
        ref_query = reference_rows(colpali, query(text))
        theirs = [float((ref_query @ ref_page.T).max(axis=1).sum()) for ref_page in ref_pages]
        np.testing.assert_allclose(maxsim_scores(ours_query, pages), theirs, atol=1e-4)


def test_key_layouts_sanitize_alike(colpali):
    """An MLX conversion (vision_tower.*, channels-last Conv3d filter) and transformers 5's own save
    (language_model.*) give the parameters of the colpali layout (model.*, visual.*)."""
    from engine.families import colqwen2

    folder = colpali[0]
    model = colqwen2.Model(colqwen2.ModelArgs.from_dict(json.loads((folder / "config.json").read_text())))
    raw = mx.load(str(folder / "model.safetensors"))
    expected = model.sanitize(raw)
    mlx_layout = {(k.replace("visual.", "vision_tower.", 1) if k.startswith("visual.") else k):
                  (v.transpose(0, 2, 3, 4, 1) if k.endswith("patch_embed.proj.weight") else v) for k, v in raw.items()}
    transformers_layout = {("language_model." + k.removeprefix("model.")) if k.startswith("model.") else k: v
                           for k, v in raw.items()}
    for layout in (mlx_layout, transformers_layout):
        got = model.sanitize(layout)
        assert got.keys() == expected.keys()
        for key in got:
            np.testing.assert_array_equal(np.array(got[key]), np.array(expected[key]))


@pytest.mark.parametrize("base", ["qwen2_5_vl", "qwen2_vl"])
def test_transformers_retrieval_export(tmp_path, base):
    """vlm.* / embedding_proj_layer.*: the same vectors as ColQwen2ForRetrieval given colpali-engine's M-RoPE
    positions (its own forward never hands the image grid to the VLM, so left alone it numbers an image's tokens
    like text; colpali-engine, which trained these models, gives them M-RoPE positions)."""
    import torch
    import transformers

    reference = fixture.make_transformers_export(tmp_path, base=base)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    eng = start_engine(tmp_path)
    try:
        ours = eng.embed_prompts([[QUERIES[0]], ImageInput.image(PAGES[0])]).vectors
    finally:
        eng.close()
    inputs = [reference_inputs(tmp_path, tokenizer, query(QUERIES[0]), []),
              reference_inputs(tmp_path, tokenizer, builder.DOCUMENT_PROMPT, [PAGES[0]])]
    with torch.no_grad():
        positions, _ = reference.vlm.get_rope_index(inputs[1]["input_ids"], inputs[1].pop("mm_token_type_ids"),
                                                    image_grid_thw=inputs[1]["image_grid_thw"])
        theirs = [reference(**inputs[0]).embeddings[0].numpy(),
                  reference(**inputs[1], position_ids=positions).embeddings[0].numpy()]
    for row, expected in zip(ours, theirs, strict=True):
        assert_rows_match(row, expected)


def test_image_token_bounds_give_colpali_with_those_pixel_bounds(colpali):
    """--image-min-tokens 10 grows the 4-token page, --image-max-tokens 16 shrinks the 35-token one (both to 12): the rows are
    colpali-engine's with Qwen2-VL's processor bounded to 10 x 28^2 .. 16 x 28^2 pixels."""
    eng = start_engine(colpali[0], image_min_tokens=10, image_max_tokens=16)
    try:
        result = eng.embed_prompts([ImageInput.image(PAGES[0]), ImageInput.image(PAGES[2])])
    finally:
        eng.close()
    size = {"shortest_edge": 10 * 28 * 28, "longest_edge": 16 * 28 * 28}
    page_prompt = document(BLOCK, "Describe the image.")
    for ours, data in zip(result.vectors, (PAGES[0], PAGES[2]), strict=True):
        assert_rows_match(ours, reference_rows(colpali, page_prompt, [data], size))
    default = [len(reference_rows(colpali, page_prompt, [data])) for data in (PAGES[0], PAGES[2])]
    assert [len(rows) - n for rows, n in zip(result.vectors, default)] == [12 - 35, 12 - 4]  # 3 x 4, 4 x 3 blocks


def test_limits_and_refusals(colpali, engine, tmp_path):
    with pytest.raises(InvalidInput, match="builds its own query and document prompts"):
        engine.embed_prompts([[QUERIES[0]]], instruction="Find the page")
    with pytest.raises(InvalidInput, match="the image token <\\|image_pad\\|>"):
        engine.embed_prompts([["a <|image_pad|> here"]])
    with pytest.raises(InvalidInput, match="input 1: not an image"):
        engine.embed_prompts([[QUERIES[0]], ImageInput((b"not an image",))])
    with pytest.raises(UnsupportedCheckpoint, match="multi-vector"):
        start_engine(colpali[0], pooling=Pooling.MEAN)
    folder = tmp_path / "generative"
    shutil.copytree(colpali[0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2_5_VLForConditionalGeneration"]}))
    with pytest.raises(UnsupportedCheckpoint, match="supported: ColQwen2, ColQwen2ForRetrieval, ColQwen2_5"):
        start_engine(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "colqwen2", "architectures": ["ColQwen2ForRetrieval"],
                                                    "vlm_config": {**config, "model_type": "qwen3_vl"}}))
    with pytest.raises(UnsupportedCheckpoint, match="'qwen3_vl' are not supported"):
        start_engine(folder)
    adapter = tmp_path / "adapter"  # vidore/colqwen2.5-v0.2 ships a LoRA adapter, with or without a config.json
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(UnsupportedCheckpoint, match="a PEFT adapter .*merge it into its base model"):
        start_engine(adapter)
    shutil.copy(colpali[0] / "config.json", adapter)
    with pytest.raises(UnsupportedCheckpoint, match="a PEFT adapter .*merge it into its base model"):
        start_engine(adapter)


@pytest.fixture(scope="module")
def colpali_qwen2(tmp_path_factory):
    """ColQwen2 (Qwen2-VL: LayerNorm blocks, fc1/fc2 MLP, full attention everywhere) from colpali-engine."""
    import transformers

    folder = tmp_path_factory.mktemp("colqwen2")
    reference = fixture.make_checkpoint(folder, base="qwen2_vl")
    return folder, reference, transformers.AutoTokenizer.from_pretrained(folder)


def test_colqwen2_on_qwen2_vl_matches_colpali(colpali_qwen2):
    from engine.compute.maxsim import maxsim_scores

    eng = start_engine(colpali_qwen2[0])
    try:
        result = eng.embed_prompts([[QUERIES[0]], ImageInput.image(PAGES[0]), ImageInput(("See ", PAGES[1])),
                                    ImageInput.image(PAGES[2])])
    finally:
        eng.close()
    expected = [reference_rows(colpali_qwen2, query(QUERIES[0])),
                reference_rows(colpali_qwen2, document(BLOCK, "Describe the image."), [PAGES[0]]),
                reference_rows(colpali_qwen2, document("See ", BLOCK), [PAGES[1]]),
                reference_rows(colpali_qwen2, document(BLOCK, "Describe the image."), [PAGES[2]])]
    for ours, theirs in zip(result.vectors, expected, strict=True):
        assert_rows_match(ours, theirs)
    theirs = [float((expected[0] @ page.T).max(axis=1).sum()) for page in expected[1:]]
    np.testing.assert_allclose(maxsim_scores(result.vectors[0], result.vectors[1:]), theirs, atol=1e-4)


def test_published_config_layout_reads_the_same(colpali, engine, tmp_path):
    """vidore/colqwen2.5-base's config.json predates transformers 5: the decoder's keys at the top level, M-RoPE
    spelled as rope_scaling {type: mrope}, the tower's channels as in_chans. It builds the same model."""
    folder = tmp_path / "published"
    shutil.copytree(colpali[0], folder)
    config = json.loads((folder / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    vision = config.pop("vision_config")
    vision["in_chans"] = vision.pop("in_channels")
    (folder / "config.json").write_text(json.dumps({
        **text, **config, "vision_config": vision, "rope_theta": rope["rope_theta"],
        "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}, "model_type": "qwen2_5_vl",
        "sliding_window": 32768, "use_sliding_window": False}))
    prompts = [[QUERIES[0]], ImageInput.image(PAGES[0])]
    published = start_engine(folder)
    try:
        got = published.embed_prompts(prompts).vectors
    finally:
        published.close()
    for ours, expected in zip(got, engine.embed_prompts(prompts).vectors, strict=True):
        np.testing.assert_allclose(ours, expected, atol=1e-6)
