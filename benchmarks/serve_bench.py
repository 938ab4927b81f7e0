"""Serving benchmark: our server over HTTP against sentence-transformers, onnxruntime and (optionally) llama-server.

    .venv/bin/python benchmarks/serve_bench.py [--quick] [--duration S] [--requests N] [--model DIR]
        [--reranker DIR] [--skip-onnx] [--skip-st] [--skip-rerank] [--out PATH]
        [--llama-server-bin PATH --gguf PATH [--rerank-gguf PATH] [--llama-server-args "..."]]

One invocation measures, on the same weights and the same seeded texts:
- our server (a subprocess on 127.0.0.1) with 1, 4 and 16 concurrent clients, requests of 1 and 32 texts,
  short (~12 words) and long (~200 tokens) texts, and a rerank load (1 query x 20 documents);
- sentence-transformers (torch CPU) and onnxruntime (MiniLM exported with torch.onnx) in-process, one caller,
  the same batches; sentence-transformers' CrossEncoder for the rerank load; llama-server when given;
- startup to ready, and the engine alone in tokens per CPU-second against onnxruntime and torch (1 thread).
Every figure is printed as a ratio to ours, and benchmarks/BASELINES.md (or --out) is rewritten from scratch.
Baselines run in worker processes (this script with --worker) so that each has its own memory and threads.
Every load loop is bounded by a request count and a duration and stops by itself. See benchmarks/README.md.
This script owns its scenarios, the in-process baseline workers, the targets, the report and the command line;
the server processes, texts, HTTP clients, bounded load, RSS sampling and tables are benchmarks/harness.py's.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # `engine` and `compat` from this checkout, installed or not

from benchmarks.harness import (  # noqa: E402
    DOC_TOKENS,
    RERANK_DOCS,
    SHORT_WORDS,
    Call,
    MeasuredServer,
    Measurement,
    RssSampler,
    Scenario,
    bounded_load,
    exact_token_lists,
    free_port,
    http_embed_client,
    http_rerank_client,
    llama_argv,
    load_tokenizer,
    machine_lines,
    make_texts,
    our_server_argv,
    print_scenario,
    ratio,
    request_texts,
    scenario_table,
    token_counts,
    warm_http,
)

DEFAULT_RERANKER = Path("/work/shared/fixtures/bert-tiny-ce-distilled")
CONCURRENCY = (1, 4, 16)
BATCHES = (1, 32)
ENGINE_LENGTHS = (32, 128)  # engine-level tokens per CPU-second, 32 inputs of exactly this many tokens
ENGINE_ROWS = 32
SINGLE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# ---------------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class CpuFigure:
    """Engine-level: tokens per CPU-second of one engine on one input shape, a single BLAS/intra-op thread."""

    engine: str
    shape: str
    tokens: int
    cpu_s: float
    wall_s: float
    calls: int

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s if self.cpu_s > 0 else 0.0


# ---------------------------------------------------------------------------------------------------------------
# In-process baselines, each in a worker process (this script with --worker KIND --spec FILE --result FILE)
# ---------------------------------------------------------------------------------------------------------------
def ready() -> None:
    """Tell the parent the engine is loaded and has answered once (its 'startup to ready')."""
    print("READY", flush=True)


def mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(hidden.dtype)
    pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


class OrtEmbedder:
    """The exported MiniLM under onnxruntime: tokenizers -> session -> mean pooling + L2 in numpy."""

    def __init__(self, onnx_path: str, model_dir: str, threads: int = 0):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads > 0:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        self.names = {i.name for i in self.session.get_inputs()}
        self.tok = load_tokenizer(Path(model_dir))
        pad_id = self.tok.token_to_id("[PAD]") or 0
        self.tok.enable_padding(pad_id=pad_id, pad_token="[PAD]")

    def run_ids(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self.session.run(None, feeds)[0]
        return mean_pool_normalize(hidden, mask)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        encs = self.tok.encode_batch(list(texts))
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        return self.run_ids(ids, mask)


def worker_sampler() -> RssSampler:
    return RssSampler(os.getpid())


def worker_embed_scenarios(spec: dict[str, Any], engine: str, encode: Callable[[list[str]], Any]) -> list[dict]:
    """Run every embedding scenario of the spec in this process, one caller, bounded like the HTTP loads."""
    sampler = worker_sampler()
    out = []
    for sc in spec["scenarios"]:
        pool, counts, batch = sc["texts"], sc["tokens"], sc["batch"]
        token_of = dict(zip(pool, counts))
        encode(request_texts(pool, batch, 0))  # warm this shape

        def make() -> Call:
            def call(i: int) -> tuple[int, int]:
                texts = request_texts(pool, batch, i)
                encode(texts)
                return batch, sum(token_of[t] for t in texts)
            return call

        m = bounded_load(engine, make, 1, spec["max_requests"], spec["duration"], sampler)
        out.append({"key": sc["key"], "measurement": asdict(m)})
    sampler.close()
    return out


def worker_st(spec: dict[str, Any]) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(spec["model"], device="cpu")
    model.encode(["warm up"])
    ready()

    def encode(texts: list[str]) -> Any:
        # A one-text request is the direct single-text call; larger ones encode with batch_size=32.
        return model.encode(texts[0]) if len(texts) == 1 else model.encode(texts, batch_size=32)

    return worker_embed_scenarios(spec, "sentence-transformers (in-process)", encode)


def worker_ort(spec: dict[str, Any]) -> list[dict]:
    embedder = OrtEmbedder(spec["onnx"], spec["model"])
    embedder.encode(["warm up"])
    ready()

    def encode(texts: list[str]) -> Any:
        # Same batches as sentence-transformers: chunks of 32, each padded to its longest text.
        return [embedder.encode(texts[j:j + 32]) for j in range(0, len(texts), 32)]

    return worker_embed_scenarios(spec, "onnxruntime (in-process)", encode)


def worker_ce(spec: dict[str, Any]) -> list[dict]:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(spec["model"], device="cpu")
    model.predict([("warm", "up")])
    ready()
    sampler = worker_sampler()
    queries, docs, pair_tokens = spec["queries"], spec["docs"], spec["pair_tokens"]

    def make() -> Call:
        def call(i: int) -> tuple[int, int]:
            query = queries[i % len(queries)]
            batch = request_texts(docs, RERANK_DOCS, i)
            model.predict([(query, d) for d in batch], batch_size=32)
            return RERANK_DOCS, sum(pair_tokens[f"{i % len(queries)}|{d}"] for d in batch)
        return call

    make()(0)
    m = bounded_load("sentence-transformers CrossEncoder (in-process)", make, 1, spec["max_requests"],
                     spec["duration"], sampler)
    sampler.close()
    return [{"key": "rerank", "measurement": asdict(m)}]


def worker_export(spec: dict[str, Any]) -> list[dict]:
    """torch.onnx.export (dynamo, dynamic batch and sequence) of transformers' AutoModel, checked against torch."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    started = time.perf_counter()
    model = AutoModel.from_pretrained(spec["model"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])

    class Body(torch.nn.Module):  # keyword call: transformers 5's forward takes more positional arguments
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    sample = tokenizer(["a short one", "a somewhat longer sentence to export with"], padding=True, return_tensors="pt")
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    # The legacy TorchScript exporter (dynamo=False) produced wrong vectors with transformers 5 here.
    torch.onnx.export(Body(model), tuple(sample[k] for k in names), spec["onnx"], input_names=names,
                      output_names=["last_hidden_state"], dynamic_shapes={k: {0: batch, 1: seq} for k in names},
                      dynamo=True)
    # Parity on a differently shaped, padded batch: pooled vectors must match torch's.
    check = ["one", "a check sentence with rather more words than the other one has, for padding"]
    enc = tokenizer(check, padding=True, return_tensors="pt")
    with torch.inference_mode():
        ref = mean_pool_normalize(model(**enc).last_hidden_state.numpy(), enc["attention_mask"].numpy())
    got = OrtEmbedder(spec["onnx"], spec["model"]).encode(check)
    cosine = float((ref * got).sum(axis=1).min())
    if cosine < 0.9999:
        raise RuntimeError(f"the ONNX export disagrees with torch: cosine {cosine:.6f}")
    return [{"export_s": time.perf_counter() - started, "cosine": cosine}]


