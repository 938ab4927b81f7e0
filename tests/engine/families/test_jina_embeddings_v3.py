"""engine/families/jina_embeddings_v3.py against transformers' JinaEmbeddingsV3Model on the same random weights
(torch CPU, fp32), in transformers' layout and in Jina's remote-code layout (XLMRobertaLoRA) with task adapters,
the task chosen per request.

transformers has the trunk but not the task LoRA adapters (its JinaEmbeddingsV3Model has none, and peft is not
installed), so the adapters' reference is Jina's LoRAParametrization as published, computed here in torch: a
linear weight W + (alpha / rank) * B[t] @ A[t], an embedding table W + (alpha / rank) * A[t] @ B[t], loaded into
transformers' model as its weights, one reference model per task (and the bare one: task None, the adapters off).
Jina's encode(task=t) puts task_instructions[t] before each text; the sentence-transformers route passes
task=t, prompt_name=t, whose prompts are the same texts. Tiny (hidden 64, 3 layers, rotary base 1000 so ~100
tokens wrap the fast pairs) on all-MiniLM-L6-v2's tokenizer; mean pooling and the tasks' instructions as prompts.
"""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine import Pooling
from engine.errors import InvalidInput, UnsupportedCheckpoint
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
    return save_hf(tmp_path_factory.mktemp("jina_v3"))


def save_hf(folder: Path):
    """transformers' JinaEmbeddingsV3Model, saved in its layout with a mean-pooling sentence-transformers layout
    under `folder`; (folder, the model)."""
    t = torch()
    import transformers

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
        assert eng.info.tasks == () and eng.info.default_task is None
        with pytest.raises(InvalidInput, match="'task' is not supported by this model .*no task adapters"):
            eng.embed(lists[:1], task="retrieval.query")
    finally:
        eng.close()


def remote_layout(hf_folder: Path, model, out: Path, task: str | None = None,
                  st_default: str | None = None) -> dict[str | None, dict[str, np.ndarray]]:
    """The same trunk in Jina's remote-code names, every Linear and Embedding parametrized with random task
    adapters, config.json's `task` set to `task` and the sentence-transformers default_prompt_name to
    `st_default`; returns each task's merged weights in transformers' names (the reference's), None: the bare
    trunk's."""
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(52)
    remote = {}
    merged: dict[str | None, dict[str, np.ndarray]] = {t: dict(state) for t in [None, *TASKS]}

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
        for i, name in enumerate(TASKS):
            merged[name][hf_key] = weight + (ALPHA / RANK) * (a[i] @ b[i] if embedding else b[i] @ a[i])

    for name in ("word_embeddings", "token_type_embeddings"):
        adapt(f"embeddings.{name}.weight", f"embeddings.{name}", embedding=True)
    remote["roberta.emb_ln.weight"] = state["embeddings.LayerNorm.weight"]
    remote["roberta.emb_ln.bias"] = state["embeddings.LayerNorm.bias"]
    for n in range(LAYERS):
        hf_, rm = f"layers.{n}.", f"encoder.layers.{n}."
        fused = np.concatenate([state[hf_ + f"self_attn.{p}_proj.weight"] for p in "qkv"])
        state[hf_ + "qkv"] = fused
        adapt(hf_ + "qkv", rm + "mixer.Wqkv")
        for weights in merged.values():  # the fused adapter's merge, split back into transformers' projections
            for p, part in zip("qkv", np.split(weights.pop(hf_ + "qkv", fused), 3)):
                weights[hf_ + f"self_attn.{p}_proj.weight"] = part
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
              "lora_dropout_p": 0.0, "load_trained_adapters": True, "pad_token_id": 0,
              "matryoshka_dimensions": [16, 32, 64]}
    if task is not None:
        config["task"] = task
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(hf_folder / name, out / name)
    files = pooled_layout("mean", INSTRUCTIONS)
    files["config_sentence_transformers.json"]["default_prompt_name"] = st_default
    write_files(out, files)
    return {k: {n: v for n, v in w.items() if not n.endswith("qkv")} for k, w in merged.items()}


