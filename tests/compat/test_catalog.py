"""compat/catalog.py: which models a several-model server serves, with what options, and clear config errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from compat.catalog import EMBEDDING, RERANK, read_catalog
from compat.settings import SettingsError, parse_settings
from engine.types import Pooling


@pytest.fixture
def folders(tmp_path) -> dict[str, str]:
    """Model folders that exist (a REF is a folder when one exists)."""
    out = {}
    for name in ("minilm", "tiny", "ce"):
        (tmp_path / name).mkdir()
        out[name] = str(tmp_path / name)
    return out


def write(tmp_path: Path, text: str, name: str = "models.ini") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def catalog(*argv: str, env: dict[str, str] | None = None):
    return read_catalog(parse_settings(list(argv), env or {}, system_config_files=[]))


def config_error(*argv: str) -> str:
    with pytest.raises(SettingsError) as caught:
        catalog(*argv)
    return str(caught.value)


# -- single or several ------------------------------------------------------------------------------------------
def test_a_plain_server_is_the_single_model_one(tmp_path, folders):
    assert catalog() is None
    assert catalog("-m", folders["minilm"], "--embedding") is None
    assert catalog("--config", write(tmp_path, "[*]\nembedding = true\nport = 8081\n")) is None


def test_a_preset_declares_models_in_order_with_kinds_and_aliases(tmp_path, folders):
    preset = write(tmp_path, f"""
[minilm]
model = {folders['minilm']}
alias = text-embedding-3-small, small
[tiny]
model = {folders['tiny']}
tags = test
[ce]
model = {folders['ce']}
reranking = true
""")
    models = catalog("--models-preset", preset).models
    assert [(m.id, m.kind) for m in models] == [("minilm", EMBEDDING), ("tiny", EMBEDDING), ("ce", RERANK)]
    assert models[0].aliases == ("small", "text-embedding-3-small") and models[0].names[0] == "minilm"
    assert models[1].tags == ("test",) and models[1].aliases == ()
    assert models[2].options.pooling is Pooling.RANK and models[2].options.model_path == folders["ce"]
    assert models[0].source == f"[minilm] in {preset}"
    assert all(m.settings.embedding for m in models)


def test_precedence_is_command_line_then_section_then_global(tmp_path, folders):
    preset = write(tmp_path, f"""
[*]
ctx-size = 1024
truncate = true
embd-normalize = 1
[a]
model = {folders['minilm']}
ctx-size = 2048
[b]
model = {folders['tiny']}
""")
    a, b = catalog("--models-preset", preset).models
    assert (a.options.ctx_size, b.options.ctx_size) == (2048, 1024)  # section over [*]
    assert a.options.truncate and b.options.truncate and b.settings.embd_normalize == 1
    a, b = catalog("--models-preset", preset, "-c", "4096", "--no-truncate").models
    assert (a.options.ctx_size, b.options.ctx_size) == (4096, 4096)  # the command line over both
    assert not a.options.truncate and not b.options.truncate
    a, b = catalog("--models-preset", preset, env={"LLAMA_ARG_CTX_SIZE": "512"}).models
    assert (a.options.ctx_size, b.options.ctx_size) == (512, 512)  # the environment counts as the command line


def test_the_command_lines_model_options_describe_the_m_model_only(tmp_path, folders):
    preset = write(tmp_path, f"[tiny]\nmodel = {folders['tiny']}\n")
    m, tiny = catalog("-m", folders["ce"], "--reranking", "--alias", "judge", "-ub", "128",
                      "--models-preset", preset).models
    assert (m.id, m.kind, m.aliases, m.source) == ("judge", RERANK, ("judge",), "-m")
    assert (tiny.kind, tiny.aliases, tiny.options.pooling) == (EMBEDDING, (), None)  # not --reranking's
    assert m.options.ubatch_tokens == tiny.options.ubatch_tokens == 128  # tuning applies to every model
    assert tiny.options.model_path == folders["tiny"] and tiny.options.hf_repo is None


def test_server_wide_options_are_the_servers(tmp_path, folders):
    preset = write(tmp_path, f"[a]\nmodel = {folders['minilm']}\n")
    (a,) = catalog("--models-preset", preset, "-t", "3", "--port", "9000", "--timeout", "7").models
    assert a.options.threads == 3 and a.settings.port == 9000 and a.settings.timeout == 7


def test_config_file_sections_declare_models_and_its_global_section_is_inherited(tmp_path, folders):
    config = write(tmp_path, f"""