def worker_cpu(spec: dict[str, Any]) -> list[dict]:
    """Tokens per CPU-second of one engine (ours / onnxruntime / torch), one thread, pre-tokenized inputs."""
    kind = spec["engine"]
    if kind == "ours":
        from engine import Engine, EngineOptions

        eng = Engine(EngineOptions(model_path=spec["model"], threads=1))
        eng.wait_loaded()
        run: Callable[[list[list[int]]], Any] = eng.embed
    elif kind == "onnxruntime":
        ort_embedder = OrtEmbedder(spec["onnx"], spec["model"], threads=1)

        def run(rows: list[list[int]]) -> Any:
            ids = np.array(rows, dtype=np.int64)
            return ort_embedder.run_ids(ids, np.ones_like(ids))
    else:
        import torch
        from transformers import AutoModel

        torch.set_num_threads(1)
        model = AutoModel.from_pretrained(spec["model"]).eval()

        def run(rows: list[list[int]]) -> Any:
            ids = torch.tensor(rows)
            mask = torch.ones_like(ids)
            with torch.inference_mode():
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            return mean_pool_normalize(hidden.numpy(), mask.numpy())

    out = []
    for shape in spec["shapes"]:
        rows = shape["ids"]
        run(rows)  # warm
        cpu = wall = 0.0
        calls = 0
        deadline = time.perf_counter() + spec["duration"]
        while calls < spec["max_requests"] and (calls == 0 or time.perf_counter() < deadline):
            c0, w0 = time.process_time(), time.perf_counter()
            run(rows)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            calls += 1
        out.append(asdict(CpuFigure(kind, shape["name"], calls * sum(len(r) for r in rows), cpu, wall, calls)))
    if kind == "ours":
        eng.close(wait=True)  # a release thread left running at exit aborts the process
    return out


