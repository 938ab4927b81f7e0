"""LFM2 / LFM2.5 ColBERT (pylate's late-interaction layout on the bidirectional LFM2 encoder) against pylate's
query and document handling, on a tiny random checkpoint (torch CPU, fp32).

The reference is written here in torch from pylate's own source, because pylate cannot run in this environment
(every pylate 1.x release pins sentence-transformers 5.x and transformers <= 5.3; the tests run on
sentence-transformers 6.2 and transformers 5.24, and pylate 1.6.0 fails to load a checkpoint on them). What
`pylate_encode` below does, line for line, is `pylate/models/colbert.py` of pylate 1.3.4 (2025-10-16, the
release current when LFM2-ColBERT-350M was published; 1.6.0 is the same for a non-empty prefix):
`ColBERT.tokenize` (max_seq_length = length - 1, `padding="max_length"` for an expanded query,
`insert_prefix_token` right after the first token, attention mask filled with 1 when
attend_to_expansion_tokens), the pad token set to the mask token else EOS (`ColBERT.__init__`), and
`ColBERT.encode` (a document's rows kept where `skiplist_mask & attention_mask`, a query keeping every row when
expanded, each row L2-normalized); texts stripped as sentence-transformers 5.3.0's `Transformer.tokenize` does.
The tokenizer is transformers' AutoTokenizer on the saved folder and the model transformers' Lfm2Model made
bidirectional (test_lfm2.py's BidirectionalReference), so nothing here comes from our engine.
"""
from __future__ import annotations

import json
import string

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import save_file

from engine import Pooling
from engine.errors import InvalidInput, UnsupportedCheckpoint
from engine.families import lfm2
from engine.loading import formats
from engine.text.late_interaction import LateFormat
from engine.text.tokenizer import TextTokenizer
from tests.engine.families.decoder_fixture import (
    LONG_TEXTS,
    MIN_COSINE,
    check_batch_invariant,
    save_random,
    st_modules,
    token_lists,
    tokenizer,
)
from tests.engine.families.test_lfm2 import BIDIRECTIONAL, BidirectionalReference
from tests.engine.helpers import cosine, start_engine, torch

COLBERT_DIM = 16
PREFIXES = ["[Q] ", "[D] "]
# short lengths so that queries are expanded and cut, and documents cut, on LONG_TEXTS (2 to ~100 tokens)
CONFIG = {"similarity_fn_name": "MaxSim", "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 24,
          "document_length": 40}
TEXTS = [*LONG_TEXTS, "  (spaces, and punctuation!)  "]
BOS = "<|im_start|>"  # the fixture tokenizer's stand-in for LFM2's <|startoftext|>


def build_colbert(folder, config: dict):
    """pylate's ColBERT layout: no Pooling, a bias-free Identity Dense 64 -> 16 applied to every token, the [Q] / [D]
    prefixes added to the tokenizer (as pylate saves a checkpoint: its embeddings sized for them)."""
    t = torch()
    from tokenizers import processors
    from transformers import AutoTokenizer

    folder, model = save_random(
        folder, "Lfm2Model", "Lfm2Config", seed=16, vocab_size=len(tokenizer()) + len(PREFIXES),
        config_edits={"architectures": ["Lfm2BidirectionalModel"]}, **BIDIRECTIONAL,
        files={"modules.json": st_modules(("1_Dense", "pylate.models.Dense.Dense")),
               "1_Dense/config.json": {"in_features": 64, "out_features": COLBERT_DIM, "bias": False,
                                       "activation_function": "torch.nn.modules.linear.Identity",
                                       "use_residual": False},
               "config_sentence_transformers.json": config})
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert tok.add_tokens(PREFIXES) == len(PREFIXES)
    # a first token before every text, as LFM2's <|startoftext|>: the prefix goes in after it
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tok.convert_tokens_to_ids(BOS))])
    tok.save_pretrained(str(folder))
    gen = t.Generator().manual_seed(16)
    weight = (t.randn(COLBERT_DIM, 64, generator=gen) * 0.2).numpy()
    save_file({"linear.weight": weight}, str(folder / "1_Dense" / "model.safetensors"))
    return folder, BidirectionalReference(model), weight


@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    return build_colbert(tmp_path_factory.mktemp("lfm2_colbert") / "m", CONFIG)


@pytest.fixture(scope="module")
def colbert_engine(colbert):
    eng = start_engine(colbert[0])
    yield eng
    eng.close()