def references(model, merged: dict[str | None, dict[str, np.ndarray]]) -> dict:
    """One transformers JinaEmbeddingsV3Model per task (None: the bare trunk), its weights the merged ones."""
    t = torch()
    import transformers

    out = {}
    for task, weights in merged.items():
        reference = transformers.JinaEmbeddingsV3Model(model.config).eval()
        reference.load_state_dict({k: t.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}, strict=False)
        out[task] = reference
    return out


@pytest.fixture(scope="module")
def remote(hf, tmp_path_factory):
    """Jina's layout with no default task (config.json names none), and each task's reference model."""
    folder, model = hf
    path = tmp_path_factory.mktemp("jina_v3_remote") / "remote"
    return path, references(model, remote_layout(folder, model, path))


def test_every_task_matches_its_merged_reference(remote):
    path, refs = remote
    assert registry.family_name(formats.open_checkpoint(path)) == "jina_embeddings_v3"
    eng = start_engine(path, pooling=Pooling.NONE)
    try:
        assert [name for name, _ in eng.info.tasks] == TASKS and eng.info.default_task is None
        lists = token_lists(eng)
        bare = eng.embed(lists).vectors
        for task in [None, *TASKS]:
            ours = eng.embed(lists, task=task).vectors
            for ids, got in zip(lists, ours, strict=True):
                expected = hf_hidden(refs[task], ids)
                assert min(cosine(a, b) for a, b in zip(got, expected, strict=True)) >= MIN_COSINE, task
            if task is not None:  # the adapter moved the vectors: the adapter is what matched
                assert min(cosine(a, b) for a, b in zip(ours[2], bare[2])) < 0.999
    finally:
        eng.close()


def test_concurrent_requests_of_different_tasks_equal_each_task_alone(remote):
    """Requests of every task at once: the scheduler keeps each pass to one task, and each vector equals the
    task run alone (1e-5)."""
    path, _ = remote
    eng = start_engine(path)
    try:
        lists = token_lists(eng)
        alone = {task: [eng.embed([ids], task=task).vectors[0] for ids in lists] for task in [None, *TASKS]}
        got: dict = {}
        barrier = threading.Barrier(len(alone))

        def run(task):
            barrier.wait()
            got[task] = eng.embed(lists, task=task).vectors

        workers = [threading.Thread(target=run, args=(task,)) for task in alone]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for task, vectors in alone.items():
            for vec, ref in zip(got[task], vectors, strict=True):
                np.testing.assert_allclose(vec, ref, rtol=0, atol=1e-5)
    finally:
        eng.close()


def test_task_prompt_name_and_instruction_as_jina_encode(hf, remote):
    """task=t embeds task_instructions[t] + text with adapter t (Jina's encode); prompt_name=t does the same
    (the card's sentence-transformers call); both given: the adapter of `task`, the prompt of `prompt_name`."""
    _, model = hf
    path, refs = remote
    eng = start_engine(path)
    try:
        def embedded(texts, **asked):
            return eng.embed_prompts(eng.format_prompts([[t] for t in texts], **asked), **asked).vectors

        for name in ("retrieval.query", "retrieval.passage", "text-matching"):
            assert eng.format_prompts([["hello"]], task=name) == [[INSTRUCTIONS[name] + "hello"]]
            for asked in ({"task": name}, {"prompt_name": name}):
                for text, got in zip(TEXTS, embedded(TEXTS, **asked), strict=True):
                    ids = eng.encode_prompt([INSTRUCTIONS[name] + text])
                    assert cosine(got, hf_hidden(refs[name], ids).mean(axis=0)) >= MIN_COSINE, (name, asked)
        mixed = embedded(TEXTS[:1], task="separation", prompt_name="retrieval.query")[0]
        ids = eng.encode_prompt([INSTRUCTIONS["retrieval.query"] + TEXTS[0]])
        assert cosine(mixed, hf_hidden(refs["separation"], ids).mean(axis=0)) >= MIN_COSINE
        plain = embedded(TEXTS[:1])[0]  # no task: the adapters off and no instruction, Jina's encode(task=None)
        assert cosine(plain, hf_hidden(refs[None], eng.encode_prompt([TEXTS[0]])).mean(axis=0)) >= MIN_COSINE
        with pytest.raises(InvalidInput, match=r"task 'search' is not one of this model's tasks \(known: "
                                               r"retrieval.query, retrieval.passage, separation"):
            eng.embed_prompts([["x"]], task="search")
        with pytest.raises(InvalidInput, match="task 'search'"):
            eng.format_prompts([["x"]], task="search")
    finally:
        eng.close()