WORKERS: dict[str, Callable[[dict[str, Any]], list[dict]]] = {
    "st": worker_st, "ort": worker_ort, "ce": worker_ce, "export": worker_export, "cpu": worker_cpu}


def run_worker(kind: str, spec: dict[str, Any], tmp: Path, env: dict[str, str] | None = None,
               timeout: float = 1800) -> tuple[list[dict], float]:
    """Run this script as `--worker kind`; return its results and its startup (process start to READY)."""
    spec_path, result_path, err_path = (tmp / f"{kind}-{n}-{time.monotonic_ns()}" for n in ("spec", "result", "err"))
    spec_path.write_text(json.dumps(spec))
    started = time.perf_counter()
    ready_at: list[float] = []
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", kind, "--spec", str(spec_path),
                                 "--result", str(result_path)], cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})

        def read_stdout() -> None:  # drains the pipe; notes when the worker says READY
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip() == b"READY" and not ready_at:
                    ready_at.append(time.perf_counter() - started)

        reader = threading.Thread(target=read_stdout, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"worker {kind} did not finish within {timeout:g} s") from None
        reader.join(timeout=5)
    if proc.returncode != 0:
        tail = "\n".join(err_path.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"worker {kind} failed with exit status {proc.returncode}:\n{tail}")
    return json.loads(result_path.read_text()), (ready_at[0] if ready_at else float("nan"))


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Target:
    name: str
    measured: str
    ratio: float | None  # measured / reference
    bound: float
    higher_is_better: bool

    def verdict(self) -> str:
        if self.ratio is None or self.ratio != self.ratio:
            return "not evaluated"
        if self.higher_is_better:
            return "met" if self.ratio >= self.bound else f"missed by {(1 - self.ratio / self.bound) * 100:.0f}%"
        return "met" if self.ratio <= self.bound else f"missed by {(self.ratio / self.bound - 1) * 100:.0f}%"


