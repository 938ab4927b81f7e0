"""GGUF architectures whose safetensors families we already serve (`t5encoder`, `eurobert`, `nomic-bert-moe`,
`llama-embed`, `mistral3`), written here from tiny random transformers checkpoints with the gguf package's
GGUFWriter exactly as llama.cpp's convert_hf_to_gguf.py (commit 3f545bec) writes them: the same metadata keys and
values, tensor names, shapes and vocabulary. Token ids equal the real llama-server's on the same file; F32 vectors
equal llama-server's and the references' on the original weights (cosine >= 0.9999; T5 and nomic-bert-moe: what
the converter's file allows, as llama-server reads it; see each test).

The converter itself is not on this machine; with a llama.cpp checkout named by MLX_EMBED_LLAMA_CPP (its
gguf-py beside it), the opt-in test below converts the same folders with it and checks that its files hold exactly
what ours hold (T5 only: on a BPE vocabulary the converter wants a known tokenizer hash, which a tiny one trained
here has not; nor nomic-bert-moe, whose converter wants the published n_positions):
`MLX_EMBED_LLAMA_CPP=/path/to/llama.cpp .venv/bin/python -m pytest -q tests/engine/test_gguf_encoders.py`.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import Pooling
from engine.loading.gguf.reader import GGUFFile
from tests.conftest import gguf_fixture
from tests.engine.families.qwen3_fixture import CORPUS
from tests.engine.helpers import ENCODER_TEXTS, cosine, hf_hidden, perturb_vectors, start_engine, torch, train_spiece
from tests.engine.test_gguf_written import finish

gguf = pytest.importorskip("gguf")
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")  # sentencepiece's model proto
from sentencepiece import SentencePieceProcessor, sentencepiece_model_pb2  # noqa: E402

# whitespace runs, leading and trailing spaces: llama.cpp's UGM normalization
TEXTS = [*ENCODER_TEXTS[:-1], "  two  spaces  here ", "UPPER case and\ttabs"]


def embed_mean(path: Path, texts: list[str]) -> tuple[list[list[int]], list]:
    """(token ids, mean-pooled vectors) our engine gives on a GGUF without a pooling type, as --pooling mean."""
    eng = start_engine(path, pooling=Pooling.MEAN)
    try:
        ids = [eng.encode_prompt([s]) for s in texts]
        return ids, eng.embed(ids).vectors
    finally:
        eng.close(wait=True)


def llama_server_answers(path: Path, texts: list[str], *args: str) -> tuple[list[list[int]], list]:
    from tests.peer_llama import LlamaServer

    with LlamaServer(path, "--embedding", *args) as llama:
        return [llama.tokenize(s) for s in texts], llama.embeddings(texts)


def add_sizes(writer, *, context: int, width: int, ff: int, layers: int, heads: int, kv_heads: int | None = None,
              file_type=gguf.LlamaFileType.ALL_F32) -> None:
    """The hyper-parameters every converter writes, in its order."""
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(ff)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    if kv_heads is not None:
        writer.add_head_count_kv(kv_heads)
    writer.add_file_type(file_type)


def add_spiece_vocabulary(writer, folder: Path, vocab_size: int) -> None:
    """A folder's spiece.model as the converter's T5 vocabulary (T5EncoderModel.set_vocab): every piece with its
    score and type, rows past the tokenizer as unused `[PADi]`, the normalizer's flags and precompiled charsmap,
    and the special tokens and add-EOS flag gguf.SpecialVocab reads from the folder."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((folder / "spiece.model").read_bytes())
    sp = SentencePieceProcessor(model_file=str(folder / "spiece.model"))
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores, types = [-10000.0] * vocab_size, [gguf.TokenType.UNUSED] * vocab_size
    for i in range(sp.vocab_size()):
        tokens[i], scores[i] = sp.IdToPiece(i), sp.GetScore(i)
        types[i] = (gguf.TokenType.UNKNOWN if sp.IsUnknown(i) else gguf.TokenType.CONTROL if sp.IsControl(i)
                    else gguf.TokenType.UNUSED if sp.IsUnused(i) else gguf.TokenType.BYTE if sp.IsByte(i)
                    else gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("t5")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
    writer.add_remove_extra_whitespaces(proto.normalizer_spec.remove_extra_whitespaces)
    writer.add_precompiled_charsmap(proto.normalizer_spec.precompiled_charsmap)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)


