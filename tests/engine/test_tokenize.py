"""engine/text/tokenizer.py on MiniLM's real tokenizer, against transformers' tokenizer for the same folder."""
from __future__ import annotations

import shutil

import pytest
from tokenizers import Tokenizer

from engine import VocabType
from engine.loading import formats
from engine.text.tokenizer import TextTokenizer

CLS, SEP, PAD = 101, 102, 0
TEXTS = ["hello", "Hello World!", "unaffable antidisestablishmentarianism", "Café naïve 東京 🙂", "",
         "numbers 3.14 and 1,000,000", "a [SEP] b [CLS] c", "word " * 200]


@pytest.fixture(scope="module")
def tok(minilm_path):
    return TextTokenizer(formats.open_checkpoint(minilm_path))


@pytest.fixture(scope="module")
def hf_tok(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path))


def _word(tok, text):
    ids = tok.encode(text, add_special=False)
    assert len(ids) == 1, ids
    return ids[0]


def test_properties(tok):
    assert tok.vocab_type is VocabType.WPM
    assert tok.n_vocab == 30522
    assert tok.pad_id == PAD
    assert tok.trailing_specials == [SEP]
    assert (tok.bos_token, tok.eos_token) == ("[CLS]", "[SEP]")


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok, hf_tok, text):
    assert tok.encode(text) == hf_tok(text)["input_ids"]
    assert tok.encode(text, add_special=False) == hf_tok(text, add_special_tokens=False)["input_ids"]


def test_baked_in_padding_and_truncation_are_stripped(tok, minilm_path):
    raw = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    assert len(raw.encode("hello").ids) == 128  # the file itself pads to 128 (and truncates there)
    assert tok.encode("hello") == [CLS, _word(tok, "hello"), SEP]
    assert len(tok.encode("word " * 200)) == 202


def test_mixed_prompt_rule(tok):
    a, b = _word(tok, "a"), _word(tok, "b")
    # only a leading string gets the special tokens; ints go in verbatim
    assert tok.encode_prompt(["a", 1, "b"]) == [CLS, a, SEP, 1, b]
    assert tok.encode_prompt([1, "a"]) == [1, a]
    assert tok.encode_prompt([7, 8, 9]) == [7, 8, 9]
    assert tok.encode_prompt(["a", "b"]) == [CLS, a, SEP, b]
    assert tok.encode_prompt(["a", 1, "b"], add_special=False) == [a, 1, b]
    assert tok.encode_prompt(["a"]) == tok.encode("a")


def test_parse_special(tok):
    parsed = tok.encode_prompt(["a [SEP] b"])
    assert parsed == [CLS, _word(tok, "a"), SEP, _word(tok, "b"), SEP]
    literal = tok.encode_prompt(["a [SEP] b"], parse_special=False)
    assert literal.count(SEP) == 1 and literal[-1] == SEP  # only the template's own [SEP]
    assert literal[2:5] == tok.encode("[", add_special=False) + tok.encode("sep", add_special=False) + \
        tok.encode("]", add_special=False)
    # the parsing instance is not affected by the literal one
    assert tok.encode("[SEP]", add_special=False) == [SEP]


def test_pieces(tok, hf_tok):
    ids = tok.encode("hello world")
    assert tok.pieces(ids) == ["[CLS]", " hello", " world", "[SEP]"]
    ids = tok.encode("unaffable, hello!")
    expected = [t if t in ("[CLS]", "[SEP]") else (t[2:] if t.startswith("##") else " " + t)
                for t in hf_tok.convert_ids_to_tokens(ids)]
    assert tok.pieces(ids) == expected
    assert tok.pieces(ids)[1:4] == [" una", "ffa", "ble"]  # continuation pieces carry no space


def test_decode(tok):
    assert tok.decode(tok.encode("hello world")) == "[CLS] hello world [SEP]"
    for text in ["hello world", "the quick brown fox jumps over the lazy dog", "unaffable antidisestablishmentarianism"]:
        assert tok.decode(tok.encode(text, add_special=False)) == text


def test_truncate_keeps_the_trailing_sep(tok):
    ids = tok.encode("word " * 50)
    assert len(ids) == 52
    cut = tok.truncate(ids, 10)
    assert cut == ids[:9] + [SEP]
    assert tok.truncate(ids, 52) == ids
    assert tok.truncate(ids, 100) == ids
    no_specials = tok.encode("word " * 50, add_special=False)
    assert tok.truncate(no_specials, 10) == no_specials[:10]  # nothing to keep: a plain cut
    assert tok.truncate(ids, 1) == ids[:1]  # no room for the tail


