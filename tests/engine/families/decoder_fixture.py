"""Tiny random decoder checkpoints (Llama, Mistral, Qwen2/3, Gemma3) and the checks every decoder family shares.

Each checkpoint uses the small byte-level BPE tokenizer of qwen3_fixture (600 tokens, Qwen's special tokens),
optionally appending <|endoftext|> to every input as Qwen3-Embedding's tokenizer does. Weights are random with
every 1-D parameter (norms, biases) perturbed so a dropped or misplaced one shows.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from engine import Pooling
from tests.engine.families.qwen3_fixture import build_tokenizer
from tests.engine.helpers import cosine, perturb_vectors, start_engine, torch

EOS = "<|endoftext|>"
# Varied lengths in one batch: 2 to ~70 tokens, ASCII, digits, accents, CJK, emoji, code.
TEXTS = [
    "hello",
    "What is the capital of China? The capital of China is Beijing.",
    "Gravity is a force. " * 6,
    "Café, naïve, 東京, 🙂 and 42 numbers!",
    "def f(x):\n    return x ** 2  # square",
    "yes no maybe " * 9 + "Explain gravity.",
]
LONG_TEXTS = [*TEXTS, "Gravity is a force. " * 20]  # the last one is ~100 tokens
MIN_COSINE = 0.99999
BATCH_ATOL = 1e-5
# plus a few float32 ulps of the value itself: pooled hidden states are not normalized (SmolLM2's reach 25, where
# rounding over 30 layers differs by 0.9-1.3e-5 between a batch and a lone pass whatever the softmax's exp)
BATCH_RTOL = 1e-6


def tokenizer(append_eos: bool = False):
    """The shared BPE tokenizer; append_eos: every encoding ends with <|endoftext|> (Qwen3-Embedding)."""
    from tokenizers import processors

    tok = build_tokenizer()
    if append_eos:
        eos_id = tok.convert_tokens_to_ids(EOS)
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)])
    return tok


def save_random(folder: Path, model_cls: str, config_cls: str, *, seed: int = 0, append_eos: bool = False,
                config_edits: dict | None = None, files: dict[str, object] | None = None, **config):
    """Build transformers' `model_cls(config_cls(**config))` with random weights, save it with the tokenizer;
    config_edits are written into the saved config.json afterwards (spellings transformers would not write).
    Returns (folder, the torch model in eval mode)."""
    t = torch()
    import transformers

    tok = tokenizer(append_eos)
    t.manual_seed(seed)
    settings = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=512,
                    pad_token_id=tok.pad_token_id, initializer_range=0.1)
    settings.update(config)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**settings))
    perturb_vectors(model, seed)
    model.eval()
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    if config_edits:
        path = folder / "config.json"
        saved = json.loads(path.read_text(encoding="utf-8"))
        saved.update(config_edits)
        path.write_text(json.dumps(saved), encoding="utf-8")
    write_files(folder, files or {})
    return folder, model


def write_files(folder: Path, files: dict[str, object]) -> None:
    """relative path -> JSON-able object (or str), written under folder."""
    for rel, content in files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")


def token_vectors(folder: Path, texts: list[str]) -> tuple[list[list[int]], list[np.ndarray]]:
    """`texts` tokenized by the engine's own tokenizer and embedded in one padded batch with pooling none:
    (each text's ids, its per-token vectors); the longest must be ~100 tokens."""
    eng = start_engine(folder, pooling=Pooling.NONE)
    try:
        lists = [eng.encode_prompt([text]) for text in texts]
        assert max(map(len, lists)) >= 100
        return lists, eng.embed(lists).vectors
    finally:
        eng.close()


def st_modules(*modules: tuple[str, str]) -> list[dict]:
    """A sentence-transformers modules.json: the Transformer, then each (folder, module type)."""
    return [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            *({"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind) in enumerate(modules, 1))]


def pooled_layout(mode: str, prompts: dict[str, str] | None = None) -> dict[str, object]:
    """save_random's `files` for a sentence-transformers export pooling by `mode` (cls, mean, ...), with prompts."""
    files: dict[str, object] = {
        "modules.json": st_modules(("1_Pooling", "sentence_transformers.models.Pooling")),
        "1_Pooling/config.json": {"word_embedding_dimension": 64, "pooling_mode": mode}}
    if prompts is not None:
        files["config_sentence_transformers.json"] = {"prompts": prompts, "default_prompt_name": None}
    return files


def token_lists(folder: Path, texts: list[str] = TEXTS) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    return [tok(text).input_ids for text in texts]


def reference_hidden(model, ids: list[int]) -> np.ndarray:
    """The reference's final normed hidden states [n, D] for one unpadded input."""
    t = torch()
    backbone = getattr(model, "model", model)
    with t.inference_mode():
        out = backbone(input_ids=t.tensor([ids]), attention_mask=t.ones(1, len(ids), dtype=t.long))
    return out.last_hidden_state[0].double().numpy()


def check_tokens_match(folder: Path, model, texts: list[str] = TEXTS, **options) -> None:
    """Every token's hidden state from one padded batch equals the reference's (cosine and absolute)."""
    lists = token_lists(folder, texts)
    eng = start_engine(folder, pooling=Pooling.NONE, **options)
    try:
        ours = eng.embed(lists).vectors
    finally:
        eng.close()
    for ids, got in zip(lists, ours, strict=True):
        ref = reference_hidden(model, ids)
        assert got.shape == ref.shape
        worst = min(cosine(a, b) for a, b in zip(got, ref, strict=True))
        assert worst >= MIN_COSINE, (len(ids), worst)
        np.testing.assert_allclose(got, ref, atol=1e-4 * max(1.0, float(np.abs(ref).max())), rtol=1e-4)


def check_pooled(eng, folder: Path, model, pooling: Pooling, texts: list[str] = TEXTS) -> list[np.ndarray]:
    """Pooled vectors of one batch against the reference pooled the same way; returns ours."""
    lists = token_lists(folder, texts)
    ours = eng.embed(lists).vectors
    for ids, got in zip(lists, ours, strict=True):
        ref = reference_hidden(model, ids)
        expected = ref.mean(axis=0) if pooling is Pooling.MEAN else ref[-1]
        assert cosine(got, expected) >= MIN_COSINE
    return ours


def check_batch_invariant(eng, folder: Path, texts: list[str] = TEXTS) -> None:
    """A vector does not depend on the batch it was computed in (alone vs. with every other text)."""
    lists = token_lists(folder, texts)
    together = eng.embed(lists).vectors
    for ids, vec in zip(lists, together, strict=True):
        alone = eng.embed([ids]).vectors[0]
        np.testing.assert_allclose(vec, alone, atol=BATCH_ATOL, rtol=BATCH_RTOL)