def test_matryoshka_dimensions_keep_the_leading_components(remote):
    """The card's truncate_dim: the first N components of the task's vector (here normalized after the cut,
    as `dimensions` is on every route: the same direction as Jina's normalize-then-cut)."""
    path, refs = remote
    eng = start_engine(path)
    try:
        ids = token_lists(eng)[1]
        full = hf_hidden(refs["retrieval.passage"], ids).mean(axis=0)
        for dim in (16, 32):
            got = eng.embed([ids], task="retrieval.passage", dimensions=dim, embd_normalize=2).vectors[0]
            assert got.shape == (dim,) and abs(np.linalg.norm(got) - 1) < 1e-5
            assert cosine(got, full[:dim]) >= MIN_COSINE
    finally:
        eng.close()


@pytest.mark.parametrize(("config_task", "st_default", "expected"),
                         [("text-matching", None, "text-matching"), (None, "retrieval.query", "retrieval.query"),
                          ("classification", "retrieval.query", "classification")])
def test_default_task_from_the_checkpoint(hf, tmp_path, config_task, st_default, expected):
    """config.json `task`, else sentence-transformers' default_prompt_name naming a task: what a request naming
    no task runs with, its instruction applied (no task and no default: the adapters off, tested above)."""
    folder, model = hf
    refs = references(model, remote_layout(folder, model, tmp_path / "remote", config_task, st_default))
    eng = start_engine(tmp_path / "remote")
    try:
        assert eng.info.default_task == expected
        got = eng.embed_prompts(eng.format_prompts([[TEXTS[1]]])).vectors[0]
        ids = eng.encode_prompt([INSTRUCTIONS[expected] + TEXTS[1]])
        assert cosine(got, hf_hidden(refs[expected], ids).mean(axis=0)) >= MIN_COSINE
    finally:
        eng.close()


def test_unknown_task_is_refused():
    with pytest.raises(UnsupportedCheckpoint, match="task 'search' is not one of its adapters"):
        jina.ModelArgs.from_dict({"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "lora_adaptations": TASKS, "task": "search"})


def test_the_python_api_takes_the_task(remote):
    """Encoder.encode(task=...) / (prompt_name=...): the vectors the engine gives for that task."""
    from engine import Encoder

    path, refs = remote
    with Encoder(str(path), threads=2) as encoder:
        for asked in ({"task": "retrieval.query"}, {"prompt_name": "retrieval.query"}):
            got = encoder.encode(TEXTS[:2], **asked)
            for text, vec in zip(TEXTS, got):
                ids = encoder.engine.encode_prompt([INSTRUCTIONS["retrieval.query"] + text])
                assert cosine(vec, hf_hidden(refs["retrieval.query"], ids).mean(axis=0)) >= MIN_COSINE, asked
        pieces = ["Rotary embeddings rotate ", "query and key pairs."]
        chunks = encoder.embed_late_chunks(pieces, task="separation").vectors
        assert chunks.shape == (2, 64)
        assert min(cosine(a, b) for a, b in zip(chunks, encoder.embed_late_chunks(pieces).vectors)) < 0.999
        with pytest.raises(InvalidInput, match="task 'search'"):
            encoder.encode(["x"], task="search")