# T5EncoderModel key (after "encoder.block.{i}.") -> the converter's tensor name (after "enc.blk.{i}.")
T5_LAYER_NAMES = {
    "layer.0.layer_norm": "attn_norm", "layer.0.SelfAttention.q": "attn_q", "layer.0.SelfAttention.k": "attn_k",
    "layer.0.SelfAttention.v": "attn_v", "layer.0.SelfAttention.o": "attn_o",
    "layer.0.SelfAttention.relative_attention_bias": "attn_rel_b", "layer.1.layer_norm": "ffn_norm",
    "layer.1.DenseReluDense.wi": "ffn_up", "layer.1.DenseReluDense.wi_0": "ffn_gate",
    "layer.1.DenseReluDense.wi_1": "ffn_up", "layer.1.DenseReluDense.wo": "ffn_down",
}


def t5_gguf_name(key: str) -> str:
    if key == "shared.weight":
        return "token_embd.weight"
    if key == "encoder.final_layer_norm.weight":
        return "enc.output_norm.weight"
    _, _, index, rest = key.split(".", 3)  # encoder.block.{i}.<module>.weight
    return f"enc.blk.{index}.{T5_LAYER_NAMES[rest.rsplit('.', 1)[0]]}.weight"


def make_t5(folder: Path, feed_forward_proj: str, spiece: Path):
    """A tiny random T5EncoderModel (test_t5.py's sizes) saved in `folder` beside a copy of `spiece` (T5's
    <pad> 0, </s> 1, <unk> 2): the folder the converter reads (spiece.model, config.json, weights)."""
    t = torch()
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(spiece, folder / "spiece.model")
    t.manual_seed(3)
    n_vocab = SentencePieceProcessor(model_file=str(spiece)).vocab_size()
    config = transformers.T5Config(vocab_size=n_vocab + 4, d_model=64, d_kv=8, d_ff=128, num_layers=2, num_heads=4,
                                   feed_forward_proj=feed_forward_proj, relative_attention_num_buckets=32,
                                   relative_attention_max_distance=128)
    model = transformers.T5EncoderModel(config)
    perturb_vectors(model, 3)
    with t.no_grad():  # biases of about one, so the shared position bias moves the attention
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.mul_(8.0)
    model.eval()
    model.save_pretrained(str(folder))
    return model


