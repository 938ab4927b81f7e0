"""engine/families/jina_embeddings_v3.py against transformers' JinaEmbeddingsV3Model on the same random weights
(torch CPU, fp32), in transformers' layout and in Jina's remote-code layout (XLMRobertaLoRA) with task adapters.

transformers has the trunk but not the task LoRA adapters (its JinaEmbeddingsV3Model has none, and peft is not
installed), so the adapters' reference is Jina's LoRAParametrization as published, computed here in torch: a
linear weight W + (alpha / rank) * B[t] @ A[t], an embedding table W + (alpha / rank) * A[t] @ B[t], loaded into
transformers' model as its weights. Tiny (hidden 64, 3 layers, rotary base 1000 so ~100 tokens wrap the fast
pairs) on all-MiniLM-L6-v2's tokenizer; mean pooling and the tasks' instructions as prompts.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine import Pooling
from engine.errors import UnsupportedCheckpoint
from engine.families import jina_embeddings_v3 as jina
from engine.loading import formats, registry
from tests.engine.families.decoder_fixture import pooled_layout, token_vectors, write_files
from tests.engine.helpers import cosine, hf_hidden, perturb_vectors, start_engine, torch, with_minilm_tokenizer

TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
INSTRUCTIONS = {"retrieval.query": "Represent the query for retrieving evidence documents: ",
                "retrieval.passage": "Represent the document for retrieval: ", "separation": "",
                "classification": "", "text-matching": ""}
TEXTS = ["hello", "what is rotary position embedding?", "a " * 100 + "b",
         "Rotary embeddings rotate query and key pairs by an angle that grows with the position. " * 2]
RANK, ALPHA, LAYERS = 4, 2.0, 3
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """transformers' JinaEmbeddingsV3Model, saved in its layout with a mean-pooling sentence-transformers layout."""
    t = torch()
    import transformers

    folder = tmp_path_factory.mktemp("jina_v3")
    vocab = with_minilm_tokenizer(folder)
    t.manual_seed(51)
    config = transformers.JinaEmbeddingsV3Config(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, intermediate_size=96,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, initializer_range=0.2, pad_token_id=0)
    model = transformers.JinaEmbeddingsV3Model(config)
    perturb_vectors(model, 51)
    model.eval()
    model.save_pretrained(str(folder))
    write_files(folder, pooled_layout("mean", INSTRUCTIONS))
    return folder, model


def token_lists(eng) -> list[list[int]]:
    out = [eng.encode_prompt([text]) for text in TEXTS]
    assert max(map(len, out)) >= 100
    return out


def test_transformers_layout_matches_tokens_pooling_and_batch(hf):
    folder, model = hf
    ckpt = formats.open_checkpoint(folder)
    assert registry.family_name(ckpt) == "jina_embeddings_v3" and registry.kind_of(ckpt) == registry.EMBEDDER
    for ids, got in zip(*token_vectors(folder, TEXTS), strict=True):
        expected = hf_hidden(model, ids)
        assert min(cosine(a, b) for a, b in zip(got, expected, strict=True)) >= MIN_COSINE
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    eng = start_engine(folder)
    try:
        assert eng.info.pooling is Pooling.MEAN
        name = "retrieval.query"
        ours = eng.embed_prompts(eng.format_prompts([[t] for t in TEXTS], prompt_name=name)).vectors
        for text, got in zip(TEXTS, ours, strict=True):
            ids = eng.encode_prompt([INSTRUCTIONS[name] + text])
            assert cosine(got, hf_hidden(model, ids).mean(axis=0)) >= MIN_COSINE
        lists = token_lists(eng)
        together = eng.embed(lists).vectors
        for ids, vec in zip(lists, together, strict=True):
            np.testing.assert_allclose(vec, eng.embed([ids]).vectors[0], rtol=0, atol=1e-5)
    finally:
        eng.close()


