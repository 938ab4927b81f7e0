"""engine/families/nomic_bert.py's mixture-of-experts variant (nomic-embed-text-v2-moe) against a torch reference.

transformers has no NomicBERT-MoE (its NomicBertModel is the bias-free gated v1.5), and the published model is
remote code (nomic's contrastors NomicBertModel with MoE layers). The reference below is written from that code's
published description, in torch, loop for loop as it computes: post-norm blocks with a fused Wqkv (biased),
rotary positions on whole heads (halves rotated), plain GELU MLPs with biases, and on every layer i with
i % moe_every_n_layers == 1 a router whose softmax over all experts is taken in float32, the top-k weights not
renormalized, each expert act(x @ w1[e].T) @ w2[e] gathered per expert and index-added, one shared bias after
the sum. The checkpoint is saved in the hub's key names and config.json (GPT-2 names), on all-MiniLM-L6-v2's
tokenizer, with the search_query / search_document prompts and mean pooling.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import save_file

from engine import Pooling
from engine.families import nomic_bert
from engine.loading import formats, registry
from tests.engine.families.decoder_fixture import pooled_layout, token_vectors, write_files
from tests.engine.helpers import cosine, start_engine, torch, with_minilm_tokenizer

D, HEADS, FF, LAYERS, EXPERTS, TOP_K, EPS, BASE = 64, 4, 96, 4, 4, 2, 1e-5, 10000.0
PROMPTS = {"query": "search_query: ", "passage": "search_document: "}  # as the checkpoint names them
TEXTS = [
    "hello",
    "what is rotary position embedding?",
    "Rotary embeddings rotate query and key pairs by an angle that grows with the position, so attention "
    "scores depend on relative offsets. " * 3,
    "a " * 100 + "b",
    "def f(x):\n    return x ** 2  # square",
]
MIN_COSINE = 0.99999


def hub_config(vocab: int) -> dict:
    """nomic-embed-text-v2-moe's config.json, at this size."""
    return {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "gelu",
            "vocab_size": vocab, "pad_vocab_size_multiple": 64, "n_embd": D, "n_head": HEADS, "n_inner": FF,
            "n_layer": LAYERS, "n_positions": 2048, "max_trained_positions": 2048, "layer_norm_epsilon": EPS,
            "type_vocab_size": 1, "rotary_emb_fraction": 1.0, "rotary_emb_base": BASE,
            "rotary_emb_interleaved": False, "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
            "qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True, "prenorm": False,
            "parallel_block": False, "causal": False, "use_rms_norm": None, "moe_every_n_layers": 2,
            "num_experts": EXPERTS, "moe_top_k": TOP_K, "moe_normalize_expert_weights": False,
            "num_shared_experts": 0, "expert_choice_router": False, "moe_impl": "megablocks", "pad_token_id": 0}


def random_weights(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"embeddings.word_embeddings.weight": w(rows, D, scale=0.5),
           "embeddings.token_type_embeddings.weight": w(1, D, scale=0.5),
           "emb_ln.weight": 1 + w(D), "emb_ln.bias": w(D)}
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        out.update({p + "attn.Wqkv.weight": w(3 * D, D, scale=0.2), p + "attn.Wqkv.bias": w(3 * D),
                    p + "attn.out_proj.weight": w(D, D, scale=0.2), p + "attn.out_proj.bias": w(D),
                    p + "norm1.weight": 1 + w(D), p + "norm1.bias": w(D),
                    p + "norm2.weight": 1 + w(D), p + "norm2.bias": w(D)})
        if i % 2 == 1:
            out.update({p + "mlp.router.layer.weight": w(EXPERTS, D, scale=0.5),
                        p + "mlp.experts.mlp.w1": w(EXPERTS * FF, D, scale=0.2),
                        p + "mlp.experts.mlp.w2": w(EXPERTS * FF, D, scale=0.2), p + "mlp.experts.bias": w(D)})
        else:
            out.update({p + "mlp.fc1.weight": w(FF, D, scale=0.2), p + "mlp.fc1.bias": w(FF),
                        p + "mlp.fc2.weight": w(D, FF, scale=0.2), p + "mlp.fc2.bias": w(D)})
    return out


