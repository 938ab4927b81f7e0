"""A 4-bit MLX-quantized all-MiniLM-L6-v2 against its float folder, in process through the Engine API.

The 4-bit folder is made here, in a temporary directory, as mlx-community conversions are: every Linear and
Embedding of the bundled MiniLM quantized with mx.quantize (group 64), packed weights with scales and biases,
config.json `quantization`. It is served both ways the engine can (dequantized to float32 at load, a CPU's
default; and --keep-quantized, MLX's quantized kernels), and the float folder beside them. Rounds alternate
the three; each round embeds `--batches` batches of 32 texts; the median throughput of each is printed as a
ratio to the float folder's, with each one's resident weight bytes.

    .venv/bin/python benchmarks/quantized.py [--rounds 3] [--batches 4] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402  (binds the BLAS before mlx loads)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from benchmarks.harness import load_tokenizer, make_texts  # noqa: E402
from engine.loading import formats  # noqa: E402
from tests.engine.helpers import start_engine  # noqa: E402

GROUP, BITS, BATCH = 64, 4, 32


def quantize_folder(src: Path, out: Path) -> Path:
    """src's model quantized like an mlx-community 4-bit conversion (tests/engine/test_weights.py's recipe)."""
    model = formats.load(formats.open_checkpoint(src)).model
    nn.quantize(model, GROUP, BITS, class_predicate=lambda _, layer: hasattr(layer, "to_quantized"))
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "onnx", "openvino"))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config = json.loads((out / "config.json").read_text())
    config["quantization"] = {"group_size": GROUP, "bits": BITS}
    (out / "config.json").write_text(json.dumps(config))
    return out


def throughput(eng: engine.Engine, batches: list[list[list[int]]]) -> float:
    """Texts per second over the batches, one embed call per 32-text batch."""
    started = time.perf_counter()
    for batch in batches:
        eng.embed(batch)
    return sum(len(b) for b in batches) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4, help="32-text batches per measurement")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kind", default="short", help="benchmarks/harness.py make_texts kind")
    args = parser.parse_args()
    src = Path(engine.default_model())
    with tempfile.TemporaryDirectory(prefix="minilm-4bit-") as tmp:
        q4 = quantize_folder(src, Path(tmp) / "minilm-4bit")
        engines = {"float folder": start_engine(src, threads=args.threads),
                   "4-bit, dequantized at load": start_engine(q4, threads=args.threads),
                   "4-bit, --keep-quantized": start_engine(q4, threads=args.threads, keep_quantized=True)}
        try:
            texts = make_texts(load_tokenizer(src), BATCH * args.batches, args.kind, seed=7)
            some = next(iter(engines.values()))
            batches = [[some.encode_prompt([t]) for t in texts[i:i + BATCH]] for i in range(0, len(texts), BATCH)]
            for eng in engines.values():  # warm every shape once
                throughput(eng, batches[:1])
            rates: dict[str, list[float]] = {name: [] for name in engines}
            for _ in range(args.rounds):
                for name, eng in engines.items():
                    rates[name].append(throughput(eng, batches))
            base = statistics.median(rates["float folder"])
            print(f"all-MiniLM-L6-v2, {args.kind} texts, batches of {BATCH}, {args.threads} BLAS threads, "
                  f"median of {args.rounds} rounds x {args.batches} batches")
            for name, eng in engines.items():
                rate = statistics.median(rates[name])
                print(f"{name:28s} {rate:8.1f} texts/s  {rate / base:6.3f}x float  weights: {eng.info.weights}, "
                      f"{eng.info.resident_bytes / 2**20:6.1f} MiB resident")
        finally:
            for eng in engines.values():
                eng.close()


if __name__ == "__main__":
    main()
