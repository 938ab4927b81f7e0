"""Tiny random SigLIP checkpoints (SiglipModel with both towers, SiglipTextModel alone) built with transformers.

The tokenizer is built like SigLIP's own: it lower-cases, drops punctuation and collapses whitespace before
a sentencepiece-style (Metaspace) unigram model, appends </s>, and pads with </s> (id 1), 64 tokens per row.
"""
from __future__ import annotations

from pathlib import Path

from tests.engine.helpers import perturb_vectors, train_spiece

CORPUS = [
    "a photo of a cat", "a photo of a dog", "two cats sleeping on a red sofa", "a diagram of a steam engine",
    "quarterly revenue grew twelve percent", "the giant panda is a bear species endemic to china",
    "gravity is a force that attracts two bodies", "machine learning is a field of study",
    "a bowl of ramen with an egg", "the quick brown fox jumps over the lazy dog",
] * 30
TEXT_WIDTH = 64  # SigLIP's text rows
IMAGE_SIZE, PATCH_SIZE = 32, 8


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([
        normalizers.Lowercase(), normalizers.Replace(Regex(r"[^\w\s]"), ""),
        normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=250, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="</s>", unk_token="<unk>",
                                   model_max_length=TEXT_WIDTH)


def _configs(vocab_size: int):
    from transformers import SiglipTextConfig, SiglipVisionConfig

    text = SiglipTextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=TEXT_WIDTH, pad_token_id=1,
                            bos_token_id=None, eos_token_id=1)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
    return text, vision


def make_checkpoint(folder: Path, seed: int = 0, text_only: bool = False) -> Path:
    """A SiglipModel (or, text_only, a SiglipTextModel) with its tokenizer and image processor saved beside it."""
    import torch
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel, SiglipTextModel

    tokenizer = build_tokenizer()
    text, vision = _configs(len(tokenizer))
    torch.manual_seed(seed)
    if text_only:
        model = SiglipTextModel(text).eval()
    else:
        model = SiglipModel(SiglipConfig(text_config=text.to_dict(), vision_config=vision.to_dict())).eval()
    perturb_vectors(model, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if not text_only:
        SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(folder)
    return folder


def make_spiece_checkpoint(folder: Path, seed: int = 1) -> Path:
    """A SiglipTextModel shipped as google/siglip-* are: a SentencePiece spiece.model read by transformers'
    SiglipTokenizer (no tokenizer.json). The unigram model is trained here with sentencepiece."""
    import torch
    from transformers import SiglipTextModel, SiglipTokenizer

    train_spiece(folder, CORPUS + ["Caf\u00e9 na\u00efve r\u00e9sum\u00e9, \u6771\u4eac \uff12\uff10\uff12\uff14!"] * 5, 80)
    tokenizer = SiglipTokenizer(vocab_file=str(folder / "spiece.model"), model_max_length=TEXT_WIDTH)
    text, _ = _configs(tokenizer.vocab_size)
    torch.manual_seed(seed)
    model = SiglipTextModel(text).eval()
    perturb_vectors(model, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