def reference_hidden(weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """contrastors' NomicBertModel (MoE) forward for one unpadded input -> [n, D] (float64 out)."""
    t = torch()
    F = t.nn.functional
    p = {k: t.from_numpy(v) for k, v in weights.items()}
    n, dh = len(ids), D // HEADS

    def ln(x, name):
        return F.layer_norm(x, (D,), p[name + ".weight"], p[name + ".bias"], EPS)

    def rotate(x):  # x [1, n, H, dh]
        inv = 1.0 / (BASE ** (t.arange(0, dh, 2, dtype=t.float32) / dh))
        freqs = t.outer(t.arange(n, dtype=t.float32), inv)
        cos, sin = t.cat([freqs.cos()] * 2, -1)[:, None], t.cat([freqs.sin()] * 2, -1)[:, None]
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + t.cat((-x2, x1), -1) * sin

    with t.inference_mode():
        ids_t = t.tensor([ids])
        x = ln(p["embeddings.word_embeddings.weight"][ids_t] + p["embeddings.token_type_embeddings.weight"][0],
               "emb_ln")
        for i in range(LAYERS):
            pre = f"encoder.layers.{i}."
            qkv = F.linear(x, p[pre + "attn.Wqkv.weight"], p[pre + "attn.Wqkv.bias"]).view(1, n, 3, HEADS, dh)
            q, k, v = (rotate(qkv[:, :, 0]), rotate(qkv[:, :, 1]), qkv[:, :, 2])
            attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            attn = F.linear(attn.transpose(1, 2).reshape(1, n, D), p[pre + "attn.out_proj.weight"],
                            p[pre + "attn.out_proj.bias"])
            x = ln(x + attn, pre + "norm1")
            if i % 2 == 1:
                flat = x.view(-1, D)
                weights_ = F.linear(flat, p[pre + "mlp.router.layer.weight"]).softmax(dim=-1, dtype=t.float32)
                top_w, top_e = t.topk(weights_, TOP_K, dim=-1)
                w1 = p[pre + "mlp.experts.mlp.w1"].view(EXPERTS, FF, D)
                w2 = p[pre + "mlp.experts.mlp.w2"].view(EXPERTS, FF, D)
                out = t.zeros_like(flat)
                mask = F.one_hot(top_e, num_classes=EXPERTS).permute(2, 1, 0)
                for e in range(EXPERTS):
                    slot, token = t.where(mask[e])
                    if token.numel():
                        y = F.gelu(flat[token] @ w1[e].t()) @ w2[e]
                        out.index_add_(0, token, y * top_w[token, slot, None])
                mlp = (out + p[pre + "mlp.experts.bias"]).view(1, n, D)
            else:
                mlp = F.linear(F.gelu(F.linear(x, p[pre + "mlp.fc1.weight"], p[pre + "mlp.fc1.bias"])),
                               p[pre + "mlp.fc2.weight"], p[pre + "mlp.fc2.bias"])
            x = ln(x + mlp, pre + "norm2")
    return x[0].double().numpy()


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("nomic_moe")
    vocab = with_minilm_tokenizer(folder)
    rows = vocab + (-vocab % 64)
    weights = random_weights(rows, seed=41)
    save_file(weights, str(folder / "model.safetensors"))
    write_files(folder, {"config.json": hub_config(vocab), **pooled_layout("mean", PROMPTS)})
    return folder, weights


@pytest.fixture(scope="module")
def engine(moe):
    eng = start_engine(moe[0])
    yield eng
    eng.close()


def lists(eng, prefix: str = "") -> list[list[int]]:
    out = [eng.encode_prompt([prefix + text]) for text in TEXTS]
    assert max(map(len, out)) >= 100
    return out


def test_layers_alternate_dense_and_experts(moe, engine):
    model = formats.load(formats.open_checkpoint(moe[0])).model
    kinds = [type(layer.mlp).__name__ for layer in model.encoder.layers]
    assert kinds == ["NomicBertMLP", "NomicMoELayer", "NomicBertMLP", "NomicMoELayer"]
    assert (engine.info.family, engine.info.pooling, engine.info.n_embd) == ("nomic_bert", Pooling.MEAN, D)


def test_tokens_match_the_reference_in_a_padded_batch(moe):
    folder, weights = moe
    batch, ours = token_vectors(folder, TEXTS)
    for ids, got in zip(batch, ours, strict=True):
        expected = reference_hidden(weights, ids)
        assert min(cosine(a, b) for a, b in zip(got, expected, strict=True)) >= MIN_COSINE
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


def test_mean_pooling_and_prompts(moe, engine):
    _, weights = moe
    for name in (None, "query", "passage"):
        prefix = PROMPTS.get(name, "")
        ours = engine.embed_prompts(engine.format_prompts([[t] for t in TEXTS], prompt_name=name)).vectors
        for ids, got in zip(lists(engine, prefix), ours, strict=True):
            assert cosine(got, reference_hidden(weights, ids).mean(axis=0)) >= MIN_COSINE, name


def test_batch_invariant(engine):
    batch = lists(engine)
    together = engine.embed(batch).vectors
    for ids, vec in zip(batch, together, strict=True):
        np.testing.assert_allclose(vec, engine.embed([ids]).vectors[0], rtol=0, atol=1e-5)


def test_routing_details_matter_at_this_tolerance(moe, engine):
    """The family's Model directly: renormalized top-k weights, or top-1, visibly move the vectors."""
    folder, weights = moe
    ids = lists(engine)[2]
    expected = reference_hidden(weights, ids)
    for change in ({}, {"moe_normalize_expert_weights": True}, {"moe_top_k": 1}):
        args = nomic_bert.ModelArgs.from_dict({**json.loads((folder / "config.json").read_text()), **change})
        model = nomic_bert.Model(args)
        model.load_weights(list(model.sanitize(mx.load(str(folder / "model.safetensors"))).items()))
        got = np.array(model(mx.array([ids]), mx.ones((1, len(ids)), dtype=mx.int32))[0])
        worst = min(cosine(a, b) for a, b in zip(got, expected))
        assert (worst >= MIN_COSINE) == (not change), (change, worst)
