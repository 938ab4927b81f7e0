"""Where our server's startup goes, stage by stage, in one process: the imports the server does before it
listens, then the model load as engine/runtime/loader.py runs it (the checkpoint's metadata, the tokenizer, the
weights read and dequantized, the fitting's warm-up passes one width at a time), timed by wrapping those calls.

    .venv/bin/python -m benchmarks.startup_profile                       # SmolLM2 Q4_1 and the bundled MiniLM
    .venv/bin/python -m benchmarks.startup_profile -m FILE_OR_FOLDER -- --pooling mean -c 8192 -ub 8192

The server's own flags go after `--` (default for the GGUF: vs_llama.py's startup flags). Prints one table
per model; benchmarks/README.md ("Startup, stage by stage") holds a measured run. One process per model, so each
import is cold (the operating system's file cache stays warm); our modules' bytecode is compiled first, as an
installed package's is.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

STARTUP_FLAGS = "--embedding --pooling mean -c 8192 -b 8192 -ub 8192 -t 2"


def profile(model: str, flags: list[str]) -> list[tuple[str, float]]:
    """(stage, seconds) of one load of `model` with the server's `flags`, in this process."""
    t0 = time.perf_counter()
    stages: list[tuple[str, float]] = []

    def mark(name: str, since: float) -> float:
        now = time.perf_counter()
        stages.append((name, now - since))
        return now

    from compat.settings import parse_settings
    t = mark("import compat.settings", t0)
    from compat import server  # noqa: F401  (what compat/cli.py imports before listening: the engine, MLX, falcon)
    t = mark("import compat.server (engine, MLX, falcon, waitress)", t)
    from engine.loading import formats, hub
    from engine.loading.gguf.format import GGUFFormat
    from engine.runtime import loader, shapes, threads
    t = mark("import the GGUF reader", t)

    settings = parse_settings(["-m", model, *flags], {})
    opts = settings.engine_options(model)
    lanes, blas_threads = threads.plan(opts.threads)

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                stages.append((name, time.perf_counter() - start))
        return wrapper

    # loader.py calls these through their modules, so wrapping the module attributes times each stage
    hub.resolve = timed("resolve -m", hub.resolve)
    formats.open_checkpoint = timed("checkpoint metadata (open_checkpoint)", formats.open_checkpoint)
    formats.load = timed("weights read, dequantized, built (formats.load)", formats.load)
    for fmt in (GGUFFormat, formats.SafetensorsFormat):
        fmt.open_tokenizer = timed("tokenizer build", fmt.open_tokenizer)
    prepare = shapes.prepare

    def timed_prepare(runner, *args, **kwargs):
        def run(ids, *rest):
            start = time.perf_counter()
            out = runner(ids, *rest)
            stages.append((f"  warm-up pass, {ids.shape[0]} x {ids.shape[1]} tokens", time.perf_counter() - start))
            return out
        return prepare(run, *args, **kwargs)

    shapes.prepare = timed("shapes.prepare (the fitting, all its passes)", timed_prepare)
    start = time.perf_counter()
    loader.load(opts, lanes, blas_threads)
    stages.append(("model load (loader.load, total)", time.perf_counter() - start))
    stages.append(("total in process", time.perf_counter() - t0))
    return stages


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None, help="one model (default: SmolLM2 Q4_1 and the bundled MiniLM)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("flags", nargs="*", help="server flags (after --)")
    args = p.parse_args()
    if args.child:
        print(json.dumps(profile(args.model, args.flags)))
        return 0
    if args.model:
        runs = [(args.model, args.flags or STARTUP_FLAGS.split())]
    else:
        from tests.conftest import minilm_dir, smollm2_gguf
        runs = [(str(smollm2_gguf()), STARTUP_FLAGS.split()), (str(minilm_dir()), STARTUP_FLAGS.split())]
    from benchmarks.harness import compile_bytecode

    compile_bytecode()  # an installed server's modules come compiled (benchmarks/harness.py)
    for model, flags in runs:
        out = subprocess.run([sys.executable, "-m", "benchmarks.startup_profile", "--child", "-m", model, "--",
                              *flags], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        print(f"\n{model} {' '.join(flags)}\n\n| stage | s |\n|---|---:|")
        for name, seconds in json.loads(out.stdout.splitlines()[-1]):
            print(f"| {name} | {seconds:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
