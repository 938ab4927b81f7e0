"""Side by side with llama-server: the same CPU, the same weights, the same flags, the same requests.

    .venv/bin/python benchmarks/vs_llama.py                 # full run (3 rounds), rewrites benchmarks/RESULTS.md
    .venv/bin/python benchmarks/vs_llama.py --rounds 1 --scale 0.25 --out /tmp/vs.md   # a quick check

Four workloads (issue 10), each against our server and llama-server started with the same flags
(`-c 8192 -b 2048 -ub 2048 -np 8 -t 2`):
- short:  short texts (12 words, ~17 tokens) in 32-text /v1/embeddings requests, 8 clients (texts/s);
- long:   texts of ~200 tokens in 8-text requests, 8 clients (texts/s);
- single: one short text per request, 1 client (p50 latency);
- rerank: /v1/rerank with 1 query x 20 documents of ~60 words, 4 clients, bert-tiny-ce-distilled (documents/s).
Both servers stay up for the whole run and take turns: every round runs a workload on one server, then on the
other, the order alternating from round to round (A B, B A, A B, ...), so slow drifts of a shared machine fall on
both. A figure is the median over rounds; a ratio's spread is the lowest and highest of the per-round ratios
(each round's pair ran back to back). Peak RSS is sampled every 50 ms over the whole run (process and children).
Every load is a fixed number of requests, so the run ends by itself. See benchmarks/README.md.
This script owns the workloads, the rounds and RESULTS.md; the server processes, texts, HTTP clients and
bounded load are benchmarks/harness.py's.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    MeasuredServer,
    Measurement,
    bounded_load,
    free_port,
    http_embed_client,
    http_rerank_client,
    llama_argv,
    load_tokenizer,
    make_texts,
    our_server_argv,
    random_words,
    utc_stamp,
)

PEERS = Path("/work/shared/peers/llama-server")
GGUF = Path("/work/shared/fixtures/gguf/minilm-f16.gguf")
RERANK_GGUF = Path("/work/shared/fixtures/gguf/bert-tiny-ce-distilled-f32.gguf")
RERANKER = Path("/work/shared/fixtures/bert-tiny-ce-distilled")
SERVER_FLAGS = "-c 8192 -b 2048 -ub 2048 -np 8 -t 2"  # llama-server's best flags for these loads; ours take them too
RERANK_DOC_WORDS = 60


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
    """One workload's measurements on both servers, round by round."""

    workload: Workload
    ours: list[Measurement] = field(default_factory=list)
    llama: list[Measurement] = field(default_factory=list)

    def value(self, m: Measurement) -> float:
        if self.workload.figure == "p50":
            return statistics.median(m.latencies_ms)
        return m.texts / m.wall_s

    def ratios(self) -> list[float]:
        """Per round: ours / llama for throughput (above 1: faster), ours p50 / llama p50 for latency (below 1)."""
        return [self.value(a) / self.value(b) for a, b in zip(self.ours, self.llama, strict=True)]


def scaled(w: Workload, scale: float) -> Workload:
    return Workload(**{**w.__dict__, "requests": max(2, round(w.requests * scale))})