def evaluate_targets(scenarios: dict[str, Scenario], cpu: list[CpuFigure], startup: list[float],
                     notes: dict[str, str]) -> list[Target]:
    targets: list[Target] = []
    by = {(f.engine, f.shape): f for f in cpu}
    for length in ENGINE_LENGTHS:
        shape = f"{ENGINE_ROWS} x {length} tokens"
        ours, ort = by.get(("ours", shape)), by.get(("onnxruntime", shape))
        if ours and ort:
            r = ours.tokens_per_cpu_s / ort.tokens_per_cpu_s
            targets.append(Target(f"engine tokens per CPU-second >= 0.8x onnxruntime ({shape})",
                                  f"{ours.tokens_per_cpu_s:,.0f} vs {ort.tokens_per_cpu_s:,.0f} = {r:.2f}x", r, 0.8, True))
        else:
            targets.append(Target(f"engine tokens per CPU-second >= 0.8x onnxruntime ({shape})",
                                  notes.get("onnx", "onnxruntime not measured"), None, 0.8, True))
    for length in ("short", "long"):
        sc = scenarios.get(f"embed-{length}-b32-c16")
        ours = sc.ours() if sc else None
        st = sc.row("sentence-transformers") if sc else None
        name = f"server throughput, 16 clients x 32 {length} texts >= 1.2x sentence-transformers in-process, batch 32"
        if ours and st and st.texts_per_s:
            r = ours.texts_per_s / st.texts_per_s
            targets.append(Target(name, f"{ours.texts_per_s:,.1f} vs {st.texts_per_s:,.1f} texts/s = {r:.2f}x",
                                  r, 1.2, True))
        else:
            targets.append(Target(name, notes.get("st", "not measured"), None, 1.2, True))
    sc = scenarios.get("embed-short-b1-c1")
    ours = sc.ours() if sc else None
    st = sc.row("sentence-transformers") if sc else None
    name = "single short request p50 <= 1.5x a direct sentence-transformers call"
    if ours and st:
        r = ours.percentile(50) / st.percentile(50)
        targets.append(Target(name, f"{ours.percentile(50):.1f} vs {st.percentile(50):.1f} ms = {r:.2f}x", r, 1.5, False))
    else:
        targets.append(Target(name, notes.get("st", "not measured"), None, 1.5, False))
    if startup:
        median = statistics.median(startup)
        targets.append(Target("startup to ready <= 10 s (median)", f"{median:.2f} s", median / 10.0, 1.0, False))
    return targets


def write_report(path: Path, argv: list[str], blas_line: str | None, startup_rows: list[tuple[str, str, str]],
                 cpu: list[CpuFigure], scenarios: dict[str, Scenario], targets: list[Target],
                 notes: dict[str, str], settings: str) -> None:
    lines = ["# Serving benchmark results", "",
             "Generated by `benchmarks/serve_bench.py` (see `benchmarks/README.md` for what each figure means); "
             "the whole file is rewritten on every run.", "", "## Machine", ""]
    lines += machine_lines(blas_line)
    lines += ["", "## Command", "", "```sh", " ".join(shlex.quote(a) for a in argv), "```", "", settings, ""]
    if notes:
        lines += ["Not measured in this run:", ""] + [f"- {v}" for v in notes.values()] + [""]
    lines += ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t.name} | {t.measured} | **{t.verdict()}** |" for t in targets]
    if any(t.verdict() != "met" for t in targets):
        lines += ["", "Why a target is missed, with the op-by-op profile that shows where the time goes: "
                      "[README.md, \"Where the time goes\"](README.md#where-the-time-goes) and "
                      "[PROFILE.md](PROFILE.md) (`python -m benchmarks.profile_layers`)."]
    lines += ["", "## Startup to ready", "", "| engine | startup s | ratio to ours |", "|---|---:|---:|"]
    lines += [f"| {e} | {s} | {r} |" for e, s, r in startup_rows]
    lines += ["", "## Engine alone: tokens per CPU-second (one thread, pre-tokenized, in-process)", "",
              "| shape | engine | tokens per CPU-s | tokens/s (wall) | calls | ratio to ours |",
              "|---|---|---:|---:|---:|---:|"]
    for length in ENGINE_LENGTHS:
        shape = f"{ENGINE_ROWS} x {length} tokens"
        figures = [f for f in cpu if f.shape == shape]
        base = next((f for f in figures if f.engine == "ours"), None)
        for f in figures:
            lines.append(f"| {shape} | {f.engine} | {f.tokens_per_cpu_s:,.0f} | {f.tokens / f.wall_s:,.0f} | "
                         f"{f.calls} | {ratio(f.tokens_per_cpu_s, base.tokens_per_cpu_s) if base else '-'} |")
    lines += [""]
    for sc in scenarios.values():
        lines += [f"## {sc.title}", ""] + scenario_table(sc, markdown=True) + [""]
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------
def clients(n: int) -> str:
    return f"{n} concurrent client{'s' if n > 1 else ''}"


