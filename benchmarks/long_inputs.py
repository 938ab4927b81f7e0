"""One long input at a time: our engine against llama-server on the tiny random Qwen3 GGUF (issue 18).

    .venv/bin/python benchmarks/long_inputs.py                       # 512 ... 32767 tokens, about 3 minutes
    .venv/bin/python benchmarks/long_inputs.py --lengths 512,2048 --repeat 3
    .venv/bin/python benchmarks/long_inputs.py --baseline ../main    # also an older checkout, up to 8192 tokens

For each length, one /v1/embeddings-equivalent call of one input of that many tokens (random ids ending with
<|endoftext|>, last-token pooling): our engine in this process (the Engine API, as tests/engine/helpers.py's
start_engine), llama-server (/work/shared/peers/llama-server, `-m FILE --embedding --pooling last -c 32768
-b 32768 -ub 32768 -np 1`) over HTTP with the same token ids, and optionally another checkout of this
repository (--baseline, in a child process) -- taking turns at every call, so a drift of a shared machine falls
on all of them. A time is the best of --repeat calls (after one warm-up call each up to 8192 tokens); peak RSS is
each process's high-water mark over that length's calls (reset through /proc/PID/clear_refs); `cosine` is
between our vector and llama-server's (f16 weights there, float32 compute here). llama-server runs up to
--llama-max tokens (8192 by default: its memory grows by about 1.2 MiB a token).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    MeasuredServer,
    cosine,
    free_port,
    http_embed_ids,
    llama_argv,
    long_input_ids,
    peak_mib,
    reset_peak,
)

GGUF = Path("/work/shared/fixtures/gguf/tiny-random-qwen3-last-f16.gguf")
LLAMA = Path("/work/shared/peers/llama-server")
# llama-server refuses an input of exactly -c tokens ("exceeds the available context size"), so the top is one less
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32767)
EOS = 151643  # <|endoftext|>, what Qwen3-Embedding's tokenizer appends and last-token pooling reads
CTX = 32768


def tokens(n: int, call: int) -> list[int]:
    return long_input_ids(n, call, EOS)


# -- the three contestants --------------------------------------------------------------------------------------

class Ours:
    """The engine of a checkout, in this process: embed one input, return (seconds, vector)."""

    def __init__(self, tree: Path, max_tokens: int):
        sys.path.insert(0, str(tree))
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from engine import Engine, EngineOptions

        started = time.monotonic()
        self.engine = Engine(EngineOptions(model_path=str(GGUF), threads=2, ubatch_tokens=max_tokens,
                                           max_batch_tokens=max_tokens))
        self.info = self.engine.wait_loaded(1800)
        self.startup_s = time.monotonic() - started

    def __call__(self, ids: list[int]) -> tuple[float, list[float]]:
        started = time.perf_counter()
        vector = self.engine.embed([ids]).vectors[0]
        return time.perf_counter() - started, [float(x) for x in vector]

    def close(self) -> None:
        self.engine.close(wait=True)


class Baseline:
    """Another checkout's engine in a child process (this script with --worker), one request per line."""

    def __init__(self, tree: Path, max_tokens: int):
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(tree), "--max-tokens", str(max_tokens)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree)
        self.startup_s = json.loads(self.proc.stdout.readline())["startup_s"]

    def __call__(self, ids: list[int]) -> tuple[float, list[float]]:
        self.proc.stdin.write(json.dumps(ids) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return reply["s"], reply["vector"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


class LlamaServer:
    """llama-server on the GGUF (benchmarks/harness.py's MeasuredServer), one input of token ids per call."""

    def __init__(self, logs: Path):
        port = free_port()
        flags = f"--pooling last -c {CTX} -b {CTX} -ub {CTX} -np 1"
        self.server = MeasuredServer("llama-server", llama_argv(str(LLAMA), str(GGUF), port, False, flags), port,
                                     logs, ready_timeout=600)
        self.proc = self.server.proc
        self.startup_s = self.server.startup_s
        self.call = http_embed_ids(self.server.base, timeout=600)

    def __call__(self, ids: list[int]) -> tuple[float, list[float]]:
        return self.call(ids)

    def close(self) -> None:
        self.server.stop()


def worker(tree: Path, max_tokens: int) -> int:
    """--worker: serve Baseline's requests with the engine of `tree`, reporting this process's peak RSS."""
    ours = Ours(tree, max_tokens)
    print(json.dumps({"startup_s": ours.startup_s}), flush=True)
    for line in sys.stdin:
        seconds, vector = ours(json.loads(line))
        print(json.dumps({"s": seconds, "vector": vector}), flush=True)
    ours.close()
    return 0


# -- the run ------------------------------------------------------------------------------------------------------

def measure(contestants: dict, pids: dict, n: int, repeat: int, warm: bool) -> dict:
    """name -> (best seconds over `repeat` calls, peak RSS MiB over them, the last vector) or the error it raised.
    The contestants take turns at every call, each call with new ids (the same for all); a warm-up call each
    first when `warm` (a length's first pass builds its tile shapes)."""
    for pid in pids.values():
        reset_peak(pid)
    times: dict[str, list[float]] = {name: [] for name in contestants}
    vectors: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    for call in range(-1 if warm else 0, repeat):
        ids = tokens(n, call)
        for name, contestant in contestants.items():
            if name in failed:
                continue
            try:
                seconds, vectors[name] = contestant(ids)
            except Exception as exc:  # llama-server refusing, or killed for memory: the others go on
                failed[name] = f"{type(exc).__name__}: {exc}"
                continue
            if call >= 0:
                times[name].append(seconds)
    return {name: failed.get(name) or (min(times[name]), peak_mib(pids[name]), vectors[name]) for name in contestants}


def baseline_cells(result: tuple | str, ours: tuple) -> str:
    """The baseline's time and its ratio to ours, or that it failed."""
    if isinstance(result, str):
        return " failed | - |"
    return f" {result[0] * 1000:.0f} | {result[0] / ours[0]:.1f} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated token counts")
    parser.add_argument("--repeat", type=int, default=0, help="timed calls per length (default: 3 up to 4096 "
                        "tokens, 2 at 8192, 1 beyond)")
    parser.add_argument("--baseline", type=Path, help="another checkout of this repository to time as well")
    parser.add_argument("--baseline-max", type=int, default=8192, help="longest input for --baseline (an engine "
                        "with quadratic attention capped inputs at 8192 tokens)")
    parser.add_argument("--llama-max", type=int, default=8192, help="longest input for llama-server (its peak RSS "
                        "grew by about 1.2 MiB a token here: 19.5 GiB at 16384 tokens, killed for memory at 32767 "
                        "on a 23 GiB machine)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--max-tokens", type=int, default=CTX, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.max_tokens)
    lengths = [int(n) for n in args.lengths.split(",")]
    errors: list[str] = []
    contestants = {"ours": Ours(REPO, max(lengths))}
    print(f"ours: loaded in {contestants['ours'].startup_s:.1f} s (per-input limit "
          f"{contestants['ours'].info.max_input_tokens}, widths warmed {contestants['ours'].info.widths})", flush=True)
    llama = contestants["llama-server"] = LlamaServer(Path("/tmp"))
    print(f"llama-server: ready in {llama.startup_s:.1f} s", flush=True)
    if args.baseline:
        base = contestants["baseline"] = Baseline(args.baseline.resolve(), min(max(lengths), args.baseline_max))
        print(f"baseline ({args.baseline}): loaded in {base.startup_s:.1f} s", flush=True)
    pids = {"ours": "self", "llama-server": llama.proc.pid}
    if args.baseline:
        pids["baseline"] = contestants["baseline"].proc.pid
    head = "| tokens | ours ms | llama-server ms | ours / llama |"
    rule = "|---:|---:|---:|---:|"
    if args.baseline:
        head += " baseline ms | baseline / ours |"
        rule += "---:|---:|"
    print(f"\n{head} ours peak RSS MiB | llama peak RSS MiB | cosine |\n{rule}---:|---:|---:|", flush=True)
    try:
        for n in lengths:
            repeat = args.repeat or (3 if n <= 4096 else 2 if n <= 8192 else 1)
            limits = {"baseline": args.baseline_max, "llama-server": args.llama_max}
            running = {name: call for name, call in contestants.items() if n <= limits.get(name, n)}
            row = measure(running, {name: pids[name] for name in running}, n, repeat, warm=n <= 8192)
            ours = row["ours"]
            theirs = row.get("llama-server")
            if theirs is None:
                line = f"| {n} | {ours[0] * 1000:.0f} | - | - |"
            elif isinstance(theirs, str):
                line = f"| {n} | {ours[0] * 1000:.0f} | failed | - |"
                errors.append(f"llama-server at {n} tokens: {theirs}")
            else:
                line = f"| {n} | {ours[0] * 1000:.0f} | {theirs[0] * 1000:.0f} | {ours[0] / theirs[0]:.3g} |"
            if args.baseline:
                line += baseline_cells(row["baseline"], ours) if "baseline" in row else " - | - |"
            agree = f"{cosine(ours[2], theirs[2]):.6f}" if isinstance(theirs, tuple) else "-"
            rss = f"{theirs[1]:.0f}" if isinstance(theirs, tuple) else "-"
            print(f"{line} {ours[1]:.0f} | {rss} | {agree} |", flush=True)
        for error in errors:
            print(error)
    finally:
        for contestant in contestants.values():
            contestant.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
