"""A tiny random Qwen3ForCausalLM with a small byte-level BPE tokenizer carrying Qwen3's special tokens."""
from __future__ import annotations

from pathlib import Path

# Qwen3-Reranker's model card recipe, written out independently of templates/qwen3_reranker.jinja
CARD_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
               'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CORPUS = [
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided.",
    'Note that the answer can only be "yes" or "no".', "system user assistant Instruct Query Document",
    "Given a web search query, retrieve relevant passages that answer the query",
    "What is the capital of China? The capital of China is Beijing. Gravity is a force.",
    "yes no yes no yes no maybe", "Explain gravity. Machine learning is a field of study.",
] * 20


def build_tokenizer(extra_specials: tuple[str, ...] = ()):
    """extra_specials: more special tokens after Qwen3's (Qwen3-VL's vision markers)."""
    from transformers import PreTrainedTokenizerFast

    from tests.engine.helpers import byte_level_bpe

    tok = byte_level_bpe(CORPUS, QWEN3_SPECIALS + list(extra_specials), 600)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def make_checkpoint(folder: Path, tie: bool = True, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=2048,
                         tie_word_embeddings=tie, pad_token_id=tokenizer.pad_token_id)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