def write_t5_gguf(folder: Path, model, path: Path, causal: bool | None = None) -> None:
    """`model` (a T5EncoderModel saved in `folder` with its spiece.model) as the converter writes `t5encoder`
    --outtype f32; causal: a `t5encoder.attention.causal` key added (the converter writes none)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "t5encoder")
    writer.add_type("model")
    # context 512: the converter's default (T5 configs have no n_positions)
    add_sizes(writer, context=512, width=config.d_model, ff=config.d_ff, layers=config.num_layers,
              heads=config.num_heads)
    writer.add_key_length(config.d_kv)
    writer.add_value_length(config.d_kv)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_relative_attn_buckets_count(config.relative_attention_num_buckets)
    writer.add_layer_norm_rms_eps(config.layer_norm_epsilon)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if causal is not None:
        writer.add_causal_attention(causal)
    add_spiece_vocabulary(writer, folder, config.vocab_size)
    for key, value in model.state_dict().items():
        if key != "encoder.embed_tokens.weight":  # tied to shared.weight; the converter keeps one
            writer.add_tensor(t5_gguf_name(key), value.numpy().astype(np.float32))
    finish(writer)


@pytest.fixture(scope="module")
def t5_models(tmp_path_factory):
    """The two T5 layouts (v1.0's ReLU: sentence-t5 / gtr-t5; v1.1's gated GELU: the -xl ones), on one
    SentencePiece unigram trained here."""
    root = tmp_path_factory.mktemp("t5")
    spiece = train_spiece(root / "spiece", CORPUS + TEXTS * 10, 400)
    return {proj: (root / proj, make_t5(root / proj, proj, spiece)) for proj in ("relu", "gated-gelu")}


@contextlib.contextmanager
def causal(model):
    """transformers' T5 encoder read causally, as llama-server runs the converter's file: the first block's
    position bias (which every block adds) with -inf above the diagonal."""
    t = torch()
    attention = model.encoder.block[0].layer[0].SelfAttention
    compute_bias = attention.compute_bias

    def causal_bias(query_length, key_length, *args, **kwargs):
        return compute_bias(query_length, key_length, *args, **kwargs) + t.full(
            (query_length, key_length), float("-inf")).triu(1)

    attention.compute_bias = causal_bias
    try:
        yield model
    finally:
        del attention.compute_bias


def spiece_ids(folder: Path, text: str) -> list[int]:
    """The original tokenizer's ids: sentencepiece's pieces, then </s> (T5's tokenizer appends it)."""
    return SentencePieceProcessor(model_file=str(folder / "spiece.model")).encode(text) + [1]


@pytest.mark.parametrize("feed_forward_proj", ["relu", "gated-gelu"])
def test_t5encoder_gguf_is_read_as_llama_server_reads_the_converters_file(tmp_path, t5_models, feed_forward_proj):
    """The converter's file has no pooling type (sentence-t5's pooling and 2_Dense are dropped) and no
    attention.causal, so llama-server pools by --pooling and runs the encoder causally: ids and vectors equal
    its answers, and the causal reading of transformers' encoder on the same weights (not the T5 encoder itself)."""
    folder, model = t5_models[feed_forward_proj]
    path = tmp_path / "tiny-t5encoder-f32.gguf"
    write_t5_gguf(folder, model, path)
    assert GGUFFile(path).arch_value("pooling_type") is None
    ids, ours = embed_mean(path, TEXTS)
    assert ids[:5] == [spiece_ids(folder, s) for s in TEXTS[:5]]
    with causal(model):
        for row, token_ids in zip(ours, ids, strict=True):
            assert cosine(row, hf_hidden(model, token_ids, token_types=False).mean(axis=0)) >= 0.9999
    their_ids, theirs = llama_server_answers(path, TEXTS, "--pooling", "mean")
    assert ids == their_ids
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999
    bidirectional = [hf_hidden(model, token_ids, token_types=False).mean(axis=0) for token_ids in ids[:2]]
    assert max(cosine(a, b) for a, b in zip(ours, bidirectional)) < 0.999  # the causal reading is another one


def test_t5encoder_gguf_marked_non_causal_is_the_t5_encoder(tmp_path, t5_models):
    """With `t5encoder.attention.causal` false, llama-server and we run the real (bidirectional) T5 encoder:
    vectors equal transformers' mean of T5EncoderModel's states and llama-server's."""
    folder, model = t5_models["gated-gelu"]
    path = tmp_path / "tiny-t5encoder-bidirectional-f32.gguf"
    write_t5_gguf(folder, model, path, causal=False)
    ids, ours = embed_mean(path, TEXTS)
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(model, token_ids, token_types=False).mean(axis=0)) >= 0.9999
    their_ids, theirs = llama_server_answers(path, TEXTS, "--pooling", "mean")
    assert ids == their_ids
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999


def _llama_cpp() -> Path:
    root = os.environ.get("MLX_EMBED_LLAMA_CPP")
    if not root:
        pytest.skip("set MLX_EMBED_LLAMA_CPP to a llama.cpp checkout (commit 3f545bec) to run its converter")
    return Path(root)


def convert(root: Path, folder: Path, out: Path) -> None:
    subprocess.run([sys.executable, str(root / "convert_hf_to_gguf.py"), str(folder), "--outtype", "f32",
                    "--outfile", str(out)], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(root / "gguf-py")})


def assert_same_file(ours: Path, theirs: Path) -> None:
    """Every metadata key and tensor of the converter's file is in ours with the same value (general.name and the
    size label it derives from the folder aside)."""
    a, b = GGUFFile(ours), GGUFFile(theirs)
    for key, value in b.metadata.items():
        if key in ("general.name", "general.size_label", "general.basename", "general.finetune"):
            continue
        assert key in a.metadata, key
        np.testing.assert_array_equal(np.asarray(a.metadata[key]), np.asarray(value), err_msg=key)
    assert set(a.metadata) - set(b.metadata) <= {"general.name"}
    assert {n: t.shape for n, t in a.tensors.items()} == {n: t.shape for n, t in b.tensors.items()}
    for name in b.tensors:
        assert a.tensors[name].type_name == b.tensors[name].type_name, name
        np.testing.assert_array_equal(a.array(name), b.array(name), err_msg=name)


