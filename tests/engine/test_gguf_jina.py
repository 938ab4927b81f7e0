"""`jina-bert-v2` GGUFs (jina-embeddings-v2-*, jina-reranker-v1-*), which have no transformers reference: written
here with the gguf package's writer in llama.cpp's converter layout (JinaBertV2Model, conversion/bert.py at 3f545bec,
names through gguf's own tensor-name map) from random weights, and checked against the real llama-server on the
same file: token ids equal, vectors cosine >= 0.99999, scores within 1e-3, identity as /v1/models and /props report it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests

from tests.engine.helpers import cosine, start_engine
from tests.engine.test_gguf_written import (
    add_bpe_vocabulary,
    add_encoder_specials,
    add_minilm_vocabulary,
    finish,
    train_byte_level_bpe,
)

gguf = pytest.importorskip("gguf")

HIDDEN, HEADS, FF, LAYERS = 96, 6, 128, 2  # 6 heads: both of ggml's ALiBi slope ranges (4 + 2)
TEXTS = ["hello", "The quick brown fox jumps over the lazy dog.", "Gravity is a force. " * 12,
         "Café, naïve, 東京 and 1234567 numbers!", "Machine learning is a field of study in artificial intelligence."]
# what the three checkpoint variants add to the shared JinaBert block (HF key of layer {i} -> shape), named as the
# checkpoints name them so gguf's tensor-name map gives the converter's GGUF names
VARIANTS = {
    # jina-embeddings-v2-base-en: `gated_layers` holds [gate; up], written merged as ffn_up (GEGLU)
    "geglu": {"mlp.gated_layers.weight": (2 * FF, HIDDEN)},
    # jina-embeddings-v2-base-code/-de: whole-row q/k norms, the second attention norm; and a conversion from
    # before llama.cpp merged the gate (ffn_up + ffn_gate)
    "split-qk-norm": {"mlp.gated_layers_v.weight": (FF, HIDDEN), "mlp.gated_layers_w.weight": (FF, HIDDEN),
                      "attention.self.layer_norm_q.weight": (HIDDEN,), "attention.self.layer_norm_q.bias": (HIDDEN,),
                      "attention.self.layer_norm_k.weight": (HIDDEN,), "attention.self.layer_norm_k.bias": (HIDDEN,),
                      "layer_norm_1.weight": (HIDDEN,), "layer_norm_1.bias": (HIDDEN,)},
    # a non-gated checkpoint (feed_forward_type "original", e.g. German_Semantic_V3): plain GELU with a bias
    "plain": {"intermediate.dense.weight": (FF, HIDDEN), "intermediate.dense.bias": (FF,)},
}
BLOCK = {"attention.self.query.weight": (HIDDEN, HIDDEN), "attention.self.query.bias": (HIDDEN,),
         "attention.self.key.weight": (HIDDEN, HIDDEN), "attention.self.key.bias": (HIDDEN,),
         "attention.self.value.weight": (HIDDEN, HIDDEN), "attention.self.value.bias": (HIDDEN,),
         "attention.output.dense.weight": (HIDDEN, HIDDEN), "attention.output.dense.bias": (HIDDEN,),
         "attention.output.LayerNorm.weight": (HIDDEN,), "attention.output.LayerNorm.bias": (HIDDEN,),
         "mlp.wo.weight": (HIDDEN, FF), "mlp.wo.bias": (HIDDEN,),
         "mlp.layernorm.weight": (HIDDEN,), "mlp.layernorm.bias": (HIDDEN,)}


def random_weight(key: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Norm weights near 1, everything else small and centred: a well-conditioned random checkpoint."""
    if key.endswith("weight") and len(shape) == 1:
        return rng.normal(1.0, 0.1, shape).astype(np.float32)
    return rng.normal(0.0, 0.02 if key.endswith("bias") else 0.08, shape).astype(np.float32)


