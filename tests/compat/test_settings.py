"""Option resolution as llama-server does it (docs/llama-server-contract.md §7.1, §7.2, §7.4)."""
import logging
from pathlib import Path

import pytest

from compat import settings as settings_module
from compat.settings import resolver
from compat.settings import HelpRequested, Settings, SettingsError, format_help, option_table, parse_settings
from engine.types import DEFAULT_MODEL_NAME, EngineOptions, Pooling


def parse(argv=(), environ=None, files=()):
    """No real system config files: only the ones a test writes."""
    return parse_settings(list(argv), environ or {}, system_config_files=list(files))


def ini(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def messages(caplog, level=logging.WARNING):
    return [r.getMessage() for r in caplog.records if r.levelno == level]


# --- defaults and the Settings model ---------------------------------------------------------------------------

def test_defaults():
    s = parse()
    assert (s.host, s.port, s.api_prefix, s.api_key, s.timeout) == ("127.0.0.1", 8080, "", [], 3600)
    assert (s.ctx_size, s.batch_size, s.ubatch_size, s.parallel) == (0, 2048, 512, -1)
    assert (s.threads, s.threads_http) == (-1, -1)
    assert (s.embedding, s.reranking, s.pooling, s.embd_normalize, s.truncate) == (False, False, None, 2, False)
    assert (s.metrics, s.props, s.slots) == (False, False, True)
    assert (s.cors_origins, s.cors_methods, s.cors_headers, s.cors_credentials) == (
        "*", "GET, POST, DELETE, OPTIONS", "*", True)
    assert (s.verbosity, s.log_disable, s.log_file, s.config) == (3, False, None, None)
    assert (s.max_batch_tokens, s.max_batch_rows, s.max_queue_items) == (512, 64, 4096)
    assert (s.model, s.hf_repo, s.offline, s.alias, s.tags) == (None, None, False, [], [])
    assert s == Settings()


def test_settings_reads_no_environment_itself(monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_PORT", "1234")
    monkeypatch.setenv("PORT", "1234")
    assert Settings().port == 8080


def test_settings_validates_types_and_sorts_sets():
    assert Settings(alias=["b", "a", "b"]).alias == ["a", "b"]
    with pytest.raises(ValueError):
        Settings(port="eighty")
    with pytest.raises(ValueError):
        Settings(no_such_option=1)


# --- precedence ------------------------------------------------------------------------------------------------

def test_every_layer_in_order(tmp_path):
    system = ini(tmp_path, "etc.ini", "[*]\nport = 1\nctx-size = 10\nhost = sys\nthreads = 1\ntimeout = 1\n")
    user = ini(tmp_path, "user.ini", "[*]\nport = 2\nctx-size = 20\nhost = user\nthreads = 2\n")
    config = ini(tmp_path, "config.ini", "port = 3\nctx-size = 30\nthreads = 3\n")
    env = {"LLAMA_ARG_PORT": "4", "LLAMA_ARG_CTX_SIZE": "40"}
    s = parse(["--port", "5", "--config", str(config)], env, files=[system, user])
    assert (s.port, s.ctx_size, s.threads, s.host, s.timeout) == (5, 40, 3, "user", 1)
    assert s.config == str(config)


def test_default_system_paths_come_from_xdg_or_home(tmp_path, monkeypatch):
    monkeypatch.setattr(resolver, "SYSTEM_CONFIG_FILE", ini(tmp_path, "etc/config.ini", "port = 1\nc = 1\n"))
    ini(tmp_path, "home/.config/llama.cpp/config.ini", "port = 2\n")
    ini(tmp_path, "xdg/llama.cpp/config.ini", "port = 3\n")
    home, xdg = str(tmp_path / "home"), str(tmp_path / "xdg")
    assert parse_settings([], {}).port == 1
    assert parse_settings([], {"HOME": home}).port == 2
    assert parse_settings([], {"HOME": home, "XDG_CONFIG_HOME": xdg}).port == 3
    assert parse_settings([], {"HOME": home, "XDG_CONFIG_HOME": ""}).port == 2  # ${XDG_CONFIG_HOME:-...}
    assert parse_settings([], {"HOME": home}).ctx_size == 1  # the /etc file still applies below


def test_missing_system_files_are_skipped(tmp_path):
    assert parse([], files=[tmp_path / "nope.ini"]).port == 8080


def test_config_from_environment_and_command_line(tmp_path):
    from_env = ini(tmp_path, "env.ini", "port = 1\nhost = env-file\n")
    from_cli = ini(tmp_path, "cli.ini", "port = 2\n")
    s = parse([], {"LLAMA_ARG_CONFIG": str(from_env)})
    assert (s.port, s.host, s.config) == (1, "env-file", str(from_env))
    s = parse(["--config", str(from_cli)], {"LLAMA_ARG_CONFIG": str(from_env)})
    assert (s.port, s.host, s.config) == (2, "127.0.0.1", str(from_cli))  # only the command line's file is read


def test_config_file_is_below_the_environment_even_when_named_on_the_command_line(tmp_path):
    config = ini(tmp_path, "c.ini", "port = 3\nhost = file\n")
    s = parse(["--config", str(config)], {"LLAMA_ARG_PORT": "4"})
    assert (s.port, s.host) == (4, "file")


def test_missing_config_file_is_an_error(tmp_path):
    missing = tmp_path / "missing.ini"
    with pytest.raises(SettingsError, match="missing.ini"):
        parse(["--config", str(missing)])
    with pytest.raises(SettingsError, match="missing.ini"):
        parse([], {"LLAMA_ARG_CONFIG": str(missing)})


def test_accumulating_option_from_a_higher_layer_replaces_a_lower_one(tmp_path):
    config = ini(tmp_path, "c.ini", "alias = zed\napi-key = file-key\n")
    assert parse(["--config", str(config)]).alias == ["zed"]
    s = parse(["--config", str(config), "--alias", "b", "--alias", "a"], {"LLAMA_API_KEY": "env-key"})
    assert (s.alias, s.api_key) == (["a", "b"], ["env-key"])


# --- environment -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["on", "enabled", "true", "1"])
def test_env_truthy_turns_flags_on(value):
    s = parse([], {"LLAMA_ARG_ENDPOINT_METRICS": value, "LLAMA_ARG_EMBEDDINGS": value, "LLAMA_ARG_OFFLINE": value})
    assert (s.metrics, s.embedding, s.offline) == (True, True, True)


@pytest.mark.parametrize("value", ["off", "0", "yes", "TRUE", "On", " 1", ""])
def test_env_flag_only_options_ignore_anything_not_truthy(value):
    assert parse([], {"LLAMA_ARG_ENDPOINT_METRICS": value}).metrics is False


def test_env_cannot_turn_a_flag_off(tmp_path):
    config = ini(tmp_path, "c.ini", "metrics = 1\n")
    assert parse(["--config", str(config)], {"LLAMA_ARG_ENDPOINT_METRICS": "0"}).metrics is True


@pytest.mark.parametrize(("value", "expected"), [
    ("on", True), ("enabled", True), ("true", True), ("1", True),
    ("off", False), ("disabled", False), ("false", False), ("0", False),
])
def test_env_paired_options(value, expected):
    s = parse([], {"LLAMA_ARG_ENDPOINT_SLOTS": value, "LLAMA_ARG_TRUNCATE": value, "LLAMA_ARG_CORS_CREDENTIALS": value})
    assert (s.slots, s.truncate, s.cors_credentials) == (expected, expected, expected)


@pytest.mark.parametrize("value", ["yes", "True", "", "2"])
def test_env_paired_option_rejects_other_values(value):
    with pytest.raises(SettingsError) as caught:
        parse([], {"LLAMA_ARG_ENDPOINT_SLOTS": value})
    assert str(caught.value) == (
        'error while handling environment variable "LLAMA_ARG_ENDPOINT_SLOTS": invalid boolean value')


@pytest.mark.parametrize("value", ["", "1", "garbage"])
def test_env_no_form_forces_false_and_wins(value):
    s = parse([], {"LLAMA_ARG_NO_ENDPOINT_SLOTS": value, "LLAMA_ARG_ENDPOINT_SLOTS": "1",
                   "LLAMA_ARG_NO_TRUNCATE": value, "LLAMA_ARG_NO_CORS_CREDENTIALS": value})
    assert (s.slots, s.truncate, s.cors_credentials) == (False, False, False)
    assert parse([], {"LLAMA_ARG_NO_ENDPOINT_SLOTS": value, "LLAMA_ARG_ENDPOINT_SLOTS": "bad"}).slots is False


@pytest.mark.parametrize(("value", "expected"), [("12abc", 12), ("  -5", -5), ("+7", 7), ("0x10", 0), ("9.9", 9)])
def test_env_integers_parse_like_stoi(value, expected):
    assert parse([], {"LLAMA_ARG_PORT": value}).port == expected


@pytest.mark.parametrize("value", ["abc", "", "-", "99999999999"])
def test_env_integer_garbage_is_an_error(value):
    with pytest.raises(SettingsError, match='error while handling environment variable "LLAMA_ARG_PORT"'):
        parse([], {"LLAMA_ARG_PORT": value})


def test_env_values_every_kind():
    s = parse([], {
        "LLAMA_ARG_HOST": " spaced ", "LLAMA_ARG_MODEL": "./m", "LLAMA_ARG_POOLING": "cls",
        "LLAMA_API_KEY": "k1, k2,,", "LLAMA_ARG_ALIAS": "b,a", "LLAMA_ARG_TAGS": "t",
        "LLAMA_ARG_BATCH": "64", "LLAMA_ARG_UBATCH": "32", "LLAMA_ARG_N_PARALLEL": "2",
        "LLAMA_ARG_LOG_VERBOSITY": "4", "LLAMA_ARG_MAX_QUEUE_ITEMS": "9",
    })
    assert (s.host, s.model, s.pooling) == (" spaced ", "./m", Pooling.CLS)  # strings are verbatim
    assert (s.api_key, s.alias, s.tags) == (["k1", "k2"], ["a", "b"], ["t"])
    assert (s.batch_size, s.ubatch_size, s.parallel, s.verbosity, s.max_queue_items) == (64, 32, 2, 4, 9)


def test_env_options_without_env_names_are_not_read():
    assert parse([], {"LLAMA_ARG_EMBD_NORMALIZE": "1", "LLAMA_ARG_VERBOSE": "1"}).embd_normalize == 2
    assert parse([], {"LLAMA_ARG_LOG_DISABLE": "1", "LLAMA_ARG_N_GPU_LAYERS": "x"}).log_disable is False


def test_env_reranking_implies_embedding_and_rank():
    s = parse([], {"LLAMA_ARG_RERANKING": "1", "LLAMA_ARG_POOLING": "mean"})
    assert (s.reranking, s.embedding, s.pooling) == (True, True, Pooling.RANK)
    assert parse(["--pooling", "mean"], {"LLAMA_ARG_RERANKING": "1"}).pooling is Pooling.MEAN


def test_env_bad_pooling():
    with pytest.raises(SettingsError, match='environment variable "LLAMA_ARG_POOLING": invalid value'):
        parse([], {"LLAMA_ARG_POOLING": "MEAN"})


def test_command_line_overriding_env_warns(caplog):
    caplog.set_level(logging.INFO)
    s = parse(["--port", "5", "--no-slots"], {"LLAMA_ARG_PORT": "4", "LLAMA_ARG_NO_ENDPOINT_SLOTS": "1"})
    assert (s.port, s.slots) == (5, False)
    assert messages(caplog) == [
        "warn: LLAMA_ARG_PORT environment variable is set, but will be overwritten by command line argument --port",
        "warn: LLAMA_ARG_ENDPOINT_SLOTS environment variable is set, but will be overwritten by command line "
        "argument --no-slots",
    ]


def test_no_warning_without_env(caplog):
    parse(["--port", "5"], {"LLAMA_ARG_HOST": "x"})
    assert messages(caplog) == []


# --- command line ----------------------------------------------------------------------------------------------

def test_every_spelling_of_a_value():
    assert parse(["-c", "5"]).ctx_size == 5
    assert parse(["--ctx-size", "5"]).ctx_size == 5
    assert parse(["--ctx_size", "5"]).ctx_size == 5
    assert parse(["--ctx-size=5"]).ctx_size == 5
    assert parse(["--ctx_size=5"]).ctx_size == 5
    assert parse(["-c=5"]).ctx_size == 5
    assert parse(["--api-key=a=b"]).api_key == ["a=b"]  # only the first '=' splits
    assert parse(["--api_prefix", "/x_y"]).api_prefix == "/x_y"  # values keep their underscores
    assert parse(["--threads", "-4"]).threads == -4  # a value may start with '-'


def test_short_and_long_flags():
    s = parse(["-m", "m", "-hfr", "org/r", "-a", "x", "-b", "8", "-ub", "4", "-np", "3", "-t", "2", "-to", "9",
               "-lv", "1", "--embeddings", "--rerank", "--metrics", "--props", "--offline", "--log-disable",
               "--log-file", "f.log", "--tags", "t1,t2", "--embd-normalize", "-1", "--host", "h", "--api-prefix",
               "/p", "--threads-http", "7", "--cors-origins", "o", "--cors-methods", "GET", "--cors-headers", "hd",
               "--max-batch-tokens", "100", "--max-batch-rows", "10", "--max-queue-items", "11"])
    assert (s.model, s.hf_repo, s.alias, s.tags) == ("m", "org/r", ["x"], ["t1", "t2"])
    assert (s.batch_size, s.ubatch_size, s.parallel, s.threads, s.timeout, s.verbosity) == (8, 4, 3, 2, 9, 1)
    assert (s.embedding, s.reranking, s.metrics, s.props, s.offline, s.log_disable) == (True,) * 6
    assert (s.log_file, s.embd_normalize, s.host, s.api_prefix, s.threads_http) == ("f.log", -1, "h", "/p", 7)
    assert (s.cors_origins, s.cors_methods, s.cors_headers) == ("o", "GET", "hd")
    assert (s.max_batch_tokens, s.max_batch_rows, s.max_queue_items) == (100, 10, 11)


def test_paired_flags():
    s = parse(["--no-slots", "--no-cors-credentials", "--truncate"])
    assert (s.slots, s.cors_credentials, s.truncate) == (False, False, True)
    assert parse(["--no_slots", "--slots"]).slots is True  # last one wins
    assert parse(["--truncate", "--no-truncate"]).truncate is False


@pytest.mark.parametrize("argv", [["--foo"], ["--foo=1"], ["model.safetensors"], ["--models-presets", "p.ini"],
                                  ["--model-max", "2"], ["-embedding"], ["--ctx"]])
def test_unknown_argument(argv):
    with pytest.raises(SettingsError) as caught:
        parse(argv)
    assert str(caught.value) == f"invalid argument: {argv[0]}"


@pytest.mark.parametrize("flag", ["--port", "-m", "--api-key", "-ngl"])
def test_missing_value(flag):
    with pytest.raises(SettingsError) as caught:
        parse(["--metrics", flag])
    assert str(caught.value) == f'error while handling argument "{flag}": expected value for argument'


def test_flag_given_a_value():
    with pytest.raises(SettingsError, match='argument "--metrics": this option takes no value'):
        parse(["--metrics=1"])


def test_bad_values():
    with pytest.raises(SettingsError) as caught:
        parse(["--pooling", "foo"])
    assert str(caught.value).startswith('error while handling argument "--pooling": invalid value \'foo\'')
    with pytest.raises(SettingsError, match='error while handling argument "--port": invalid integer'):
        parse(["--port", "eighty"])
    with pytest.raises(SettingsError, match='error while handling argument "-b": invalid integer'):
        parse(["-b", ""])
    assert parse(["--port", "81st"]).port == 81  # std::stoi, as llama


@pytest.mark.parametrize("pooling", list(Pooling))
def test_every_pooling(pooling):
    assert parse(["--pooling", pooling.value]).pooling is pooling


def test_parallel_zero_is_rejected():
    with pytest.raises(SettingsError, match="-np, --parallel"):
        parse(["-np", "0"])
    with pytest.raises(SettingsError, match="-np, --parallel"):
        parse([], {"LLAMA_ARG_N_PARALLEL": "0"})


def test_accumulating_options():
    s = parse(["--api-key", "a,b", "--api-key", " c ", "--alias", "tinyllama-2,fim", "-a", "code, fim",
               "--tags", "x", "--tags", "w,x"])
    assert s.api_key == ["a", "b", "c"]
    assert s.alias == ["code", "fim", "tinyllama-2"]
    assert s.tags == ["w", "x"]


def test_reranking_implies_embedding_and_rank_pooling_in_order():
    s = parse(["--reranking"])
    assert (s.reranking, s.embedding, s.pooling) == (True, True, Pooling.RANK)
    assert parse(["--pooling", "mean", "--rerank"]).pooling is Pooling.RANK
    assert parse(["--rerank", "--pooling", "mean"]).pooling is Pooling.MEAN  # handlers run in order, as llama


def test_verbose_sets_verbosity_5():
    for flag in ("-v", "--verbose", "--log-verbose"):
        s = parse([flag])
        assert (s.verbose, s.verbosity) == (True, 5)
    assert parse(["-v", "-lv", "2"]).verbosity == 2


def test_help():
    for flag in ("-h", "--help", "--usage"):
        with pytest.raises(HelpRequested) as caught:
            parse(["--port", "1", flag, "--bogus"])
        assert caught.value.text == format_help()


# --- ignored llama-server options ------------------------------------------------------------------------------

def test_ignored_options_with_and_without_values(caplog):
    caplog.set_level(logging.INFO)
    argv = ["-ngl", "99", "--jinja", "-m", "m", "--temp", "0", "-s", "42", "-fa", "on", "--n_gpu_layers", "1",
            "-cb", "--no-webui", "--ctx-size", "64", "--models-dir", "d", "--spec-type=ngram", "-dev", "none",
            "--reasoning-format", "none", "--no-mmap", "--kv-unified", "--tools", "all", "-hft", "tok"]
    s = parse(argv)
    assert (s.model, s.ctx_size) == ("m", 64)
    assert messages(caplog, logging.INFO) == [f"ignoring {flag}: not used by mlx-embed-server" for flag in [
        "-ngl", "--jinja", "--temp", "-fa", "-cb", "--no-webui", "--models-dir", "--spec-type", "-dev",
        "--reasoning-format", "--no-mmap", "--kv-unified", "--tools", "-hft"]]  # once per option


@pytest.mark.parametrize(("argv", "model"), [
    (["--log-colors", "on", "-m", "m"], "m"),
    (["--log-colors", "auto", "-m", "m"], "m"),
    (["--log-colors", "-m", "m"], "m"),
    (["--log-colors=off", "-m", "m"], "m"),
    (["-m", "m", "--log-colors"], "m"),
])
def test_log_colors_value_is_optional(argv, model):
    assert parse(argv).model == model


@pytest.mark.parametrize(("value", "seed"), [
    ("42", 42), ("-1", 4294967295), ("4294967295", 4294967295), ("4294967296", 0), ("-2", 4294967294),
    (" +7x", 7),  # std::stoul: leading blanks, a sign, trailing garbage dropped
])
def test_seed_is_read_as_llama_reads_it(value, seed):
    assert parse(["--seed", value]).seed == seed
    assert parse(["-s", value]).seed == seed


def test_seed_defaults_to_llamas_and_refuses_what_stoul_refuses(tmp_path):
    assert parse().seed == 4294967295  # LLAMA_DEFAULT_SEED
    assert parse(files=[ini(tmp_path, "c.ini", "seed = 3\n")]).seed == 3
    for bad in ("x", "", str(2**64)):
        with pytest.raises(SettingsError):
            parse(["--seed", bad])


def test_ignored_options_env_is_not_read():
    assert parse([], {"LLAMA_ARG_N_GPU_LAYERS": "garbage", "LLAMA_ARG_JINJA": "maybe"}) == Settings()


# --- image token bounds ----------------------------------------------------------------------------------------

def test_image_token_bounds_from_every_layer(tmp_path):
    assert (parse().image_min_tokens, parse().image_max_tokens) == (-1, -1)  # the checkpoint's bounds
    options = parse(["--image-min-tokens", "64", "--image-max-tokens", "256"]).engine_options("m")
    assert (options.image_min_tokens, options.image_max_tokens) == (64, 256)
    s = parse([], {"LLAMA_ARG_IMAGE_MIN_TOKENS": "8", "LLAMA_ARG_IMAGE_MAX_TOKENS": "1024"})
    assert (s.image_min_tokens, s.image_max_tokens) == (8, 1024)
    s = parse(files=[ini(tmp_path, "c.ini", "image-max-tokens = 300\n")])
    assert (s.image_min_tokens, s.image_max_tokens) == (-1, 300)
    assert parse(["--image-min-tokens", "500", "--image-max-tokens", "0"]).image_max_tokens == 0  # 0: unset


def test_image_min_tokens_above_the_max_is_refused():
    with pytest.raises(SettingsError, match=r"invalid value for --image-max-tokens: 100 is below "
                                            r"--image-min-tokens \(200\)"):
        parse(["--image-min-tokens", "200", "--image-max-tokens", "100"])


# --- config files ----------------------------------------------------------------------------------------------

def test_ini_sections_that_apply(tmp_path):
    path = ini(tmp_path, "c.ini", "port = 1\n[*]\nhost = star\n[default]\nctx-size = 7\n"
                                  "[some/model]\nthreads = 9\n[other]\nport = 99\n")
    s = parse(files=[path])
    assert (s.port, s.host, s.ctx_size, s.threads) == (1, "star", 7, -1)


def test_ini_key_spellings(tmp_path):
    path = ini(tmp_path, "c.ini", "; comment\nc = 5   # short name\nLLAMA_ARG_PORT = 9 ; env name\n"
                                  "ubatch_size = 16\nhfr = org/repo\nrerank = 1\nversion = 1\n")
    s = parse(files=[path])
    assert (s.ctx_size, s.port, s.ubatch_size, s.hf_repo) == (5, 9, 16, "org/repo")
    assert (s.reranking, s.embedding, s.pooling) == (True, True, Pooling.RANK)


@pytest.mark.parametrize(("line", "slots"), [
    ("slots = true", True), ("slots = off", False), ("slots = yes", False),  # llama truthiness: the rest is false
    ("no-slots = true", False), ("no-slots = 1", False), ("no-slots = false", True), ("no-slots = no", True),
    ("LLAMA_ARG_ENDPOINT_SLOTS = 0", False),
])
def test_ini_paired_options(tmp_path, line, slots):
    assert parse(files=[ini(tmp_path, "c.ini", line + "\n")]).slots is slots


@pytest.mark.parametrize("value", ["1", "false", "off", ""])
def test_ini_flag_applies_whatever_its_value(tmp_path, value):
    s = parse(files=[ini(tmp_path, "c.ini", f"metrics = {value}\nLLAMA_ARG_EMBEDDINGS = {value}\n")])
    assert (s.metrics, s.embedding) == (True, True)


def test_ini_accumulating_and_api_key_file(tmp_path):
    keys = ini(tmp_path, "keys.txt", "# team keys\nk2\n\n  k3  \n")
    s = parse(files=[ini(tmp_path, "c.ini", f"api-key = k1\napi-key-file = {keys}\nalias = b, a\n")])
    assert (s.api_key, s.alias, s.api_key_file) == (["k1", "k2", "k3"], ["a", "b"], str(keys))


def test_ini_unknown_key_warns_with_file_and_key(tmp_path, caplog):
    path = ini(tmp_path, "c.ini", "[*]\nport = 1\nno-such-option = 3\n")
    assert parse(files=[path]).port == 1
    assert messages(caplog) == [f"{path}:3: unknown key 'no-such-option' ignored"]


def test_ini_ignored_option_is_logged_not_warned(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    path = ini(tmp_path, "c.ini", "n-gpu-layers = 99\njinja = on\n")
    assert parse(files=[path]) == Settings()
    assert messages(caplog) == []
    assert "ignoring n-gpu-layers: not used by mlx-embed-server" in messages(caplog, logging.INFO)


def test_ini_config_key_does_not_chain(tmp_path, caplog):
    other = ini(tmp_path, "other.ini", "port = 2\n")
    path = ini(tmp_path, "c.ini", f"config = {other}\n")
    s = parse(files=[path])
    assert (s.port, s.config) == (8080, None)
    assert messages(caplog) == [f"{path}:1: key 'config' ignored in a config file"]


def test_ini_bad_value_names_file_key_and_line(tmp_path):
    path = ini(tmp_path, "c.ini", "\nport = http\n")
    with pytest.raises(SettingsError) as caught:
        parse(files=[path])
    assert str(caught.value) == f"error while handling key \"port\" in {path} line 2: invalid integer 'http'"


def test_ini_syntax_error_names_file_and_line(tmp_path):
    path = ini(tmp_path, "c.ini", "[*]\nport: 1\n")
    with pytest.raises(SettingsError, match=f"{path}:2: syntax error"):
        parse(files=[path])


# --- api-key-file ----------------------------------------------------------------------------------------------

def test_api_key_file(tmp_path):
    keys = ini(tmp_path, "keys.txt", "# comment\nkey-one\n\nkey-two\r\n#key-three\n")
    s = parse(["--api-key", "cli", "--api-key-file", str(keys)])
    assert s.api_key == ["cli", "key-one", "key-two"]
    assert parse([], {"LLAMA_ARG_API_KEY_FILE": str(keys), "LLAMA_API_KEY": "env"}).api_key == [
        "env", "key-one", "key-two"]


def test_api_key_file_missing(tmp_path):
    missing = tmp_path / "none.txt"
    with pytest.raises(SettingsError) as caught:
        parse(["--api-key-file", str(missing)])
    assert str(caught.value).startswith(
        f"error while handling argument \"--api-key-file\": failed to open file '{missing}'")


# --- derived values --------------------------------------------------------------------------------------------

def test_model_name():
    assert parse(["--alias", "tinyllama-2,fim,code", "-m", "x"]).model_name == "code"
    assert parse(["-hf", "org/repo:Q8_0", "-m", "./x"]).model_name == "org/repo:Q8_0"
    assert parse(["-m", "./models/x/"]).model_name == "./models/x/"  # exactly as typed
    assert parse().model_name == DEFAULT_MODEL_NAME


def test_n_ubatch_and_engine_options():
    s = parse(["-b", "256", "-ub", "512", "-c", "1024", "-np", "2", "--pooling", "rank", "--truncate", "-t", "3",
               "--max-batch-tokens", "100", "--max-batch-rows", "5", "--max-queue-items", "6", "-hf", "o/r",
               "--offline"])
    assert s.n_ubatch == 256
    assert parse(["-b", "4096"]).n_ubatch == 512
    assert s.engine_options("/models/x") == EngineOptions(
        model_path="/models/x", hf_repo="o/r", offline=True, pooling=Pooling.RANK, ubatch_tokens=256,
        ctx_size=1024, parallel=2, truncate=True, max_batch_tokens=100, max_batch_rows=5, max_queue_items=6,
        threads=3)
    assert parse().engine_options(None) == EngineOptions()


# --- help and the option table ---------------------------------------------------------------------------------

def test_help_lists_every_option_with_its_env_and_groups_in_order():
    text = format_help()
    for row in option_table():
        line = next(ln for ln in text.splitlines() if ln.startswith("  " + ", ".join(row["flags"])))
        if row["env"]:
            assert f"[env: {row['env']}]" in line
        assert row["help"] in line
    positions = [text.index(f"\n{group}:\n") for group in settings_module.GROUPS]
    assert positions == sorted(positions)
    assert "  -m, --model PATH" in text
    assert "--port PORT" in text and "(default: 8080) [env: LLAMA_ARG_PORT]" in text
    assert "  --slots, --no-slots" in text
    assert "--log-colors [on|off|auto]" in text


def test_option_table():
    rows = option_table()
    by_key = {row["config_key"]: row for row in rows}
    assert len(by_key) == len(rows)
    assert {row["config_key"] for row in rows if row["group"] != "ignored-for-compatibility"} == {
        name.replace("_", "-") for name in Settings.model_fields}
    assert by_key["ctx-size"] == {
        "flags": ["-c", "--ctx-size"], "env": "LLAMA_ARG_CTX_SIZE", "config_key": "ctx-size", "default": 0,
        "help": "context size of all slots together; 0 = the model's own", "group": "batching", "kind": "value",
        "per_model": True}
    assert not by_key["port"]["per_model"] and not by_key["threads"]["per_model"]
    assert by_key["api-key"]["env"] == "LLAMA_API_KEY"
    assert by_key["embd-normalize"]["env"] is None
    assert by_key["slots"]["flags"] == ["--slots", "--no-slots"]
    assert by_key["slots"]["env"] == "LLAMA_ARG_ENDPOINT_SLOTS"
    assert by_key["reranking"]["flags"] == ["--reranking", "--rerank"]
    assert by_key["gpu-layers"]["group"] == "ignored-for-compatibility"


def test_offline_commands_read_their_command_line_only(monkeypatch):
    """Variables named after fields (a Ray cluster shell sets RAY_ADDRESS) must not become options."""
    from compat.settings import EmbedCommand, RerankCommand, parse_command

    for name, value in {"RAY_ADDRESS": "10.0.0.1:6379", "THREADS": "7", "TRUNCATE": "true", "INPUT": "/etc/passwd",
                        "MODEL": "/nowhere", "QUIET": "true"}.items():
        monkeypatch.setenv(name, value)
    embed = parse_command(EmbedCommand, ["-p", "x"])
    assert (embed.ray_address, embed.threads, embed.truncate, embed.input, embed.model, embed.quiet) == \
        (None, -1, False, None, None, False)
    assert parse_command(RerankCommand, ["-q", "q", "-d", "d"]).threads == -1


def test_offline_commands_pass_their_shared_options_to_the_engine_as_the_server_does():
    """The engine options of mlx-embed / mlx-rerank come from their shared_option declarations through
    Settings.engine_options: the same EngineOptions values a server with the same flags runs with."""
    from compat.settings import EmbedCommand, RerankCommand, parse_command

    flags = ["--offline", "-ub", "128", "--truncate", "--max-seq", "100", "-t", "3", "--image-min-tokens", "64",
             "--image-max-tokens", "256"]
    embed = parse_command(EmbedCommand, ["-m", "/m", "-p", "x", "--pooling", "cls", "--max-batch-tokens", "2048",
                                         "--dimensions", "8", "--embd-normalize", "1", "--batch-size", "4", *flags])
    server = parse_settings(["-m", "/m", "--embedding", "--pooling", "cls", "--max-batch-tokens", "2048", *flags],
                            {}, system_config_files=[]).engine_options(None)
    assert embed.engine_kwargs() == {name: getattr(server, name) for name in (
        "offline", "pooling", "ubatch_tokens", "truncate", "max_batch_tokens", "max_seq", "threads",
        "image_min_tokens", "image_max_tokens")}
    assert embed.encode_kwargs() == {"normalize": 1, "dimensions": 8, "prompt_name": None, "instruction": None,
                                     "batch_size": 4, "task": None}
    rerank = parse_command(RerankCommand, ["-hf", "org/name", "-q", "q", "-d", "d", "--rerank-sigmoid", *flags])
    assert rerank.engine_kwargs() == {"offline": True, "ubatch_tokens": 128, "truncate": True, "max_seq": 100,
                                      "threads": 3, "image_min_tokens": 64, "image_max_tokens": 256,
                                      "rerank_sigmoid": True}
    assert rerank.engine_settings().hf_repo == "org/name"  # the model reference goes to the loader, not here


@pytest.mark.parametrize("text, value", [("0", 0), ("123456", 123456), ("4G", 4 * 2**30), ("512M", 512 * 2**20),
                                         ("1.5GiB", 3 * 2**29), ("4GB", 4_000_000_000), ("2 k", 2048),
                                         ("64KiB", 65536), ("1t", 2**40)])
def test_models_memory_reads_bytes_or_a_unit(text, value):
    assert parse(["--models-memory", text]).models_memory == value
    assert parse(environ={"LLAMA_ARG_MODELS_MEMORY_FLOOR": text}).models_memory_floor == value


def test_models_memory_from_a_config_file_and_its_errors(tmp_path):
    settings = parse(files=[ini(tmp_path, "c.ini", "models-memory = 8G\nmodels-memory-floor = 2G\n")])
    assert (settings.models_memory, settings.models_memory_floor) == (8 * 2**30, 2 * 2**30)
    for text in ("1.5", "4Q", "G", "-1", "4 G B"):
        with pytest.raises(SettingsError, match="invalid amount of memory"):
            parse(["--models-memory", text])