def test_encode_pair_matches_transformers(tok, hf_tok):
    ids, types = tok.encode_pair("what is a cat?", "a cat is a small animal")
    enc = hf_tok("what is a cat?", "a cat is a small animal")
    assert ids == enc["input_ids"]
    assert types == enc["token_type_ids"]
    ids, types = tok.encode_pair("short query", "long document " * 40, max_length=20)
    enc = hf_tok("short query", "long document " * 40, truncation="longest_first", max_length=20)
    assert (ids, types) == (enc["input_ids"], enc["token_type_ids"])


def test_checkpoint_without_tokenizer_json_is_converted(tmp_path, minilm_path, tok):
    for name in ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_path / name, tmp_path / name)
    converted = TextTokenizer(formats.open_checkpoint(tmp_path))
    assert converted.n_vocab == tok.n_vocab
    assert converted.trailing_specials == [SEP]
    for text in TEXTS:
        assert converted.encode(text) == tok.encode(text), text


def test_batched_prompts_match_transformers(tok, hf_tok):
    """One batched call for many mixed prompts gives each prompt transformers' ids, in order."""
    prompts = [[text] for text in TEXTS if text] + [["a", 7, "b c"], [5, "a"], [9, 8]]
    got = tok.encode_prompts(prompts)
    expected = [hf_tok(text)["input_ids"] for text in TEXTS if text]
    a, bc = hf_tok("a")["input_ids"], hf_tok("b c", add_special_tokens=False)["input_ids"]
    expected += [[*a, 7, *bc], [5, *hf_tok("a", add_special_tokens=False)["input_ids"]], [9, 8]]
    assert got == expected
    assert tok.encode_prompts([["a [SEP] b"]], add_special=False, parse_special=False) == [
        hf_tok("a [SEP] b", add_special_tokens=False, split_special_tokens=True)["input_ids"]]
    assert tok.encode_prompts([]) == []


def test_batched_pairs_match_transformers(tok, hf_tok):
    docs = ["a cat is a small animal", "long document " * 40, "x"]
    for max_length in (None, 20):
        got = tok.encode_pairs([("what is a cat?", doc) for doc in docs], max_length=max_length)
        kwargs = {} if max_length is None else {"truncation": "longest_first", "max_length": max_length}
        encs = [hf_tok("what is a cat?", doc, **kwargs) for doc in docs]
        assert got == [(enc["input_ids"], enc["token_type_ids"]) for enc in encs]


@pytest.mark.parametrize("limit", [3, 5, 12])
@pytest.mark.parametrize("text", ["unaffable antidisestablishmentarianism and more words here", "word " * 40])
def test_truncate_left_matches_the_tokenizer_library(tok, minilm_path, text, limit):
    """TEI's truncation_direction Left: `tokenizers` cutting from the left, then adding [CLS]/[SEP]."""
    reference = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(limit, direction="left")
    want = reference.encode(text).ids
    assert tok.truncate(tok.encode(text), limit, "left") == want
    assert tok.leading_specials == [CLS]
    reference.enable_truncation(limit, direction="right")
    assert tok.truncate(tok.encode(text), limit) == reference.encode(text).ids


@pytest.mark.parametrize("text", ["Café naïve 東京 🙂", "Hello World!", "a [SEP] b"])
@pytest.mark.parametrize("add_special", [True, False])
def test_token_spans_are_utf8_byte_offsets(tok, text, add_special):
    """TEI's /tokenize tokens: each non-special token's text is the UTF-8 bytes its offsets cover."""
    spans = tok.token_spans(text, add_special)
    assert [s.id for s in spans] == tok.encode(text, add_special)
    raw = text.encode("utf-8")
    for span in spans:
        if span.special:
            assert (span.start, span.stop) == (None, None)
            assert span.text in ("[CLS]", "[SEP]")
        else:
            assert raw[span.start:span.stop].decode("utf-8") == span.text
    assert [s.special for s in spans] == [s.id in (CLS, SEP) for s in spans]


def test_decode_skip_special(tok):
    ids = tok.encode("Hello World!")
    assert tok.decode(ids) == "[CLS] hello world! [SEP]"
    assert tok.decode(ids, skip_special=True) == "hello world!"