@pytest.mark.parametrize("feed_forward_proj", ["relu", "gated-gelu"])
def test_t5encoder_written_as_llama_cpps_converter_writes_it(tmp_path, t5_models, feed_forward_proj):
    root = _llama_cpp()
    from transformers import AutoTokenizer

    from tests.engine.families.test_t5 import TOKENIZER_CONFIG

    folder, model = t5_models[feed_forward_proj]
    # the tokenizer files a published T5 folder has beside spiece.model (the converter reads its specials there)
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG), encoding="utf-8")
    AutoTokenizer.from_pretrained(str(folder)).save_pretrained(str(folder))
    write_t5_gguf(folder, model, tmp_path / "ours.gguf")
    convert(root, folder, tmp_path / "theirs.gguf")
    assert_same_file(tmp_path / "ours.gguf", tmp_path / "theirs.gguf")


# EuroBERT's tokenizer (Llama 3's: pre-tokenizer llama-bpe) writes `<|begin_of_text|> text <|end_of_text|>`; here the
# decoder fixture's BPE with its <|im_start|> / <|im_end|> in those places
EUROBERT_BOS, EUROBERT_EOS = "<|im_start|>", "<|im_end|>"


def eurobert_tokenizer():
    from tokenizers import processors

    from tests.engine.test_gguf_arch import lfm2_tokenizer

    tok = lfm2_tokenizer()  # Llama 3's pre-tokenizer regex
    bos, eos = tok.convert_tokens_to_ids([EUROBERT_BOS, EUROBERT_EOS])
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{EUROBERT_BOS} $A {EUROBERT_EOS}", pair=f"{EUROBERT_BOS} $A {EUROBERT_EOS} $B {EUROBERT_EOS}",
        special_tokens=[(EUROBERT_BOS, bos), (EUROBERT_EOS, eos)])
    return tok


def write_eurobert_gguf(path: Path, pooling=None):
    """A tiny random EuroBertModel (EuroBERT-210m's layout: no biases, GQA, rope 250000) as the converter writes
    `eurobert`: Llama's names (gguf's TensorNameMap, `model.` stripped) with no q/k permutation, attention.causal
    false, rope scaling none, the pooling type of its sentence-transformers folder (none here unless given).
    F32. Returns (transformers model, HF tokenizer)."""
    t = torch()
    from transformers import EuroBertConfig, EuroBertModel

    from tests.engine.families.qwen3_fixture import QWEN3_SPECIALS
    from tests.engine.test_gguf_arch import add_tensors
    from tests.engine.test_gguf_written import add_bpe_vocabulary

    tok = eurobert_tokenizer()
    t.manual_seed(31)
    config = EuroBertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=96, max_position_embeddings=512,
                            pad_token_id=tok.pad_token_id, initializer_range=0.1, attention_bias=False, mlp_bias=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 250000.0})
    model = EuroBertModel(config).eval()
    perturb_vectors(model, 31)
    writer = gguf.GGUFWriter(str(path), "eurobert")
    add_sizes(writer, context=512, width=64, ff=96, layers=3, heads=4, kv_heads=2)
    writer.add_rope_freq_base(250000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_causal_attention(False)
    writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if pooling is not None:
        writer.add_pooling_type(pooling)
    vocab = add_bpe_vocabulary(writer, tok, "llama-bpe", QWEN3_SPECIALS)
    writer.add_bos_token_id(vocab[EUROBERT_BOS])
    writer.add_eos_token_id(vocab[EUROBERT_EOS])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(True)  # the tokenizer's template, which SpecialVocab writes over the converter's False
    writer.add_add_eos_token(True)
    add_tensors(writer, {k: v.numpy() for k, v in model.state_dict().items()}, "eurobert", 3, f16=False)
    finish(writer)
    return model, tok


def test_eurobert_gguf_ids_and_vectors_equal_transformers_and_llama_server(tmp_path):
    """A bare EuroBertModel conversion has no pooling type: --pooling mean on both sides."""
    from tests.engine.test_gguf_arch import DECODER_TEXTS

    path = tmp_path / "tiny-eurobert-f32.gguf"
    model, tok = write_eurobert_gguf(path)
    ids, ours = embed_mean(path, DECODER_TEXTS)
    assert ids == [tok(s).input_ids for s in DECODER_TEXTS]
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(model, token_ids, token_types=False).mean(axis=0)) >= 0.9999
    their_ids, theirs = llama_server_answers(path, DECODER_TEXTS, "--pooling", "mean")
    assert ids == their_ids
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999


