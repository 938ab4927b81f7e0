"""GGUF architectures written here with the gguf package's GGUFWriter (the converter convert_hf_to_gguf.py is not
on this machine; the gguf package is its tensor-name and metadata-key half), from tiny random transformers models,
named and keyed as llama.cpp's converter writes that architecture: ids equal the HF tokenizer's and the real
llama-server's on the same file, vectors equal transformers' and llama-server's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.engine.helpers import cosine, hf_hidden, perturb_vectors, start_engine, torch
from tests.engine.test_gguf_written import add_bpe_vocabulary, embed_texts, finish

gguf = pytest.importorskip("gguf")

# texts for a byte-level BPE: digits (split one by one or in threes by the pre-tokenizer), newlines, contractions
DECODER_TEXTS = ["hello", "What is the capital of China? The capital of China is Beijing.",
                 "Gravity is a force. " * 6, "Café, naïve, 東京, 🙂 and 1234567 numbers!",
                 "def f(x):\n    return x ** 2  # square\n\n", "it's yes no maybe " * 5 + "Explain gravity."]
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")


def gguf_name(key: str, names: dict[str, str]) -> str:
    """A transformers state-dict key -> its GGUF tensor name, through gguf's own TensorNameMap (the converter's)."""
    base, kind = key.rsplit(".", 1)
    name = names.get_name(base)
    assert name is not None, key
    return f"{name}.{kind}"


def name_map(arch: str, layers: int):
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    return gguf.get_tensor_name_map(arch_id, layers)


def add_tensors(writer, state: dict[str, np.ndarray], arch: str, layers: int, f16: bool = True) -> None:
    """Every weight under its converter name; 2-D ones in F16 (as --outtype f16), vectors F32."""
    names = name_map(arch, layers)
    for key, value in state.items():
        value = value.astype(np.float16 if f16 and value.ndim == 2 else np.float32)
        writer.add_tensor(gguf_name(key, names), value)


def qwen_tokenizer():
    """decoder_fixture's byte-level BPE with Qwen2's own pre-tokenizer regex (one digit per piece) and
    `<|endoftext|>` appended, as gte-Qwen2's tokenizer does."""
    from tokenizers import Regex, pre_tokenizers

    from tests.engine.families.decoder_fixture import tokenizer

    tok = tokenizer(append_eos=True)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def write_qwen2_gguf(path: Path):
    """A tiny random Qwen2Model (gte-Qwen2's layout: biased q/k/v, GQA, last-token pooling on the appended
    `<|endoftext|>`) as the converter writes `qwen2`. Returns (transformers model, HF tokenizer)."""
    t = torch()
    from transformers import Qwen2Config, Qwen2Model

    from tests.engine.families.qwen3_fixture import QWEN3_SPECIALS

    tok = qwen_tokenizer()
    t.manual_seed(4)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=96, max_position_embeddings=512,
                         rope_theta=1_000_000.0, initializer_range=0.1)
    model = Qwen2Model(config).eval()
    perturb_vectors(model, 4)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_pooling_type(gguf.PoolingType.LAST)
    vocab = add_bpe_vocabulary(writer, tok, "qwen2", QWEN3_SPECIALS)
    writer.add_eos_token_id(vocab["<|endoftext|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(True)
    add_tensors(writer, {k: v.numpy() for k, v in model.state_dict().items()}, "qwen2", 2)
    finish(writer)
    return model, tok


def test_qwen2_gguf_ids_and_vectors_equal_transformers_and_llama_server(tmp_path):
    from tests.peer_llama import LlamaServer

    path = tmp_path / "tiny-qwen2-last-f16.gguf"
    reference, tok = write_qwen2_gguf(path)
    ids, ours = embed_texts(path, DECODER_TEXTS)
    assert ids == [tok(s).input_ids for s in DECODER_TEXTS]
    assert all(row[-1] == tok.convert_tokens_to_ids("<|endoftext|>") for row in ids)
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(reference, token_ids, token_types=False)[-1]) >= 0.9999  # F16 weights
    with LlamaServer(path, "--embedding") as llama:
        assert ids == [llama.tokenize(s) for s in DECODER_TEXTS]
        theirs = llama.embeddings(DECODER_TEXTS)
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LFM2_BOS = "<|im_start|>"


def lfm2_tokenizer():
    """decoder_fixture's byte-level BPE with LFM2's pre-tokenizer regex (digits in threes) and a BOS first, as
    LFM2's tokenizer (its `<|startoftext|>`; here the fixture's <|im_start|>)."""
    from tokenizers import Regex, pre_tokenizers, processors

    from tests.engine.families.decoder_fixture import tokenizer

    tok = tokenizer()
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bos = tok.convert_tokens_to_ids(LFM2_BOS)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{LFM2_BOS} $A", pair=f"{LFM2_BOS} $A $B", special_tokens=[(LFM2_BOS, bos)])
    return tok


def write_lfm2_gguf(path: Path, bidirectional: bool):
    """A tiny random Lfm2Model (conv, attention, conv, attention) as the converter writes `lfm2`: per-layer
    head_count_kv (0 on conv layers), the sized FFN width, `shortconv.l_cache`, the conv weight squeezed to [H, L];
    bidirectional (Lfm2BidirectionalModel, LFM2.5-Embedding): `attention.causal` false and CLS pooling, else
    last-token pooling. F32. Returns (transformers reference, HF tokenizer)."""
    t = torch()
    from transformers import Lfm2Config, Lfm2Model

    from tests.engine.families.qwen3_fixture import QWEN3_SPECIALS
    from tests.engine.families.test_lfm2 import BIDIRECTIONAL, BidirectionalReference

    tok = lfm2_tokenizer()
    t.manual_seed(14)
    config = Lfm2Config(vocab_size=len(tok), hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=512, initializer_range=0.1, rope_theta=1_000_000.0,
                        pad_token_id=tok.pad_token_id, **BIDIRECTIONAL)
    model = Lfm2Model(config).eval()
    perturb_vectors(model, 14)
    args_ff = int(2 * config.intermediate_size / 3)  # transformers' Lfm2MLP sizing, as the converter writes it
    args_ff = config.block_multiple_of * ((int(config.block_ffn_dim_multiplier * args_ff) + config.block_multiple_of
                                           - 1) // config.block_multiple_of)
    assert model.layers[0].feed_forward.w1.weight.shape[0] == args_ff
    writer = gguf.GGUFWriter(str(path), "lfm2")
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_block_count(4)
    writer.add_head_count(4)
    writer.add_head_count_kv([2 if kind == "full_attention" else 0 for kind in config.layer_types])
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(tok))
    writer.add_shortconv_l_cache(config.conv_L_cache)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_feed_forward_length(args_ff)
    if bidirectional:
        writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.CLS if bidirectional else gguf.PoolingType.LAST)
    vocab = add_bpe_vocabulary(writer, tok, "lfm2", QWEN3_SPECIALS)
    writer.add_bos_token_id(vocab[LFM2_BOS])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    state = {}
    for key, value in model.state_dict().items():
        value = value.numpy()
        state["model." + key] = value.squeeze(1) if "conv.conv" in key else value  # as LFM2ColBertModel names it
    add_tensors(writer, state, "lfm2", 4, f16=False)
    finish(writer)
    return (BidirectionalReference(model) if bidirectional else model), tok


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
def test_lfm2_gguf_ids_and_vectors_equal_transformers_and_llama_server(tmp_path, bidirectional):
    from tests.engine.families.decoder_fixture import reference_hidden
    from tests.peer_llama import LlamaServer

    path = tmp_path / "tiny-lfm2-f32.gguf"
    reference, tok = write_lfm2_gguf(path, bidirectional)
    ids, ours = embed_texts(path, DECODER_TEXTS)
    assert ids == [tok(s).input_ids for s in DECODER_TEXTS]
    for row, token_ids in zip(ours, ids, strict=True):
        hidden = reference_hidden(reference, token_ids)
        assert cosine(row, hidden[0] if bidirectional else hidden[-1]) >= 0.9999
    if bidirectional:  # the first token's vector sees the whole text (read causally it would be the same for all)
        assert cosine(ours[0], ours[1]) < 0.99
    with LlamaServer(path, "--embedding") as llama:
        assert ids == [llama.tokenize(s) for s in DECODER_TEXTS]
        theirs = llama.embeddings(DECODER_TEXTS)
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999


