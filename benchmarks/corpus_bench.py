"""Corpus throughput of `mlx-embed --input ... --output ...`: one process against Ray Data actor pools.

    .venv/bin/python benchmarks/corpus_bench.py                     # 4000 texts; single, then Ray 1 and 2 actors
    .venv/bin/python benchmarks/corpus_bench.py --texts 20000 --actors 1 2 4 --threads 1

Each configuration runs the real command in a fresh process on the same generated JSON lines corpus, so the
wall time includes starting Python, loading the model (and starting Ray and its actors). Results are printed as
texts per second and as a ratio against the single-process run of the same invocation; the Ray runs' Parquet
files are checked to hold the single-process vectors (within 1e-6: the runs' BLAS thread counts differ).
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the a market report model river city data engine quiet green fast paper north table music window "
         "garden vector search index query answer system light train energy policy school").split()


def write_corpus(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24)))
            f.write(json.dumps({"id": f"doc{i}", "text": words}) + "\n")


def run(corpus: Path, out: Path, extra: list[str]) -> float:
    command = [sys.executable, "-c", "import sys; from compat.cli import embed_main; sys.exit(embed_main())",
               "--input", str(corpus), "--output", str(out), "--quiet", *extra]
    started = time.monotonic()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--actors", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1, help="-t for each Ray actor (CPUs each takes)")
    parser.add_argument("--model", default=None, help="-m for every run (default: the bundled MiniLM)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = ["-m", args.model] if args.model else []
    folder = Path(tempfile.mkdtemp(prefix="corpus-bench-"))
    corpus = folder / "corpus.jsonl"
    write_corpus(corpus, args.texts, args.seed)
    import numpy as np
    import pyarrow.parquet as pq

    single = folder / "single.parquet"
    baseline = run(corpus, single, model)
    rows = [("single process", baseline)]
    for actors in args.actors:
        out = folder / f"ray{actors}.parquet"
        seconds = run(corpus, out, [*model, "--ray", "--ray-actors", str(actors), "-t", str(args.threads)])
        got, want = (np.array(pq.read_table(p).column("embedding").to_pylist()) for p in (out, single))
        assert np.abs(got - want).max() <= 1e-6, "Ray wrote other vectors"
        rows.append((f"Ray Data, {actors} actor{'s' if actors > 1 else ''} x {args.threads} thread", seconds))
    print(f"{args.texts} texts (6-24 words), wall time of the whole command (start, load, embed, write)")
    print(f"{'run':<34} {'seconds':>8} {'texts/s':>8} {'vs single':>9}")
    for name, seconds in rows:
        print(f"{name:<34} {seconds:>8.1f} {args.texts / seconds:>8.1f} {baseline / seconds:>8.2f}x")


if __name__ == "__main__":
    main()