def rerank_texts(seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(f"rerank-{seed}")
    queries = [random_words(rng, 8).rstrip(".") + "?" for _ in range(16)]
    docs = [random_words(rng, RERANK_DOC_WORDS) for _ in range(256)]
    return queries, docs


def start_pair(tag: str, ours_argv: list[str], llama_args: list[str],
               logs: Path) -> tuple[MeasuredServer, MeasuredServer]:
    ours = MeasuredServer(f"ours-{tag}", ours_argv, int(ours_argv[ours_argv.index("--port") + 1]), logs)
    try:
        llama = MeasuredServer(f"llama-{tag}", llama_args, int(llama_args[llama_args.index("--port") + 1]), logs)
    except BaseException:
        ours.stop()
        raise
    return ours, llama


def run_rounds(w: Workload, clients: dict[str, Callable], servers: dict[str, MeasuredServer], rounds: int) -> Rounds:
    result = Rounds(w)
    for r in range(rounds):
        order = ("ours", "llama") if r % 2 == 0 else ("llama", "ours")
        for side in order:
            # peak RSS is sampled over the whole run by each server's sampler; none is reset per load
            m = bounded_load(side, clients[side], w.clients, w.requests, duration=3600, sampler=None)
            if m.errors:
                raise RuntimeError(f"{side}, {w.name}: {m.note}")
            getattr(result, side).append(m)
            print(f"  round {r + 1} {side:5s} {w.name}: {m.texts / m.wall_s:8.1f} texts/s, "
                  f"p50 {statistics.median(m.latencies_ms):7.1f} ms", flush=True)
    return result


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else "-"


def verdict(rounds: Rounds) -> str:
    w, ratio = rounds.workload, statistics.median(rounds.ratios())
    if w.figure == "p50":
        return "**met**" if ratio <= w.target else f"**missed**: {(ratio - 1) * 100:.0f}% slower than llama-server"
    return ("**met**" if ratio >= w.target
            else f"**missed** by {(1 - ratio / w.target) * 100:.0f}% (target {w.target:g}x)")


def report(results: list[Rounds], rss: dict[str, dict[str, float]], argv: list[str], loaded_note: str, rounds: int,
           load_avg: tuple[float, float, float]) -> str:
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
             f"- llama-server: `{PEERS}` (llama.cpp 3f545bec, CPU), `{GGUF.name}` and `{RERANK_GGUF.name}`",
             f"- ours: `python -m compat.cli` on the same weights (safetensors, float32)",
             f"- both servers: `--embedding {SERVER_FLAGS}` (+ `--pooling mean` for llama's MiniLM, `--reranking` for "
             f"the cross-encoder); {rounds} rounds, orders alternating (A B, B A, ...)", ""]
    cores = os.cpu_count() or 1
    if load_avg[0] > cores / 2:
        lines += [f"> Taken on a loaded machine: the load average was {load_avg[0]:.1f} on {cores} cores when it "
                  f"started (other work was running), so absolute figures are low and noisy; llama-server's threads "
                  f"wait for each other at every op and lose more than ours to a busy core. Rerun on a quiet "
                  f"machine for representative ratios.", ""]
    if loaded_note:
        lines += [f"> {loaded_note}", ""]
    lines += ["## Results", "",
              "| workload | ours | llama-server | ours / llama (median, spread) | target | verdict |",
              "|---|---:|---:|---:|---|---|"]
    for res in results:
        w = res.workload
        ours = statistics.median(res.value(m) for m in res.ours)
        llama = statistics.median(res.value(m) for m in res.llama)
        ratios = res.ratios()
        unit = "ms p50" if w.figure == "p50" else ("docs/s" if w.kind == "rerank" else "texts/s")
        target = f"p50 ≤ {w.target:g}x llama's" if w.figure == "p50" else f"≥ {w.target:g}x"
        lines.append(f"| {w.name}: {w.title} | {ours:,.1f} {unit} | {llama:,.1f} {unit} | "
                     f"{statistics.median(ratios):.2f}x ({spread(ratios)}) | {target} | {verdict(res)} |")
    lines += ["", "Latency ratios are ours ÷ llama's (below 1: we answer faster); throughput ratios are ours ÷ llama's "
              "(above 1: we serve more).", "",
              "## Peak memory", "",
              "Peak RSS of each server process (and its children) over all its workloads, sampled every 50 ms.", "",
              "| server pair | ours MiB | llama-server MiB | ours / llama | target ≤ 1.5x |", "|---|---:|---:|---:|---|"]
    for kind, peaks in rss.items():
        rss_ratio = peaks["ours"] / peaks["llama"]
        lines.append(f"| {kind} | {peaks['ours']:,.0f} | {peaks['llama']:,.0f} | {rss_ratio:.2f}x | "
                     f"{'**met**' if rss_ratio <= 1.5 else '**missed**'} |")
    lines += ["", "## Per round", "", "| workload | round | ours | llama-server | ratio |", "|---|---:|---:|---:|---:|"]
    for res in results:
        for i, (a, b) in enumerate(zip(res.ours, res.llama, strict=True)):
            lines.append(f"| {res.workload.name} | {i + 1} | {res.value(a):,.1f} | {res.value(b):,.1f} | "
                         f"{res.value(a) / res.value(b):.2f} |")
    lines += ["", "Where the time goes when a target is missed: [PROFILE.md](PROFILE.md) "
              "(`python -m benchmarks.profile_layers`) and [README.md](README.md#where-the-time-goes-against-llama-server-resultsmd).", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds per workload (default 3)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every workload's request count (default 1)")
    p.add_argument("--only", nargs="*", choices=[w.name for w in WORKLOADS], help="run these workloads only")
    p.add_argument("--llama-server-bin", default=str(PEERS))
    p.add_argument("--gguf", default=str(GGUF))
    p.add_argument("--rerank-gguf", default=str(RERANK_GGUF))
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

    model = Path(args.model or default_model())
    tok = load_tokenizer(model)
    pools = {"short": make_texts(tok, 512, "short", args.seed), "long": make_texts(tok, 512, "long", args.seed)}
    queries, docs = rerank_texts(args.seed)
    workloads = [scaled(w, args.scale) for w in WORKLOADS if not args.only or w.name in args.only]
    load_avg = os.getloadavg()
    flags = SERVER_FLAGS.split()
    results: list[Rounds] = []
    rss: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="vs-llama-") as tmp:
        logs = Path(tmp)
        for kind in ("embed", "rerank"):
            chosen = [w for w in workloads if w.kind == kind]
            if not chosen:
                continue
            rerank = kind == "rerank"
            ours_argv = our_server_argv(Path(args.reranker) if rerank else model, free_port(), rerank) + flags
            llama_args = llama_argv(args.llama_server_bin, args.rerank_gguf if rerank else args.gguf, free_port(),
                                    rerank, SERVER_FLAGS + ("" if rerank else " --pooling mean"))
            ours, llama = start_pair(kind, ours_argv, llama_args, logs)
            try:
                servers = {"ours": ours, "llama": llama}
                for w in chosen:
                    if rerank:
                        clients = {side: http_rerank_client(s.base, queries, docs) for side, s in servers.items()}
                    else:
                        clients = {side: http_embed_client(s.base, pools[w.texts], w.batch)
                                   for side, s in servers.items()}
                    for side in servers:  # warm both: first requests, allocator, caches
                        bounded_load(side, clients[side], w.clients, w.clients * 2, 3600, None)
                    print(f"{w.name}: {w.title}", flush=True)
                    results.append(run_rounds(w, clients, servers, args.rounds))
                rss["MiniLM embedder" if kind == "embed" else "bert-tiny cross-encoder"] = {
                    side: server.sampler.peak_mib for side, server in servers.items()}
            finally:
                ours.stop()
                llama.stop()
    text = report(results, rss, raw, args.note, args.rounds, load_avg)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