def pylate_tokenize(tok, texts: list[str], is_query: bool, cfg: dict):
    """pylate's ColBERT.tokenize (see the module docstring) -> (input_ids, attention_mask) [B, L] tensors."""
    t = torch()
    expand = cfg.get("do_query_expansion", True)
    length = cfg["query_length"] if is_query else cfg["document_length"]
    prefix_id = tok.convert_tokens_to_ids(cfg["query_prefix"] if is_query else cfg["document_prefix"])
    out = tok([text.strip() for text in texts], padding="max_length" if is_query and expand else True,
              truncation="longest_first", max_length=length - 1, return_tensors="pt")

    def insert(x, value):
        return t.cat([x[:, :1], t.full((x.shape[0], 1), value, dtype=x.dtype), x[:, 1:]], dim=1)

    ids, mask = insert(out["input_ids"], prefix_id), insert(out["attention_mask"], 1)
    if is_query and expand and cfg.get("attend_to_expansion_tokens", False):
        mask.fill_(1)
    return ids, mask


def pylate_encode(folder, ref, weight: np.ndarray, texts: list[str], is_query: bool, cfg: dict = CONFIG):
    """pylate's ColBERT.encode on one batch: each text's kept rows, projected and L2-normalized."""
    t = torch()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.pad_token_id = tok.mask_token_id if tok.mask_token_id is not None else tok.eos_token_id
    ids, mask = pylate_tokenize(tok, texts, is_query, cfg)
    with t.inference_mode():
        hidden = ref(input_ids=ids, attention_mask=mask).last_hidden_state.double().numpy()
    skiplist = [tok.convert_tokens_to_ids(w) for w in cfg.get("skiplist_words", list(string.punctuation))]
    out = []
    for row, row_ids, row_mask in zip(hidden, ids.numpy(), mask.numpy(), strict=True):
        if is_query:
            keep = np.ones(len(row_ids), bool) if cfg.get("do_query_expansion", True) else row_mask.astype(bool)
        else:
            keep = ~np.isin(row_ids, skiplist) & row_mask.astype(bool)
        projected = row[keep] @ weight.T.astype(np.float64)
        out.append(projected / np.linalg.norm(projected, axis=-1, keepdims=True))
    return out


def assert_rows_match(ours: list[np.ndarray], expected: list[np.ndarray]) -> None:
    for got, want in zip(ours, expected, strict=True):
        assert got.shape == want.shape
        assert min(cosine(a, b) for a, b in zip(got, want, strict=True)) >= MIN_COSINE


def test_colbert_is_multi_vector_with_query_and_document_roles(colbert, colbert_engine):
    folder, _, _ = colbert
    loaded = formats.load(formats.open_checkpoint(folder))
    assert isinstance(loaded.model, lfm2.ColBERT) and loaded.multi_vector and loaded.hidden_size == COLBERT_DIM
    info = colbert_engine.info
    assert info.multi_vector and info.query_document_roles and info.pooling is Pooling.NONE
    assert info.n_embd == COLBERT_DIM and dict(info.prompts) == {"query": "[Q] ", "document": "[D] "}
    late, tok = colbert_engine._model.late, colbert_engine.tokenizer
    ids = late.build("query", tok.encode(late.text("query", "hello")), tok).ids
    assert ids[:2] == [tok.token_to_id(BOS), tok.token_to_id("[Q] ")]  # the prefix after the first token


def test_token_ids_embed_verbatim(colbert, colbert_engine):
    """Token-id inputs get no prefix, expansion or skiplist: every token's projected, normalized vector."""
    folder, ref, weight = colbert
    lists = token_lists(folder, LONG_TEXTS)
    ours = colbert_engine.embed(lists).vectors
    t = torch()
    for ids, got in zip(lists, ours, strict=True):
        with t.inference_mode():
            hidden = ref(input_ids=t.tensor([ids]), attention_mask=t.ones(1, len(ids), dtype=t.long))
        projected = hidden.last_hidden_state[0].double().numpy() @ weight.T.astype(np.float64)
        expected = projected / np.linalg.norm(projected, axis=-1, keepdims=True)
        assert_rows_match([got], [expected])
    check_batch_invariant(colbert_engine, folder, LONG_TEXTS)


@pytest.mark.parametrize("role", ["query", "document"])
def test_texts_match_pylate(colbert, colbert_engine, role):
    """Queries: prefixed, cut and expanded to query_length with unattended expansion tokens, every row kept;
    documents: prefixed, cut at document_length, punctuation rows dropped. One padded batch on each side."""
    folder, ref, weight = colbert
    expected = pylate_encode(folder, ref, weight, TEXTS, role == "query")
    ours = colbert_engine.embed_prompts([[text] for text in TEXTS], prompt_name=role).vectors
    assert_rows_match(ours, expected)
    if role == "query":
        assert {len(v) for v in ours} == {CONFIG["query_length"]}
    else:
        assert max(len(v) for v in ours) < CONFIG["document_length"]  # cut, then punctuation dropped


def test_each_text_alone_equals_the_batch(colbert, colbert_engine):
    for role in ("query", "document"):
        together = colbert_engine.embed_prompts([[text] for text in TEXTS], prompt_name=role).vectors
        for text, vectors in zip(TEXTS, together, strict=True):
            alone = colbert_engine.embed_prompts([[text]], prompt_name=role).vectors[0]
            np.testing.assert_allclose(vectors, alone, atol=1e-5, rtol=0)