def test_modern_bert_reranker_gguf_scores_equal_its_head_and_llama_server(tmp_path):
    """A converted ModernBertForSequenceClassification: `cls` (dense, no bias as classifier_bias false), `cls.norm`
    (no bias), `cls.output`, no pooling_type. llama-server scores `[CLS] q [SEP] [SEP] d [SEP]` as
    cls.output(norm(gelu(cls(mean(h))))), the mean over every token (probed here against the other readings: first
    token, tanh, no norm, norm first, other pair layouts). Ours equals that head on transformers' hidden states of
    the same ids within 1e-3 (exact GELU there, the tanh approximation here) and llama-server's /rerank within 3e-3:
    measured 2.7e-3 on these strongly non-linear random weights, still 1.7e-3 with tanh GELU on both sides (the
    rest is llama.cpp's own arithmetic, not traced further)."""
    from engine import Pooling
    from tests.engine.test_gguf_written import write_modernbert_gguf
    from tests.peer_llama import LlamaServer

    rng = np.random.default_rng(11)
    head = {"cls.weight": rng.normal(0, 0.2, (64, 64)).astype(np.float32),
            "cls.norm.weight": rng.normal(1, 0.2, 64).astype(np.float32),
            "cls.output.weight": rng.normal(0, 0.2, (1, 64)).astype(np.float32),
            "cls.output.bias": np.array([0.1], np.float32)}
    path = tmp_path / "tiny-modernbert-reranker-f32.gguf"
    reference, tokenizer = write_modernbert_gguf(path, head)
    query = "What is the capital of China?"
    docs = ["The capital of China is Beijing.", "Gravity is a force. " * 4, "yes no maybe", "Machine learning."]
    eng = start_engine(path, pooling=Pooling.RANK)
    try:
        pairs = eng.tokenizer.encode_pairs([(query, doc) for doc in docs])
        got = eng.rerank(query, docs).scores
    finally:
        eng.close(wait=True)
    cls, sep = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    assert pairs[0][0] == [cls, *tokenizer.encode(query, add_special_tokens=False), sep, sep,
                           *tokenizer.encode(docs[0], add_special_tokens=False), sep]
    t = torch()
    for score, (ids, _) in zip(got, pairs, strict=True):
        dense = t.from_numpy(head["cls.weight"] @ hf_hidden(reference, ids, token_types=False).mean(axis=0))
        x = t.nn.functional.gelu(dense).numpy()
        x = (x - x.mean()) / np.sqrt(x.var() + reference.config.norm_eps) * head["cls.norm.weight"]
        want = float((head["cls.output.weight"] @ x + head["cls.output.bias"])[0])
        assert abs(score - want) < 1e-3
    with LlamaServer(path, "--reranking") as llama:
        theirs = llama.rerank(query, docs)
    np.testing.assert_allclose(got, theirs, atol=3e-3)
    assert np.argsort(got).tolist() == np.argsort(theirs).tolist()


def test_an_architecture_not_read_is_refused_naming_those_that_are():
    from engine.errors import UnsupportedCheckpoint
    from engine.loading.gguf.arch import for_architecture

    with pytest.raises(UnsupportedCheckpoint) as caught:
        for_architecture("bloom", "m.gguf")
    message = str(caught.value)
    assert message.startswith("m.gguf: GGUF architecture 'bloom' is not supported (supported: ")
    read = ("bert", "eurobert", "jina-bert-v2", "lfm2", "llama-embed", "mistral3", "modern-bert", "neo-bert",
            "nomic-bert-moe", "qwen2", "qwen3", "t5encoder")
    assert all(name in message for name in read)
