"""Model load time: all-MiniLM-L6-v2 from its safetensors folder against the same model as llama.cpp GGUFs.

Times what differs between the formats (reading the checkpoint, building the tokenizer, loading the
weights into the family), not the shape preparation that follows either. Rounds alternate the formats;
the median of each is printed as a ratio to the safetensors load, with the dequantization part of each
GGUF load (reading every tensor to fp32) measured on its own.

    .venv/bin/python benchmarks/gguf_load.py [--rounds 7] [--shared PATH]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402  (binds the BLAS before mlx loads)
from engine.loading import formats  # noqa: E402
from engine.loading.gguf.reader import GGUFFile  # noqa: E402


def load_once(path: Path) -> float:
    started = time.perf_counter()
    ckpt = formats.open_checkpoint(path)
    ckpt.format.open_tokenizer(ckpt)
    formats.load(ckpt)
    return time.perf_counter() - started


def dequantize_once(path: Path) -> float:
    started = time.perf_counter()
    gguf = GGUFFile(path)
    for name in gguf.tensors:
        gguf.array(name).astype("float32")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    args = parser.parse_args()
    fixtures = args.shared / "fixtures" / "gguf"
    if not fixtures.is_dir():
        fixtures = Path("/work/shared/fixtures/gguf")
    models = {"safetensors": Path(engine.default_model()), "gguf F16": fixtures / "minilm-f16.gguf",
              "gguf Q4_0": fixtures / "minilm-q4_0.gguf"}
    for path in models.values():  # warm the page cache and the imports once
        load_once(path)
    times: dict[str, list[float]] = {name: [] for name in models}
    reads: dict[str, list[float]] = {name: [] for name in models if name != "safetensors"}
    for _ in range(args.rounds):
        for name, path in models.items():
            times[name].append(load_once(path))
            if name in reads:
                reads[name].append(dequantize_once(path))
    base = statistics.median(times["safetensors"])
    print(f"all-MiniLM-L6-v2 load, median of {args.rounds} rounds (checkpoint + tokenizer + weights)")
    print(f"{'format':<12} {'seconds':>8} {'vs safetensors':>15} {'tensor read + dequantize':>26}")
    for name, values in times.items():
        median = statistics.median(values)
        read = f"{statistics.median(reads[name]):.3f} s" if name in reads else "-"
        print(f"{name:<12} {median:8.3f} {median / base:14.2f}x {read:>26}")


if __name__ == "__main__":
    main()
