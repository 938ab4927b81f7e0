"""engine/families/roberta.py and camembert.py (XLM-RoBERTa's trunk and head under their own names) against
transformers' RoBERTa / CamemBERT and sentence-transformers on the same random weights (torch CPU, fp32).

Each family gets all-distilroberta-v1's layout (RobertaForMaskedLM as the architecture over the trunk's keys,
mean pooling, Normalize, here with prompts) and a one-label *ForSequenceClassification cross-encoder. Tiny
(hidden 64, 2 layers, 4 heads); RoBERTa on a small byte-level BPE with RoBERTa's specials and template, CamemBERT
on a small SentencePiece-style Unigram with CamemBERT's (<s>NOTUSED <pad> </s>NOTUSED <unk> ... <s> </s>).
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine import Pooling
from engine.loading import formats, registry
from tests.engine.families.decoder_fixture import (
    MIN_COSINE,
    check_batch_invariant,
    check_tokens_match,
    reference_hidden,
    token_lists,
)
from tests.engine.families.qwen3_fixture import CORPUS
from tests.engine.helpers import (
    ENCODER_TEXTS as TEXTS,
    byte_level_bpe,
    cosine,
    family_hidden,
    hf_logit,
    load_hf_model,
    perturb_vectors,
    save_sentence_transformer,
    sentencepiece_unigram,
    start_engine,
    torch,
)

ATOL = 1e-4
PROMPTS = {"query": "query: ", "document": "passage: "}
QUERY = "what is the capital of France"
DOCS = ["Paris", "Paris est la capitale de la France. " * 4, "The Eiffel Tower is in Paris.", "東京は日本の首都です。"]
FRENCH = ["Paris est la capitale de la France.", "Le renard brun saute par-dessus le chien paresseux.",
          "Quelle est la capitale du Japon ? Tokyo, évidemment."] * 20
SPECIAL_NAMES = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                 "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>", "model_max_length": 512}
VARIANTS = {
    "roberta": dict(prefix="Roberta", specials=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]),
    "camembert": dict(prefix="Camembert",
                      specials=["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>",
                                "<mask>"]),
}


def save_tokenizer(family: str, out: Path) -> tuple[int, int, int, int]:
    """The family's tokenizer.json and tokenizer_config.json in `out`; returns (vocabulary size, <pad>, <s>, </s>)."""
    out.mkdir(parents=True, exist_ok=True)
    corpus = CORPUS + TEXTS * 20 + FRENCH + DOCS * 10
    specials = VARIANTS[family]["specials"]
    if family == "roberta":
        from tokenizers import processors

        tok = byte_level_bpe(corpus, specials, 700)
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                          add_prefix_space=False)
    else:  # CamemBERT's template: <s> A </s>, <s> A </s> </s> B </s>
        tok = sentencepiece_unigram(corpus, specials, 700, template=("<s> $A </s>", "<s> $A </s> </s> $B </s>"))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {**SPECIAL_NAMES, "tokenizer_class": f"{VARIANTS[family]['prefix']}Tokenizer"}), encoding="utf-8")
    return tok.get_vocab_size(), tok.token_to_id("<pad>"), tok.token_to_id("<s>"), tok.token_to_id("</s>")


def make_random(family: str, out: Path, architecture: str, *, seed: int) -> Path:
    t = torch()
    import transformers

    n_vocab, pad, bos, eos = save_tokenizer(family, out)
    prefix = VARIANTS[family]["prefix"]
    t.manual_seed(seed)
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=pad, bos_token_id=bos,
        eos_token_id=eos, initializer_range=0.1, num_labels=1)
    model = getattr(transformers, f"{prefix}{architecture}")(config)
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    """(family, sentence-transformers folder, its engine, the transformers trunk on it)."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    backbone = make_random(family, root / "backbone", "Model", seed=41)
    folder = save_sentence_transformer(backbone, root / "st", prompts=PROMPTS)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["architectures"] = [f"{VARIANTS[family]['prefix']}ForMaskedLM"]  # as all-distilroberta-v1 ships it
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    eng = start_engine(folder)
    yield family, folder, eng, load_hf_model(backbone)
    eng.close()


@pytest.fixture(scope="module")
def reranker(variant, tmp_path_factory):
    family = variant[0]
    folder = make_random(family, tmp_path_factory.mktemp(f"{family}-ce"), "ForSequenceClassification", seed=42)
    eng = start_engine(folder, pooling=Pooling.RANK)
    yield folder, eng, load_hf_model(folder, f"{VARIANTS[family]['prefix']}ForSequenceClassification")
    eng.close()


def test_detected_as_its_own_family(variant, reranker):
    family, folder, eng, _ = variant
    ckpt = formats.open_checkpoint(folder)
    assert (registry.family_name(ckpt), registry.kind_of(ckpt), registry.default_pooling(ckpt)) == (
        family, registry.EMBEDDER, Pooling.MEAN)
    assert (eng.info.family, eng.info.kind, eng.info.pooling, eng.info.n_embd) == (family, "embedder", Pooling.MEAN, 64)
    assert eng.info.n_ctx_train == 514 - 1 - eng.tokenizer.pad_id  # positions start after the pad id
    assert registry.kind_of(formats.open_checkpoint(reranker[0]), rank=True) == registry.CROSS_ENCODER
    assert reranker[1].info.family == family and reranker[1].info.kind == "cross-encoder"


def test_tokenizer_matches_transformers(variant):
    _, folder, eng, _ = variant
    assert [eng.encode_prompt([t]) for t in TEXTS] == token_lists(folder, TEXTS)


def test_tokens_match_transformers(variant):
    _, folder, _, ref = variant
    assert max(len(ids) for ids in token_lists(folder, TEXTS)) > 100
    check_tokens_match(folder, ref, TEXTS)


def test_vectors_and_prompts_match_sentence_transformers(variant):
    from sentence_transformers import SentenceTransformer

    _, folder, eng, _ = variant
    st = SentenceTransformer(str(folder), device="cpu")
    for name in (None, *PROMPTS):
        ours = eng.embed_prompts(eng.format_prompts([[t] for t in TEXTS], prompt_name=name)).vectors
        expected = st.encode(TEXTS, prompt_name=name, convert_to_numpy=True)
        assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE, name


def test_batch_invariant(variant):
    _, folder, eng, _ = variant
    check_batch_invariant(eng, folder, TEXTS)


def test_family_model_directly(variant):
    family, folder, _, ref = variant
    module = importlib.import_module(f"engine.families.{family}")
    for ids in token_lists(folder, TEXTS[:5]):
        ours, expected = family_hidden(module, folder, ids), reference_hidden(ref, ids)
        assert min(cosine(a, b) for a, b in zip(ours, expected, strict=True)) >= MIN_COSINE


def test_reranker_logits_match_transformers(reranker):
    from transformers import AutoTokenizer

    folder, eng, ref = reranker
    hf_tok = AutoTokenizer.from_pretrained(str(folder))
    pairs = [eng.tokenizer.encode_pair(QUERY, doc)[0] for doc in DOCS]
    assert pairs == [hf_tok(QUERY, doc)["input_ids"] for doc in DOCS]
    expected = [hf_logit(ref, ids) for ids in pairs]
    assert np.ptp(expected) > 10 * ATOL  # the scores differ: a mixed-up row would show
    np.testing.assert_allclose(eng.rerank(QUERY, DOCS).scores, expected, rtol=0, atol=ATOL)