def write_jina_bert_gguf(path: Path, variant: str, vocab: str = "wpm", classifier: bool = False,
                         f16: bool = False) -> dict:
    """A tiny random JinaBert as the converter writes `jina-bert-v2`: no position table, two token types, every
    2-D weight but the token types F16 when f16 (--outtype f16), vectors F32. vocab "wpm": all-MiniLM's WordPiece (as
    jina-embeddings-v2-base-en's BertTokenizer), mean pooling; "bpe": a byte-level BPE with pre `jina-v1-en` and
    `<s> … </s>` (jina-reranker-v1's RobertaTokenizer conversion). classifier: jina-reranker-v1's
    `classifier` (hidden -> 1) as the converter names it, `cls`, and no pooling_type. Returns the HF
    tokenizer for "bpe" (else None)."""
    rng = np.random.default_rng(sum(map(ord, variant)) + classifier)
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "jina-bert-v2")
    names = gguf.get_tensor_name_map(arch_id, LAYERS)
    state = {"embeddings.word_embeddings.weight": None, "embeddings.token_type_embeddings.weight": (2, HIDDEN),
             "embeddings.LayerNorm.weight": (HIDDEN,), "embeddings.LayerNorm.bias": (HIDDEN,)}
    for i in range(LAYERS):
        state.update({f"encoder.layer.{i}.{k}": shape for k, shape in {**BLOCK, **VARIANTS[variant]}.items()})
    if variant == "plain":  # its down projection and last norm carry BertOutput's names
        for i in range(LAYERS):
            state[f"encoder.layer.{i}.output.dense.weight"] = state.pop(f"encoder.layer.{i}.mlp.wo.weight")
            state[f"encoder.layer.{i}.output.dense.bias"] = state.pop(f"encoder.layer.{i}.mlp.wo.bias")
            state[f"encoder.layer.{i}.output.LayerNorm.weight"] = state.pop(f"encoder.layer.{i}.mlp.layernorm.weight")
            state[f"encoder.layer.{i}.output.LayerNorm.bias"] = state.pop(f"encoder.layer.{i}.mlp.layernorm.bias")
    writer = gguf.GGUFWriter(str(path), "jina-bert-v2")
    writer.add_context_length(8192)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_token_type_count(2)
    tokenizer = None
    if vocab == "wpm":
        add_minilm_vocabulary(writer)
        n_vocab = 30522
    else:
        tokenizer = train_byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        ids = add_bpe_vocabulary(writer, tokenizer, "jina-v1-en", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        add_encoder_specials(writer, ids["<s>"], ids["</s>"], ids["<pad>"], ids["<unk>"])
        n_vocab = len(ids)
    if not classifier:
        writer.add_pooling_type(gguf.PoolingType.MEAN)
    state["embeddings.word_embeddings.weight"] = (n_vocab, HIDDEN)
    if classifier:
        state.update({"classifier.weight": (1, HIDDEN), "classifier.bias": (1,)})
    for key, shape in state.items():
        value = random_weight(key, shape, rng)
        base, kind = key.rsplit(".", 1)
        name = names.get_name(base)
        assert name is not None, key
        half = f16 and value.ndim == 2 and name != "token_types"  # the converter keeps token types in F32
        writer.add_tensor(f"{name}.{kind}", value.astype(np.float16) if half else value)
    finish(writer)
    return tokenizer


def llama_identity(llama) -> dict:
    """llama-server's /v1/models meta fields and /props special tokens."""
    meta = requests.get(llama.base + "/v1/models", timeout=30).json()["data"][0]["meta"]
    props = requests.get(llama.base + "/props", timeout=30).json()
    return {**{k: meta[k] for k in ("n_vocab", "n_embd", "n_ctx_train", "n_params", "size", "ftype")},
            "bos_token": props["bos_token"], "eos_token": props["eos_token"]}


def identity_of(info) -> dict:
    """Ours, from the engine's ModelInfo (what our /v1/models meta and /props render)."""
    return {"n_vocab": info.n_vocab, "n_embd": info.n_embd, "n_ctx_train": info.n_ctx_train,
            "n_params": info.n_params, "size": info.size_bytes, "ftype": info.ftype,
            "bos_token": info.bos_token, "eos_token": info.eos_token}


def embeddings_equal_llama_servers(path: Path, ftype: str) -> None:
    """Our engine and the real llama-server on the same embedding GGUF: ids equal, /v1/models meta equal, vectors
    cosine >= 0.99999 (measured 1 - 1e-7 on these files; a jina-bert-v2 read without its ALiBi bias gives
    1 - 4e-4, so the bar is set tighter than the issue's 0.9999), and the random model tells texts apart."""
    from tests.peer_llama import LlamaServer

    eng = start_engine(path, max_seq=128)  # warm short widths only (ALiBi's bias is dense)
    try:
        ids = [eng.encode_prompt([s]) for s in TEXTS]
        ours = eng.embed(ids).vectors
        identity = identity_of(eng.info)
    finally:
        eng.close(wait=True)
    assert identity["ftype"] == ftype
    with LlamaServer(path, "--embedding") as llama:
        assert ids == [llama.tokenize(s) for s in TEXTS]
        theirs = llama.embeddings(TEXTS)
        theirs_identity = llama_identity(llama)
    assert identity == theirs_identity
    assert min(cosine(a, b) for a, b in zip(ours, theirs, strict=True)) >= 0.99999
    assert cosine(ours[2], ours[4]) < 0.99


@pytest.mark.parametrize("variant,f16", [("geglu", True), ("split-qk-norm", False), ("plain", False)])
def test_jina_bert_v2_gguf_ids_vectors_and_identity_equal_llama_servers(tmp_path, variant, f16):
    path = tmp_path / f"tiny-jina-bert-v2-{variant}.gguf"
    write_jina_bert_gguf(path, variant, f16=f16)
    embeddings_equal_llama_servers(path, "F16" if f16 else "all F32")


def test_jina_reranker_v1_gguf_scores_equal_llama_servers(tmp_path):
    """jina-reranker-v1's layout: a `cls` classifier (no cls.output, the pooler dropped), a BPE vocabulary with
    pre `jina-v1-en`: llama-server scores `<s> q </s> </s> d </s>` as tanh(cls(h_<s>)), raw."""
    from engine import Pooling
    from tests.peer_llama import LlamaServer

    path = tmp_path / "tiny-jina-reranker-v1-f32.gguf"
    tokenizer = write_jina_bert_gguf(path, "geglu", vocab="bpe", classifier=True)
    query = "Machine learning is"
    docs = ["A machine is a physical system that uses power to apply forces.", "Gravity is a force. " * 4,
            "Machine learning is a field of study in artificial intelligence.", "yes no maybe", "Paris, capitale."]
    eng = start_engine(path, pooling=Pooling.RANK, max_seq=128)
    try:
        assert eng.info.is_reranker
        pairs = eng.tokenizer.encode_pairs([(query, doc) for doc in docs])
        got = eng.rerank(query, docs).scores
        identity = identity_of(eng.info)
    finally:
        eng.close(wait=True)
    s, e = tokenizer.convert_tokens_to_ids(["<s>", "</s>"])
    assert pairs[0][0] == [s, *tokenizer.encode(query), e, e, *tokenizer.encode(docs[0]), e]
    with LlamaServer(path, "--reranking") as llama:
        theirs = llama.rerank(query, docs)
        theirs_identity = llama_identity(llama)
    assert identity == theirs_identity
    assert max(abs(a) for a in theirs) < 1 and np.ptp(theirs) > 0.05  # tanh'd, and told apart
    np.testing.assert_allclose(got, theirs, atol=1e-3)  # measured 4.7e-4 (erf GELU here, ggml's table there)