def remote_layout(hf_folder: Path, model, out: Path, task: str | None) -> dict[str, np.ndarray]:
    """The same trunk in Jina's remote-code names, every Linear and Embedding parametrized with random task
    adapters; returns the merged weights of `task` in transformers' names (the reference's)."""
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(52)
    remote, merged = {}, dict(state)

    def adapt(hf_key: str, remote_key: str, embedding: bool = False) -> None:
        weight = state[hf_key]
        rows, cols = weight.shape
        if embedding:  # A [tasks, vocab, rank], B [tasks, rank, dim]
            a = rng.standard_normal((len(TASKS), rows, RANK)).astype(np.float32) * 0.1
            b = rng.standard_normal((len(TASKS), RANK, cols)).astype(np.float32) * 0.1
        else:  # A [tasks, rank, in], B [tasks, out, rank]
            a = rng.standard_normal((len(TASKS), RANK, cols)).astype(np.float32) * 0.1
            b = rng.standard_normal((len(TASKS), rows, RANK)).astype(np.float32) * 0.1
        base = f"roberta.{remote_key}.parametrizations.weight."
        remote.update({base + "original": weight, base + "0.lora_A": a, base + "0.lora_B": b})
        if task is not None:
            i = TASKS.index(task)
            merged[hf_key] = weight + (ALPHA / RANK) * (a[i] @ b[i] if embedding else b[i] @ a[i])

    for name in ("word_embeddings", "token_type_embeddings"):
        adapt(f"embeddings.{name}.weight", f"embeddings.{name}", embedding=True)
    remote["roberta.emb_ln.weight"] = state["embeddings.LayerNorm.weight"]
    remote["roberta.emb_ln.bias"] = state["embeddings.LayerNorm.bias"]
    for n in range(LAYERS):
        hf_, rm = f"layers.{n}.", f"encoder.layers.{n}."
        fused = np.concatenate([state[hf_ + f"self_attn.{p}_proj.weight"] for p in "qkv"])
        state[hf_ + "qkv"] = fused
        adapt(hf_ + "qkv", rm + "mixer.Wqkv")
        if task is not None:  # the fused adapter's merge, split back into transformers' three projections
            for p, part in zip("qkv", np.split(merged.pop(hf_ + "qkv"), 3)):
                merged[hf_ + f"self_attn.{p}_proj.weight"] = part
        remote[f"roberta.{rm}mixer.Wqkv.bias"] = np.concatenate([state[hf_ + f"self_attn.{p}_proj.bias"] for p in "qkv"])
        adapt(hf_ + "self_attn.o_proj.weight", rm + "mixer.out_proj")
        remote[f"roberta.{rm}mixer.out_proj.bias"] = state[hf_ + "self_attn.o_proj.bias"]
        for fc in ("fc1", "fc2"):
            adapt(hf_ + f"mlp.{fc}.weight", rm + f"mlp.{fc}")
            remote[f"roberta.{rm}mlp.{fc}.bias"] = state[hf_ + f"mlp.{fc}.bias"]
        for hf_norm, norm in (("post_attention_layernorm", "norm1"), ("post_mlp_layernorm", "norm2")):
            for p in ("weight", "bias"):
                remote[f"roberta.{rm}{norm}.{p}"] = state[hf_ + f"{hf_norm}.{p}"]
    out.mkdir()
    save_file(remote, str(out / "model.safetensors"))
    native = json.loads((hf_folder / "config.json").read_text())
    config = {"model_type": "xlm-roberta", "architectures": ["XLMRobertaLoRA"], "vocab_size": native["vocab_size"],
              "hidden_size": 64, "num_hidden_layers": LAYERS, "num_attention_heads": 4, "intermediate_size": 96,
              "hidden_act": "gelu", "layer_norm_eps": native["layer_norm_eps"], "type_vocab_size": 1,
              "max_position_embeddings": 8194, "position_embedding_type": "rotary", "rotary_emb_base": 1000.0,
              "lora_adaptations": TASKS, "task_instructions": INSTRUCTIONS, "lora_rank": RANK, "lora_alpha": ALPHA,
              "lora_dropout_p": 0.0, "load_trained_adapters": True, "pad_token_id": 0, "task": task}
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(hf_folder / name, out / name)
    return {k: v for k, v in merged.items() if not k.endswith("qkv")}


@pytest.mark.parametrize("task", ["retrieval.query", "text-matching", None])
def test_remote_layout_with_its_task_adapter_merged(hf, tmp_path, task):
    t = torch()
    import transformers

    folder, model = hf
    merged = remote_layout(folder, model, tmp_path / "remote", task)
    reference = transformers.JinaEmbeddingsV3Model(model.config).eval()
    reference.load_state_dict({k: t.from_numpy(np.ascontiguousarray(v)) for k, v in merged.items()}, strict=False)
    assert registry.family_name(formats.open_checkpoint(tmp_path / "remote")) == "jina_embeddings_v3"
    lists, ours = token_vectors(tmp_path / "remote", TEXTS)
    for ids, got in zip(lists, ours, strict=True):
        expected = hf_hidden(reference, ids)
        assert min(cosine(a, b) for a, b in zip(got, expected, strict=True)) >= MIN_COSINE, task
    if task is not None:  # the adapter moved the vectors: the merge is what matched
        assert min(cosine(a, b) for a, b in zip(ours[2], hf_hidden(model, lists[2]))) < 0.999


def test_unknown_task_is_refused():
    with pytest.raises(UnsupportedCheckpoint, match="task 'search' is not one of its adapters"):
        jina.ModelArgs.from_dict({"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "lora_adaptations": TASKS, "task": "search"})