# the hub's NomicBertModel (MoE) names -> the converter's (per layer)
NOMIC_MOE_LAYER_NAMES = {"attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output", "norm1": "attn_output_norm",
                         "norm2": "layer_output_norm", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
                         "mlp.router.layer": "ffn_gate_inp"}


def write_nomic_moe_gguf(path: Path, weights: dict[str, np.ndarray], n_tokens: int) -> None:
    """test_nomic_bert_moe's checkpoint as the converter writes nomic-embed-text-v2-moe: `nomic-bert-moe`, the
    experts per expert (w1 viewed [E, F, D]; w2 viewed [E, F, D] and transposed), `mlp.experts.bias` dropped,
    n_positions 2048 with max_trained_positions 2048 written as a 512-token context, the WordPiece vocabulary padded
    with unused [PADi] tokens to the embedding's rows. F32."""
    from tests.engine.families import test_nomic_bert_moe as moe
    from tests.engine.test_gguf_written import NOMIC_NAMES

    source = GGUFFile(gguf_fixture("minilm-f16.gguf")).metadata
    rows = weights["embeddings.word_embeddings.weight"].shape[0]
    writer = gguf.GGUFWriter(str(path), "nomic-bert-moe")
    add_sizes(writer, context=512, width=moe.D, ff=moe.FF, layers=moe.LAYERS, heads=moe.HEADS)
    writer.add_layer_norm_eps(moe.EPS)
    writer.add_expert_count(moe.EXPERTS)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_moe_every_n_layers(2)
    writer.add_expert_used_count(moe.TOP_K)
    writer.add_token_type_count(1)
    tokens = list(source["tokenizer.ggml.tokens"][:n_tokens])
    types = source["tokenizer.ggml.token_type"].tolist()[:n_tokens]
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens + [f"\u2581[PAD{i}]" for i in range(n_tokens, rows)])
    writer.add_token_types(types + [gguf.TokenType.UNUSED] * (rows - n_tokens))
    for name in ("bos_token_id", "eos_token_id", "unknown_token_id", "seperator_token_id", "padding_token_id"):
        writer.add_uint32(f"tokenizer.ggml.{name}", int(source[f"tokenizer.ggml.{name}"]))
    for name in ("add_bos_token", "add_eos_token", "add_sep_token"):
        writer.add_bool(f"tokenizer.ggml.{name}", bool(source[f"tokenizer.ggml.{name}"]))
    for key, value in weights.items():
        if key in NOMIC_NAMES:
            writer.add_tensor(NOMIC_NAMES[key], value)
            continue
        _, _, index, rest = key.split(".", 3)  # encoder.layers.{i}.<module>[.weight|.bias]
        if rest == "mlp.experts.bias":
            continue
        if rest == "mlp.experts.mlp.w1":
            writer.add_tensor(f"blk.{index}.ffn_up_exps.weight", value.reshape(moe.EXPERTS, moe.FF, moe.D))
        elif rest == "mlp.experts.mlp.w2":
            writer.add_tensor(f"blk.{index}.ffn_down_exps.weight",
                              np.ascontiguousarray(value.reshape(moe.EXPERTS, moe.FF, moe.D).transpose(0, 2, 1)))
        else:
            module, kind = rest.rsplit(".", 1)
            writer.add_tensor(f"blk.{index}.{NOMIC_MOE_LAYER_NAMES[module]}.{kind}", value)
    finish(writer)


