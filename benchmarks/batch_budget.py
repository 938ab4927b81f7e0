"""Choose the engine's batch token budget by measurement: throughput per --max-batch-tokens value.

    .venv/bin/python -m benchmarks.batch_budget [--texts 256] [--words 12,60,200] [--budgets 512,1024]

Embeds the same texts (submitted together, as concurrent requests would) with each budget and prints
texts/s and tokens/s as ratios to the smallest budget, in one invocation.
"""
from __future__ import annotations

import argparse
import random
import time

from engine import Engine, EngineOptions, default_model

WORDS = ("retrieval augmented generation vector index query document passage ranking model server token batch "
         "memory latency throughput embedding cosine similarity search agent").split()


def texts(n: int, n_words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(n_words)) for _ in range(n)]


def measure(budget: int, rows: int, batch: list[str]) -> tuple[float, float]:
    engine = Engine(EngineOptions(model_path=default_model(), max_batch_tokens=budget, max_batch_rows=rows))
    engine.wait_loaded()
    ids = [engine.encode_prompt([t]) for t in batch]
    engine.embed(ids[:8])  # warm the shapes this budget uses
    started = time.perf_counter()
    result = engine.embed(ids)
    elapsed = time.perf_counter() - started
    engine.close()
    return len(batch) / elapsed, sum(result.n_tokens) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--words", default="12,60,200")
    parser.add_argument("--budgets", default="256,512,1024,2048,4096,8192")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    for n_words in (int(w) for w in args.words.split(",")):
        batch = texts(args.texts, n_words)
        results = {b: measure(b, 256, batch) for b in budgets}
        base = results[budgets[0]]
        print(f"\n{n_words} words per text, {args.texts} texts (ratios to budget {budgets[0]}: "
              f"{base[0]:.1f} texts/s, {base[1]:.0f} tokens/s)")
        for b, (tps, toks) in results.items():
            print(f"  --max-batch-tokens {b:>6}: {tps:8.1f} texts/s  {toks:8.0f} tokens/s  x{toks / base[1]:.2f}")


if __name__ == "__main__":
    main()
