"""The local GGUFs served in place of the files llama.cpp's test presets download (conftest.py LOCAL_MODELS)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

# stories260K's shape of file: a `llama` decoder with a SentencePiece (`llama`) vocabulary, BOS 1 added, byte
# fallback; here 2 layers of width 64 with random weights, the vocabulary trained on this corpus
CORPUS = [
    "What is the capital of France? Paris is the capital of France.",
    "This is a test string. This is another test, with a few more words in it.",
    "Once upon a time there was a little girl who liked to play in the garden with her dog.",
    "The quick brown fox jumps over the lazy dog; the lazy dog sleeps in the sun.",
    "I believe the meaning of life is to learn, to love and to laugh.",
]
WIDTH, LAYERS, HEADS, KV_HEADS, FF = 64, 2, 4, 2, 128


def write_tiny_jina_reranker_gguf(path: Path) -> Path:
    """jina-reranker-v1-tiny-en's shape of file, F16 as the preset's: `jina-bert-v2` with its classifier as `cls`
    and a `jina-v1-en` byte-level BPE vocabulary, random weights (tests/engine/test_gguf_jina.py's writer)."""
    from tests.engine.test_gguf_jina import write_jina_bert_gguf

    write_jina_bert_gguf(path, "geglu", vocab="bpe", classifier=True, outtype="f16")
    return path


def _spm_vocabulary(folder: Path):
    """A SentencePiece BPE model as Llama 2's and stories260K's are trained: <unk> 0, <s> 1, </s> 2, byte
    fallback, no normalization, a dummy prefix."""
    import sentencepiece

    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 4), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "tokenizer"), vocab_size=420, hard_vocab_limit=False,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    return sentencepiece.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))


def write_tiny_llama_spm_gguf(path: Path) -> Path:
    """A tiny random `llama` GGUF with its vocabulary written as llama.cpp's converter writes a SentencePiece one
    (`_create_vocab_sentencepiece`: pieces, scores, token types), F32, the output head tied to the embeddings."""
    import gguf

    from tests.engine.test_gguf_written import finish

    sp = _spm_vocabulary(path.parent)
    n_vocab = sp.get_piece_size()
    types = [gguf.TokenType.UNKNOWN if sp.is_unknown(i) else gguf.TokenType.CONTROL if sp.is_control(i)
             else gguf.TokenType.UNUSED if sp.is_unused(i) else gguf.TokenType.BYTE if sp.is_byte(i)
             else gguf.TokenType.NORMAL for i in range(n_vocab)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(2048)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(WIDTH // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([sp.id_to_piece(i) for i in range(n_vocab)])
    writer.add_token_scores([sp.get_score(i) for i in range(n_vocab)])
    writer.add_token_types([int(t) for t in types])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    rng = np.random.default_rng(260)
    head = WIDTH // HEADS

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, WIDTH))
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(WIDTH, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(WIDTH, WIDTH))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(KV_HEADS * head, WIDTH))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(KV_HEADS * head, WIDTH))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(WIDTH, WIDTH))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(WIDTH, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(FF, WIDTH))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(FF, WIDTH))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(WIDTH, FF))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, np.float32))
    finish(writer)
    return path
