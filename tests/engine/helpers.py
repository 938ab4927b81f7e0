"""Helpers for the engine tests: start an Engine, the torch reference stack, tiny random BERT checkpoints."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from engine import Engine, EngineOptions
from tests.conftest import minilm_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# MiniLM's tokenizer files, reused by the random checkpoints (vocab 30522).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def start_engine(path: str | os.PathLike, **options) -> Engine:
    """An Engine on `path`, loaded (raises the load error if any). Two BLAS threads unless told otherwise."""
    options.setdefault("threads", 2)
    eng = Engine(EngineOptions(model_path=str(path), **options))
    try:
        eng.wait_loaded(120)
    except BaseException:
        eng.close()
        raise
    return eng


def torch():
    """torch on the CPU with few threads (the engine test set must stay fast on two cores)."""
    import torch as _torch

    _torch.set_num_threads(2)
    return _torch


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def hf_hidden(model, ids: list[int], token_types: bool = True) -> np.ndarray:
    """transformers' last_hidden_state [n, D] for one unpadded input (token types all 0, where the model has them)."""
    t = torch()
    extra = {"token_type_ids": t.zeros(1, len(ids), dtype=t.long)} if token_types else {}
    with t.inference_mode():
        out = model(input_ids=t.tensor([ids]), attention_mask=t.ones(1, len(ids), dtype=t.long), **extra)
    return out.last_hidden_state[0].float().numpy()


def perturb_vectors(model, seed: int) -> None:
    """LayerNorm weights start at 1 and biases at 0: randomize every 1-D parameter so a dropped one shows."""
    t = torch()
    gen = t.Generator().manual_seed(seed)
    with t.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(t.randn(p.shape, generator=gen) * 0.1)


def hf_logit(model, ids: list[int]) -> float:
    t = torch()
    with t.inference_mode():
        return float(model(input_ids=t.tensor([ids]), attention_mask=t.ones(1, len(ids), dtype=t.long)).logits[0, 0])


def hf_rows(model, token_lists: list[list[int]]) -> list[np.ndarray]:
    """hf_hidden per input, for models without token types (XLM-R tokenizers emit none; ModernBERT has none)."""
    return [hf_hidden(model, ids, token_types=False) for ids in token_lists]


def load_hf_model(path: str | os.PathLike, cls_name: str = "AutoModel"):
    import transformers

    t = torch()
    model = getattr(transformers, cls_name).from_pretrained(str(path), dtype=t.float32)
    model.eval()
    return model


def with_minilm_tokenizer(out: Path) -> int:
    """Create `out` with all-MiniLM-L6-v2's WordPiece tokenizer files in it; returns the vocabulary size."""
    out.mkdir(parents=True, exist_ok=True)
    src = minilm_dir()
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    return len(json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"])


def make_random_bert(out: Path, *, hidden_act: str = "gelu", seed: int = 0, initializer_range: float = 0.02,
                     architecture: str = "BertModel", tokenizer_config: dict | None = None,
                     extra_files: dict[str, object] | None = None, max_position_embeddings: int = 512) -> Path:
    """A tiny random BERT saved with save_pretrained (safetensors), with MiniLM's tokenizer files copied in.

    extra_files: relative path -> JSON-able object (or str) written next to the weights.
    """
    t = torch()
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    n_vocab = with_minilm_tokenizer(out)
    t.manual_seed(seed)
    config = BertConfig(vocab_size=n_vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=max_position_embeddings, type_vocab_size=2,
                        hidden_act=hidden_act, initializer_range=initializer_range)
    if architecture == "BertForSequenceClassification":
        config.num_labels = 1
        model = BertForSequenceClassification(config)
    else:
        model = BertModel(config)
    model.eval()
    model.save_pretrained(str(out))
    if tokenizer_config is not None:
        merged = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        merged.update(tokenizer_config)
        (out / "tokenizer_config.json").write_text(json.dumps(merged), encoding="utf-8")
    for rel, content in (extra_files or {}).items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    assert (out / "model.safetensors").is_file()
    return out


def byte_level_bpe(corpus: list[str], specials: list[str], vocab_size: int):
    """A `tokenizers` byte-level BPE (GPT-2 / Qwen / SmolLM style) trained on `corpus`, `specials` added first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


# Varied inputs for the encoder families: one word, punctuation, accents / CJK / emoji, code, the empty text, and
# one of about 150 tokens (past the 128-token reach of MPNet's and T5's relative position buckets).
ENCODER_TEXTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, 東京, Москва, 🙂 and 42 numbers!",
    "def f(x):\n    return x ** 2  # square",
    " ".join(f"Sentence {i} talks about planets, orbits and the reddish dust of Mars." for i in range(10)),
    "",
]


def save_sentence_transformer(backbone: Path, out: Path, *, pooling: str = "mean",
                              dense: tuple[tuple[int, int] | tuple[int, int, bool, bool], ...] = (),
                              normalize: bool = True, prompts: dict[str, str] | None = None, seed: int = 11) -> Path:
    """A transformers folder -> the sentence-transformers folder layout: Transformer, Pooling, Dense modules with
    random weights ((in, out): bias-free, Identity; (in, out, bias, tanh) otherwise), Normalize; `prompts` in
    config_sentence_transformers.json."""
    t = torch()
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    t.manual_seed(seed)
    first = Transformer(str(backbone))
    modules = [first, Pooling(first.get_embedding_dimension(), pooling)]
    for d_in, d_out, bias, tanh in ((*spec, False, False)[:4] for spec in dense):
        modules.append(Dense(d_in, d_out, bias=bias, activation_function=t.nn.Tanh() if tanh else t.nn.Identity()))
    modules += [Normalize()] if normalize else []
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(out))
    return out


def family_hidden(family, folder: Path, ids: list[int]) -> np.ndarray:
    """A family's Model built from `folder`'s config.json and weights, run on one unpadded input -> [n, D]."""
    import mlx.core as mx

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model = family.Model(family.ModelArgs.from_dict(config))
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()))
    return np.array(model(mx.array([ids]), mx.ones((1, len(ids)), dtype=mx.int32))[0])


def sentencepiece_unigram(corpus: list[str], specials: list[str], vocab_size: int, unk: str = "<unk>",
                          template: tuple[str, str] | None = None):
    """A `tokenizers` SentencePiece-style Unigram (T5 / CamemBERT / XLM-R style: whitespace split, Metaspace "▁"
    always prepended) trained on `corpus`, `specials` first (ids 0, 1, ...). template: the (single, pair)
    TemplateProcessing strings over those specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                            unk_token=unk))
    if template is not None:
        used = {t for part in template for t in part.split() if t in specials}
        tok.post_processor = processors.TemplateProcessing(
            single=template[0], pair=template[1], special_tokens=[(t, tok.token_to_id(t)) for t in sorted(used)])
    return tok


def train_spiece(folder: Path, texts: list[str], vocab_size: int) -> Path:
    """folder/spiece.model: a SentencePiece unigram trained on `texts` with T5's / SigLIP's specials (<pad> 0,
    </s> 1, <unk> 2, no <s>); the vocabulary may stay below vocab_size on a small corpus."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(texts), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "spiece"), vocab_size=vocab_size, hard_vocab_limit=False,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
        unk_piece="<unk>", minloglevel=2)
    corpus.unlink()
    (folder / "spiece.vocab").unlink()
    return folder / "spiece.model"