def embed_title(length: str, batch: int, conc: int, mean_tokens: float) -> str:
    what = f"short texts ({SHORT_WORDS} words, ~{mean_tokens:.0f} tokens)" if length == "short" \
        else f"long texts (~{mean_tokens:.0f} tokens)"
    return (f"Embeddings: {what}, {batch} text{'s' if batch > 1 else ''} per request, "
            f"{clients(conc)}")


class Run:
    """One benchmark invocation: the shared texts, the tables filled phase by phase, then the report."""

    def __init__(self, args: argparse.Namespace, tmp: Path):
        from engine import default_model

        self.args = args
        self.tmp = tmp
        self.model = Path(args.model) if args.model else None  # None: our server's own default
        self.model_dir = self.model or Path(default_model())
        self.reranker = Path(args.reranker) if args.reranker else DEFAULT_RERANKER
        self.onnx_path = str(tmp / "onnx" / "model.onnx")
        self.tok = load_tokenizer(self.model_dir)
        self.notes: dict[str, str] = {}  # what was not measured, and why
        self.use_llama = bool(args.llama_server_bin and args.gguf)
        if args.skip_onnx:
            self.notes["onnx"] = "onnxruntime: skipped (--skip-onnx)"
        if args.skip_st:
            self.notes["st"] = "sentence-transformers, CrossEncoder and torch: skipped (--skip-st)"
        if not self.use_llama:
            self.notes["llama"] = "llama-server: skipped (give --llama-server-bin PATH --gguf PATH to include it)"
        if args.skip_rerank:
            self.notes["rerank"] = "rerank load: skipped (--skip-rerank)"
        elif not (self.reranker / "config.json").exists():
            self.notes["rerank"] = f"rerank load: skipped (no cross-encoder at {self.reranker}; give --reranker DIR)"

        # Deterministic texts, shared by every engine.
        n_pool = 64 if args.quick else 512
        self.pools = {k: make_texts(self.tok, n_pool, k, args.seed) for k in ("short", "long")}
        self.counts = {k: token_counts(self.tok, v) for k, v in self.pools.items()}
        mean = {k: sum(v) / len(v) for k, v in self.counts.items()}
        self.settings = (
            f"Settings: up to {args.requests} requests and {args.duration:g} s per engine and scenario (requests in "
            f"flight at the deadline finish); pools of {n_pool} seeded texts (seed {args.seed}); short = "
            f"{SHORT_WORDS} words (~{mean['short']:.1f} tokens), long = ~{mean['long']:.1f} tokens; rerank = 1 query "
            f"x {RERANK_DOCS} documents of ~{DOC_TOKENS} tokens; in-process engines run one caller; every engine "
            f"uses its default threads except in the engine-alone table.")
        self.scenarios: dict[str, Scenario] = {}
        for length in ("short", "long"):
            for batch in BATCHES:
                for conc in CONCURRENCY:
                    key = f"embed-{length}-b{batch}-c{conc}"
                    self.scenarios[key] = Scenario(key, embed_title(length, batch, conc, mean[length]))
        self.startup: list[float] = []  # our server's fresh starts
        self.startup_rows: list[tuple[str, str, str]] = []
        self.blas_line: str | None = None
        self.cpu: list[CpuFigure] = []

    def start_ratio(self, seconds: float) -> str:
        return ratio(seconds, statistics.median(self.startup)) if self.startup else "-"

    def drive_embeddings(self, server: MeasuredServer, label: str) -> None:
        """Every embedding scenario against one server: short/long x 1/32 texts x 1/4/16 clients."""
        for length in ("short", "long"):
            for batch in BATCHES:
                make = http_embed_client(server.base, self.pools[length], batch)
                warm_http(make)
                for conc in CONCURRENCY:
                    sc = self.scenarios[f"embed-{length}-b{batch}-c{conc}"]
                    m = bounded_load(f"{label} (HTTP, {clients(conc)})", make, conc, self.args.requests,
                                     self.args.duration, server.sampler)
                    sc.rows.append(m)
                    print_scenario(Scenario(sc.key, sc.title, [m]) if label == "ours" else sc)

    def ours_embed(self) -> None:
        """Our server: several fresh starts timed to ready; the last one serves the HTTP loads."""
        server = None
        for n in range(self.args.startup_runs):
            if server is not None:
                server.stop()
            port = free_port()
            server = MeasuredServer("ours", our_server_argv(self.model, port, False), port, self.tmp)
            self.startup.append(server.startup_s)
            self.blas_line = self.blas_line or server.blas_line()
            print(f"ours: startup to ready {server.startup_s:.2f} s (start {n + 1} of {self.args.startup_runs})",
                  flush=True)
        assert server is not None
        try:
            self.drive_embeddings(server, "ours")
        finally:
            server.stop()
        runs = ", ".join(f"{s:.2f}" for s in self.startup)
        self.startup_rows.append(("ours (server process to GET /health 200)",
                                  f"{statistics.median(self.startup):.2f} (runs: {runs})", "1.00"))

    def llama_embed(self) -> None:
        if not self.use_llama:
            print(f"\n{self.notes['llama']}", flush=True)
            for sc in self.scenarios.values():
                sc.skipped.append("llama-server: skipped (no --llama-server-bin/--gguf)")
            return
        port = free_port()
        llama = MeasuredServer("llama-server", llama_argv(self.args.llama_server_bin, self.args.gguf, port, False,
                                                         self.args.llama_server_args), port, self.tmp)
        self.startup_rows.append(("llama-server (process to GET /health 200)", f"{llama.startup_s:.2f}",
                                  self.start_ratio(llama.startup_s)))
        try:
            self.drive_embeddings(llama, "llama-server")
        finally:
            llama.stop()

    def export_onnx(self) -> bool:
        (self.tmp / "onnx").mkdir(exist_ok=True)
        print("\nexporting the model to ONNX (torch.onnx.export, dynamo) ...", flush=True)
        try:
            exported, _ = run_worker("export", {"model": str(self.model_dir), "onnx": self.onnx_path}, self.tmp)
        except RuntimeError as exc:
            self.notes["onnx"] = f"onnxruntime: the export failed ({str(exc).splitlines()[0]})"
            print(exc, flush=True)
            return False
        print(f"exported in {exported[0]['export_s']:.1f} s; cosine to torch {exported[0]['cosine']:.7f}", flush=True)
        return True

    def in_process_embed(self) -> None:
        """sentence-transformers and onnxruntime on the same batches; measured once, shown in every table."""
        spec = {"model": str(self.model_dir), "onnx": self.onnx_path, "max_requests": self.args.requests,
                "duration": self.args.duration,
                "scenarios": [{"key": f"{length}-b{batch}", "batch": batch, "texts": self.pools[length],
                               "tokens": self.counts[length]} for length in ("short", "long") for batch in BATCHES]}
        baselines = []
        if not self.args.skip_st:
            baselines.append(("st", "sentence-transformers (in-process)"))
        if not self.args.skip_onnx and self.export_onnx():
            baselines.append(("ort", "onnxruntime (in-process)"))
        for kind, label in baselines:
            print(f"\nrunning {label} ...", flush=True)
            results, ready_s = run_worker(kind, spec, self.tmp)
            what = "process start to loaded + one text" + (" (export excluded)" if kind == "ort" else "")
            self.startup_rows.append((f"{label}: {what}", f"{ready_s:.2f}", self.start_ratio(ready_s)))
            for r in results:
                m = Measurement.from_dict(r["measurement"])
                for conc in CONCURRENCY:
                    self.scenarios[f"embed-{r['key']}-c{conc}"].rows.append(m)
        for key in ("st", "onnx"):
            if key in self.notes:
                for sc in self.scenarios.values():
                    sc.skipped.append(self.notes[key])
        for sc in self.scenarios.values():
            print_scenario(sc)

    def rerank(self) -> None:
        """Our server with --reranking, llama-server with --rerank-gguf, CrossEncoder in-process."""
        if "rerank" in self.notes:
            return
        args = self.args
        rtok = load_tokenizer(self.reranker)
        queries = make_texts(rtok, 16, "short", args.seed + 1)
        docs = make_texts(rtok, (4 if args.quick else 16) * RERANK_DOCS, "doc", args.seed + 1)
        keys = [f"rerank-c{c}" for c in CONCURRENCY]
        for conc, key in zip(CONCURRENCY, keys):
            self.scenarios[key] = Scenario(key, f"Rerank: 1 query x {RERANK_DOCS} documents (~{DOC_TOKENS} tokens "
                                                f"each) per request, {clients(conc)}, {self.reranker.name}")
        servers = ["ours"]
        if self.use_llama and args.rerank_gguf:
            servers.append("llama-server")
        else:
            why = "give --rerank-gguf PATH" if self.use_llama else "no --llama-server-bin/--gguf"
            for key in keys:
                self.scenarios[key].skipped.append(f"llama-server: skipped ({why})")
        for label in servers:
            port = free_port()
            argv = (our_server_argv(self.reranker, port, True) if label == "ours"
                    else llama_argv(args.llama_server_bin, args.rerank_gguf, port, True, args.llama_server_args))
            server = MeasuredServer(f"{label}-rerank", argv, port, self.tmp)
            try:
                make = http_rerank_client(server.base, queries, docs)
                warm_http(make)
                for conc, key in zip(CONCURRENCY, keys):
                    self.scenarios[key].rows.append(bounded_load(f"{label} (HTTP, {clients(conc)})", make, conc,
                                                                 args.requests, args.duration, server.sampler))
            finally:
                server.stop()
        if args.skip_st:
            for key in keys:
                self.scenarios[key].skipped.append(self.notes["st"])
        else:
            pair_tokens = {f"{qi}|{d}": len(rtok.encode(q, d).ids) for qi, q in enumerate(queries) for d in docs}
            results, _ = run_worker("ce", {"model": str(self.reranker), "queries": queries, "docs": docs,
                                           "pair_tokens": pair_tokens, "max_requests": args.requests,
                                           "duration": args.duration}, self.tmp)
            m = Measurement.from_dict(results[0]["measurement"])
            for key in keys:
                self.scenarios[key].rows.append(m)
        for key in keys:
            print_scenario(self.scenarios[key])

    def engine_alone(self) -> None:
        """Tokens per CPU-second, one thread each, exactly 32 x L tokens per call, pre-tokenized."""
        shapes = [{"name": f"{ENGINE_ROWS} x {n} tokens",
                   "ids": exact_token_lists(self.tok, ENGINE_ROWS, n, self.args.seed)} for n in ENGINE_LENGTHS]
        engines = ["ours"] + (["onnxruntime"] if "onnx" not in self.notes else []) + (
            ["torch"] if not self.args.skip_st else [])
        print("\nengine alone, one thread: tokens per CPU-second", flush=True)
        for kind in engines:
            if kind == "onnxruntime" and not Path(self.onnx_path).exists() and not self.export_onnx():
                continue
            results, _ = run_worker("cpu", {"engine": kind, "model": str(self.model_dir), "onnx": self.onnx_path,
                                            "shapes": shapes, "max_requests": self.args.requests,
                                            "duration": self.args.duration}, self.tmp, env=SINGLE_THREAD_ENV)
            self.cpu += [CpuFigure(**r) for r in results]
        for f in self.cpu:
            base = next(b for b in self.cpu if b.engine == "ours" and b.shape == f.shape)
            print(f"  {f.shape:<18} {f.engine:<12} {f.tokens_per_cpu_s:10,.0f} tokens per CPU-s "
                  f"(x{ratio(f.tokens_per_cpu_s, base.tokens_per_cpu_s)})", flush=True)

    def report(self, out: Path) -> None:
        targets = evaluate_targets(self.scenarios, self.cpu, self.startup, self.notes)
        print("\nstartup to ready, s (ratio to ours)")
        for engine, seconds, r in self.startup_rows:
            print(f"  {engine}: {seconds} (x{r})")
        print("\nTargets")
        for t in targets:
            print(f"  {t.name}: {t.measured} -> {t.verdict()}")
        python = sys.executable
        if Path(python).is_relative_to(REPO):
            python = os.path.relpath(python, REPO)
        write_report(out, [python, *sys.argv], self.blas_line, self.startup_rows, self.cpu, self.scenarios, targets,
                     self.notes, self.settings)