def test_nomic_bert_moe_gguf_equals_the_reference_without_the_dropped_bias_and_llama_server(tmp_path):
    """nomic-embed-text-v2-moe's layout (4 layers, experts on layers 1 and 3, top 2 of 4): ids equal the WordPiece
    tokenizer's and llama-server's; mean-pooled vectors equal test_nomic_bert_moe's torch reference with the
    experts' bias at zero (what the file keeps) and llama-server's. The original's vectors (with the bias) differ."""
    from transformers import AutoTokenizer

    from tests.engine.families import test_nomic_bert_moe as moe
    from tests.engine.helpers import with_minilm_tokenizer

    n_tokens = with_minilm_tokenizer(tmp_path / "tok")
    weights = moe.random_weights(n_tokens + (-n_tokens % 64), seed=41)
    path = tmp_path / "tiny-nomic-bert-moe-f32.gguf"
    write_nomic_moe_gguf(path, weights, n_tokens)
    eng = start_engine(path)
    try:
        ids = [eng.encode_prompt([s]) for s in moe.TEXTS]
        ours = eng.embed(ids).vectors
    finally:
        eng.close(wait=True)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert ids == [tok(s).input_ids for s in moe.TEXTS]
    kept = {k: np.zeros_like(v) if k.endswith("mlp.experts.bias") else v for k, v in weights.items()}
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, moe.reference_hidden(kept, token_ids).mean(axis=0)) >= 0.9999
    assert min(cosine(row, moe.reference_hidden(weights, token_ids).mean(axis=0))
               for row, token_ids in zip(ours, ids)) < 0.9999  # the bias the converter drops mattered
    their_ids, theirs = llama_server_answers(path, moe.TEXTS)
    assert ids == their_ids
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999


def llama_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: q/k rows per head from rotate-half pairs to interleaved ones."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def add_llama_vocabulary_and_tensors(writer, tok, pre: str, model, arch: str) -> None:
    """The rest of a Llama-layout file (LlamaModel conversions): the BPE vocabulary with a BOS added, then every
    weight under its converter name with q/k permuted as the converter does (4 heads, 2 kv heads here), F32;
    finished."""
    from tests.engine.families.qwen3_fixture import QWEN3_SPECIALS
    from tests.engine.test_gguf_arch import LFM2_BOS, add_tensors
    from tests.engine.test_gguf_written import add_bpe_vocabulary

    vocab = add_bpe_vocabulary(writer, tok, pre, QWEN3_SPECIALS)
    writer.add_bos_token_id(vocab[LFM2_BOS])
    writer.add_eos_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    for key in state:
        if key.endswith(("q_proj.weight", "k_proj.weight")):
            state[key] = llama_permute(state[key], 4 if key.endswith("q_proj.weight") else 2)
    add_tensors(writer, state, arch, model.config.num_hidden_layers, f16=False)
    finish(writer)


def write_llama_embed_gguf(path: Path, bidirectional: bool):
    """A tiny random LlamaModel in llama-embed-nemotron's layout (LlamaBidirectionalModel; GQA) as the converter
    writes `llama-embed`: Llama's names, q/k permuted, vocab_size and rope dimension count, no pooling type, and
    `attention.causal` false where the config says is_causal false (bidirectional). A Llama 3 style byte-level BPE
    (pre llama-bpe, BOS added). F32. Returns (transformers model read the same way, HF tokenizer)."""
    t = torch()
    from transformers import LlamaConfig, LlamaModel

    from tests.engine.test_gguf_arch import lfm2_tokenizer

    tok = lfm2_tokenizer()  # Llama 3's pre-tokenizer regex, a BOS first
    t.manual_seed(23)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=512,
                         pad_token_id=tok.pad_token_id, initializer_range=0.1, rope_theta=500000.0)
    model = LlamaModel(config).eval()
    perturb_vectors(model, 23)
    model.config.is_causal = not bidirectional  # transformers' LlamaModel then builds a bidirectional padding mask
    writer = gguf.GGUFWriter(str(path), "llama-embed")
    writer.add_vocab_size(len(tok))
    writer.add_rope_dimension_count(16)
    add_sizes(writer, context=512, width=64, ff=96, layers=2, heads=4, kv_heads=2)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if bidirectional:
        writer.add_causal_attention(False)
    add_llama_vocabulary_and_tensors(writer, tok, "llama-bpe", model, "llama-embed")
    return model, tok


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
def test_llama_embed_gguf_ids_and_vectors_equal_transformers_and_llama_server(tmp_path, bidirectional):
    """No pooling type in the file: --pooling mean on both sides. With attention.causal false, the bidirectional
    Llama (transformers' LlamaModel with is_causal off); without it, llama-server runs it causally, and so do we."""
    from tests.engine.test_gguf_arch import DECODER_TEXTS

    path = tmp_path / "tiny-llama-embed-f32.gguf"
    model, tok = write_llama_embed_gguf(path, bidirectional)
    ids, ours = embed_mean(path, DECODER_TEXTS)
    assert ids == [tok(s).input_ids for s in DECODER_TEXTS]
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(model, token_ids, token_types=False).mean(axis=0)) >= 0.9999
    their_ids, theirs = llama_server_answers(path, DECODER_TEXTS, "--pooling", "mean")
    assert ids == their_ids
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999


