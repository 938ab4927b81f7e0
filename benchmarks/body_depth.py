"""The request body's nesting check against parsing the same body: both on ~1.5 MB bodies of the shapes clients
send (plain texts, texts with quotes and brackets in them, token-id lists, one base64 image, content-part
lists). The check is what compat.wire.inputs.parse_json_object (the body parsed inside one-element arrays, so
that orjson's own depth limit bounds it) costs over orjson's plain parse of that body. Each figure is the best
of --rounds.

    .venv/bin/python benchmarks/body_depth.py [--rounds 25]
"""
from __future__ import annotations

import argparse
import base64
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compat.wire.inputs import parse_json_object  # noqa: E402

BODIES = {
    "plain texts": {"input": ["a text of plain words, with a line break\nand a tab\tin it " * 6] * 4000},
    "texts": {"input": ['a "quoted" [bracketed] {braced} text with a \\ and a\nnewline ' * 6] * 4000},
    "token ids": {"input": [[101 + i % 900 for i in range(300)] for _ in range(1000)]},
    "image": {"input": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 4300).decode()}}]},
    "content parts": {"input": [[{"type": "text", "text": "x" * 50}] for _ in range(15000)]},
}


def best(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    rounds = parser.parse_args().rounds
    print(f"{'body':14s} {'MB':>5s} {'parse ms':>9s} {'checked ms':>11s} {'check ms':>9s} {'check/parse':>12s}")
    for name, body in BODIES.items():
        raw = orjson.dumps(body)
        parse_s = best(lambda: orjson.loads(raw), rounds)
        checked_s = best(lambda: parse_json_object(raw), rounds)
        check_s = max(0.0, checked_s - parse_s)
        print(f"{name:14s} {len(raw) / 1e6:5.2f} {parse_s * 1e3:9.2f} {checked_s * 1e3:11.2f} {check_s * 1e3:9.2f} "
              f"{check_s / parse_s:11.2f}x")


if __name__ == "__main__":
    main()