[*]
port = 8090
ubatch-size = 256
model = {folders['tiny']}
[minilm]
model = {folders['minilm']}
[ce]
hf-repo = cross-encoder/ms-marco-MiniLM-L6-v2
reranking = true
load-on-startup = true
""", "config.ini")
    settings = parse_settings(["--config", config], {}, system_config_files=[])
    models = read_catalog(settings).models
    # [*]'s model is the -m model; a section never inherits another model's checkpoint
    assert [(m.id, m.kind) for m in models] == [(folders["tiny"], EMBEDDING), ("minilm", EMBEDDING), ("ce", RERANK)]
    assert [m.options.ubatch_tokens for m in models] == [256, 256, 256]
    assert models[2].options.hf_repo == "cross-encoder/ms-marco-MiniLM-L6-v2" and models[2].options.model_path is None
    assert [m.load_on_startup for m in models] == [False, False, True]
    assert settings.port == 8090


def test_a_section_named_after_a_model_needs_no_model_key(tmp_path, folders):
    preset = write(tmp_path, f"[{folders['minilm']}]\n[BAAI/bge-small-en-v1.5]\npooling = cls\n")
    local, hub = catalog("--models-preset", preset).models
    assert local.options.model_path == folders["minilm"] and local.id == folders["minilm"]
    assert hub.options.hf_repo == "BAAI/bge-small-en-v1.5" and hub.options.pooling is Pooling.CLS


def test_shorthands(folders):
    models = catalog("--embedding-model", f"{folders['minilm']}=small", "--embedding-model", "org/name",
                     "--reranker-model", f"{folders['ce']}=judge").models
    assert [(m.id, m.kind, m.source.split()[0]) for m in models] == [
        ("small", EMBEDDING, "--embedding-model"), ("org/name", EMBEDDING, "--embedding-model"),
        ("judge", RERANK, "--reranker-model")]
    assert models[0].options.model_path == folders["minilm"] and models[1].options.hf_repo == "org/name"
    env = {"LLAMA_ARG_RERANKER_MODEL": f"{folders['ce']}=judge,org/other"}
    assert [m.id for m in catalog(env=env).models] == ["judge", "org/other"]


def test_shorthands_take_gguf_files_and_quant_tags(tmp_path):
    gguf = tmp_path / "minilm-f16.gguf"
    gguf.write_bytes(b"GGUF")
    models = catalog("--embedding-model", f"{gguf}=mini", "--reranker-model", "org/ce-GGUF:Q8_0").models
    assert models[0].options.model_path == str(gguf) and models[1].options.hf_repo == "org/ce-GGUF:Q8_0"


def test_an_embedding_shorthand_does_not_inherit_rank_mode(tmp_path, folders):
    config = write(tmp_path, "[*]\nreranking = true\n", "config.ini")
    (model,) = catalog("--config", config, "--embedding-model", folders["minilm"]).models
    assert model.kind == EMBEDDING and model.options.pooling is None


def test_load_on_startup_defaults_from_the_global_section(tmp_path, folders):
    preset = write(tmp_path, f"""
[*]
load-on-startup = true
stop-timeout = 10
dedup-cache-models = true
[a]
model = {folders['minilm']}
[b]
model = {folders['tiny']}
load-on-startup = false
n-gpu-layers = 99
""")
    assert [m.load_on_startup for m in catalog("--models-preset", preset).models] == [True, False]


# -- config errors name the file, the section and the key -------------------------------------------------------
@pytest.mark.parametrize(("body", "expected"), [
    ("[a]\nmodel = {minilm}\nport = 9000\n", '[a] line 3: key "port": a server-wide option'),
    ("[a]\nmodel = {minilm}\nthreads = 2\n", '[a] line 3: key "threads": a server-wide option'),
    ("[*]\nhost = 0.0.0.0\n[a]\nmodel = {minilm}\n", '[*] line 2: key "host": a server-wide option'),
    ("[a]\nmodel = {minilm}\nwarp-speed = 9\n", '[a] line 3: key "warp-speed": no such option'),
    ("[*]\nmodel = {minilm}\n", '[*] line 2: key "model": names one model'),
    ("[a]\nmodel = {minilm}\npooling = median\n", '[a] line 3: key "pooling": invalid value'),
    ("[a]\nmodel = {minilm}\nload-on-startup = maybe\n", '[a] line 3: key "load-on-startup": expected true or false'),
    ("[a]\nmodel = {minilm}\nparallel = 0\n", "[a]: invalid value for -np, --parallel"),
    ("[not a model]\nubatch-size = 128\n", "[not a model]: no model (add model = FOLDER or hf-repo = ORG/NAME"),
    ("[a]\nmodel = {minilm}\n[b]\nmodel = {tiny}\nalias = a\n", 'the model name "a" is used twice: by [a] in'),
    ("[*]\nubatch-size = 128\n", "no models to serve"),
    ("[a\n", ":1: syntax error"),
])
def test_config_errors_are_clear(tmp_path, folders, body, expected):
    preset = write(tmp_path, body.format(**folders))
    message = config_error("--models-preset", preset)
    assert expected in message
    if "used twice" not in message and "no models" not in message:
        assert message.startswith(preset)


def test_shorthand_and_missing_file_errors(folders, tmp_path):
    assert "neither a model folder nor a Hugging Face repository" in config_error("--embedding-model", "/no/such")
    assert "expected REF or REF=ALIAS" in config_error("--embedding-model", f"{folders['minilm']}=")
    assert 'the model name "x" is used twice' in config_error(
        "--embedding-model", f"{folders['minilm']}=x", "--reranker-model", f"{folders['ce']}=x")
    assert "cannot read config file" in config_error("--models-preset", str(tmp_path / "missing.ini"))


def test_new_server_options_validate():
    assert "must be -1 (never)" in str(pytest.raises(SettingsError, parse_settings, ["--sleep-idle-seconds", "0"],
                                                     {}, system_config_files=[]).value)
    assert "must be 0 (no limit)" in str(pytest.raises(SettingsError, parse_settings, ["--models-max", "-1"],
                                                       {}, system_config_files=[]).value)
    settings = parse_settings([], {"LLAMA_ARG_MODELS_MAX": "2", "LLAMA_ARG_MODELS_PRESET": "p.ini"},
                              system_config_files=[])
    assert (settings.models_max, settings.models_preset, settings.sleep_idle_seconds) == (2, "p.ini", -1)