def tekken_tokenizer():
    """decoder_fixture's byte-level BPE with Mistral Tekken's pre-tokenizer regex (case runs, one digit a piece)
    and a BOS first, as Ministral 3's tokenizer."""
    from tokenizers import Regex, pre_tokenizers

    from engine.loading.gguf.vocab import _TEKKEN
    from tests.engine.test_gguf_arch import lfm2_tokenizer

    tok = lfm2_tokenizer()  # a BOS first
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_TEKKEN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def write_mistral3_gguf(path: Path, bidirectional: bool):
    """test_ministral3's random Ministral3Model (YaRN over an original context of 32, Llama 4 attention scaling
    0.1, tied embeddings) as the converter writes `mistral3`: Llama's names, q/k permuted, the rope scaling keys,
    yarn_log_multiplier (mscale_all_dim) and attention.temperature_scale (llama_4_scaling_beta), attention.causal
    false where config.json says is_causal false (Nemotron-3-Embed), no pooling type; pre-tokenizer tekken. F32."""
    from tests.engine.families.decoder_fixture import save_random
    from tests.engine.families.test_ministral3 import ROPE, as_bidirectional

    _, model = save_random(path.parent / "src", "Ministral3Model", "Ministral3Config", seed=21, rope_parameters=ROPE,
                           tie_word_embeddings=True, num_hidden_layers=3)
    if bidirectional:
        model = as_bidirectional(model)
    config = model.config
    tok = tekken_tokenizer()
    writer = gguf.GGUFWriter(str(path), "mistral3")
    writer.add_vocab_size(len(tok))
    writer.add_rope_dimension_count(16)
    add_sizes(writer, context=512, width=64, ff=96, layers=3, heads=4, kv_heads=2)
    writer.add_rope_freq_base(ROPE["rope_theta"])
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(ROPE["factor"])
    writer.add_rope_scaling_orig_ctx_len(ROPE["original_max_position_embeddings"])
    writer.add_rope_scaling_yarn_beta_fast(ROPE["beta_fast"])
    writer.add_rope_scaling_yarn_beta_slow(ROPE["beta_slow"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_scaling_yarn_log_mul(ROPE["mscale_all_dim"])
    writer.add_attn_temperature_scale(ROPE["llama_4_scaling_beta"])
    if bidirectional:
        writer.add_causal_attention(False)
    add_llama_vocabulary_and_tensors(writer, tok, "tekken", model, "mistral3")
    return model, tok


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
def test_mistral3_gguf_ids_and_vectors_equal_transformers_and_llama_server(tmp_path, bidirectional):
    """Nemotron-3-Embed's bidirectional Ministral 3 and the causal Ministral 3 with --embedding, on ~100-token
    inputs (past the original context of 32: the YaRN ramp and the query scale both matter), --pooling mean."""
    from tests.engine.families.decoder_fixture import LONG_TEXTS
    from tests.engine.test_gguf_arch import DECODER_TEXTS

    texts = DECODER_TEXTS + LONG_TEXTS[-2:]
    path = tmp_path / "tiny-mistral3-f32.gguf"
    model, tok = write_mistral3_gguf(path, bidirectional)
    ids, ours = embed_mean(path, texts)
    assert ids == [tok(s).input_ids for s in texts] and max(map(len, ids)) > 64
    for row, token_ids in zip(ours, ids, strict=True):
        assert cosine(row, hf_hidden(model, token_ids, token_types=False).mean(axis=0)) >= 0.9999
    their_ids, theirs = llama_server_answers(path, texts, "--pooling", "mean")
    assert ids == their_ids
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.9999