def test_a_text_is_a_document_unless_the_request_says_query(colbert, colbert_engine):
    eng = colbert_engine
    text = [[TEXTS[1]]]
    assert np.array_equal(eng.embed_prompts(text).vectors[0],
                          eng.embed_prompts(text, prompt_name="document").vectors[0])
    with pytest.raises(InvalidInput, match="'query' or a 'document'"):
        eng.embed_prompts(text, prompt_name="passage")
    with pytest.raises(InvalidInput, match="instruction"):
        eng.embed_prompts(text, instruction="find it")
    assert eng.format_prompts(text, prompt_name="query") == text  # the engine formats them (embed_prompts)


def test_maxsim_scores_queries_against_documents_as_pylate(colbert, colbert_engine):
    """MaxSim (pylate's colbert_scores): each query row's best dot product with a document row, summed."""
    folder, ref, weight = colbert
    query, documents = TEXTS[1], [TEXTS[2], TEXTS[-2], TEXTS[3], TEXTS[-1]]
    q = pylate_encode(folder, ref, weight, [query], True)[0]
    expected = [float((q @ d.T).max(axis=1).sum()) for d in pylate_encode(folder, ref, weight, documents, False)]
    result = colbert_engine.maxsim([query], [[d] for d in documents])
    np.testing.assert_allclose(result.scores, expected, rtol=1e-5, atol=1e-5)
    assert result.n_tokens[0] == CONFIG["query_length"]


@pytest.mark.parametrize("edits", [{"attend_to_expansion_tokens": True}, {"do_query_expansion": False},
                                   {"skiplist_words": ["is", ".", "!"], "document_length": 12}])
def test_other_pylate_settings_match(tmp_path, edits):
    cfg = {**CONFIG, **edits}
    folder, ref, weight = build_colbert(tmp_path / "m", cfg)
    eng = start_engine(folder)
    try:
        for role in ("query", "document"):
            expected = pylate_encode(folder, ref, weight, TEXTS, role == "query", cfg)
            assert_rows_match(eng.embed_prompts([[text] for text in TEXTS], prompt_name=role).vectors, expected)
    finally:
        eng.close()


def test_a_document_of_skiplist_tokens_only_is_refused(tmp_path):
    """With no document prefix and a tokenizer adding no first token, a document of punctuation keeps no row."""
    from transformers import AutoTokenizer

    folder, _, _ = build_colbert(tmp_path / "m", {**CONFIG, "document_prefix": ""})
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.backend_tokenizer.post_processor = None
    tok.save_pretrained(str(folder))
    eng = start_engine(folder)
    try:
        with pytest.raises(InvalidInput, match="input 1: every token of it is in the model's skiplist"):
            eng.embed_prompts([["fine"], ["?!"]], prompt_name="document")
        assert len(eng.embed_prompts([["?!"]], prompt_name="query").vectors[0]) == CONFIG["query_length"]
    finally:
        eng.close()


def test_left_padding_tokenizer_expands_on_the_left(colbert, tmp_path):
    """A tokenizer whose padding_side is left: pylate's query puts the expansion tokens first, then inserts the
    prefix after the first of them; the format follows it token for token."""
    from transformers import AutoTokenizer

    folder, _, _ = colbert
    tok = AutoTokenizer.from_pretrained(str(folder), padding_side="left")
    tok.pad_token_id = tok.eos_token_id
    ids, mask = pylate_tokenize(tok, [TEXTS[1]], True, CONFIG)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["padding_side"] = "left"
    ckpt = formats.open_checkpoint(folder)
    text_tokenizer = TextTokenizer(ckpt)
    late = LateFormat.read(folder, text_tokenizer, config)
    built = late.build("query", text_tokenizer.encode(late.text("query", TEXTS[1])), text_tokenizer)
    assert built.ids == ids[0].tolist() and built.mask == mask[0].tolist()


def test_a_prefix_the_tokenizer_lacks_is_refused(colbert, tmp_path):
    folder, _, _ = colbert
    cfg = {**CONFIG, "query_prefix": "[QUERY] "}
    ckpt = formats.open_checkpoint(folder)
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedCheckpoint, match=r"query prefix '\[QUERY\] ' is not a token"):
        LateFormat.read(tmp_path, TextTokenizer(ckpt), ckpt.tokenizer_config)


def test_colbert_without_its_projection_is_refused(colbert):
    folder, _, _ = colbert
    args = lfm2.ModelArgs.from_dict(json.loads((folder / "config.json").read_text()))
    with pytest.raises(UnsupportedCheckpoint, match="1_Dense projection"):
        lfm2.ColBERT(args).sanitize(mx.load(str(folder / "model.safetensors")))