def main_run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        run = Run(args, Path(tmp))
        print(run.settings, flush=True)
        run.ours_embed()
        run.llama_embed()
        run.in_process_embed()
        run.rerank()
        run.engine_alone()
        run.report(Path(args.out))
    print(f"\nwrote {args.out} ({time.perf_counter() - started:.0f} s in all)")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests, short durations")
    parser.add_argument("--duration", type=float, help="seconds per engine and scenario (default 15; --quick 2)")
    parser.add_argument("--requests", type=int, help="most requests per engine and scenario (default 200; --quick 12)")
    parser.add_argument("--model", help="embedding model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--reranker", help=f"cross-encoder folder for the rerank load (default {DEFAULT_RERANKER})")
    parser.add_argument("--skip-onnx", action="store_true", help="no onnxruntime baseline (and no export)")
    parser.add_argument("--skip-st", action="store_true", help="no sentence-transformers / CrossEncoder / torch")
    parser.add_argument("--skip-rerank", action="store_true", help="no rerank load")
    parser.add_argument("--startup-runs", type=int, help="fresh starts of our server to time (default 3; --quick 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated texts")
    parser.add_argument("--llama-server-bin", help="llama-server binary; with --gguf, drive it like ours")
    parser.add_argument("--gguf", help="GGUF of the same embedding weights, for llama-server")
    parser.add_argument("--rerank-gguf", help="GGUF of the same cross-encoder, for llama-server --reranking")
    parser.add_argument("--llama-server-args", default="",
                        help="extra llama-server flags, e.g. \"-c 8192 -np 16 -ub 8192 -b 8192\"")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "BASELINES.md"))
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 2.0 if args.quick else 15.0
    if args.requests is None:
        args.requests = 12 if args.quick else 200
    if args.startup_runs is None:
        args.startup_runs = 1 if args.quick else 3
    if args.duration <= 0 or args.requests <= 0 or args.startup_runs <= 0:
        parser.error("--duration, --requests and --startup-runs must be positive")
    if bool(args.llama_server_bin) != bool(args.gguf):
        parser.error("--llama-server-bin and --gguf go together")
    if args.llama_server_bin:  # checked now rather than after the first half of the run
        found = shutil.which(args.llama_server_bin)
        if found is None:
            parser.error(f"--llama-server-bin {args.llama_server_bin}: not an executable")
        args.llama_server_bin = os.path.abspath(found)
        for name in ("gguf", "rerank_gguf"):
            value = getattr(args, name)
            if value is not None:
                if not Path(value).exists():
                    parser.error(f"--{name.replace('_', '-')} {value}: no such file")
                setattr(args, name, os.path.abspath(value))
    return args


def main() -> int:
    args = parse_args()
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        Path(args.result).write_text(json.dumps(WORKERS[args.worker](spec)))
        return 0
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
