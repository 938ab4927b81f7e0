"""Per-stage timestamps of one request, for benchmarks/request_path.py: asked for by the request itself.

A request carrying `X-Stage-Times: 1` gets an `x-stage-times` response header: `name=seconds` pairs, `;`
separated, of time.monotonic() stamps (the clock waitress stamps arrivals with, and the one a client on the same
host reads) plus the engine's own durations. Without the request header nothing is recorded beyond one header
lookup, so the stamps cost a lone request nothing. Stamps, in order:

- `arrived`: waitress made the request's parser (its first bytes were read);
- `app`: the falcon app's first middleware (the request was parsed by waitress and handed to a task thread);
- `parsed`: the body's JSON parsed (after the middleware chain, routing and the lease);
- `engine_in` / `engine_out`: around the engine call (prompts formatted, tokenized, fitted, queued, computed,
  handed back, finished); the engine's `tokenize_s`, `queue_s` (queued until its pass started) and
  `inference_s` (the pass) come beside them;
- `rendered`: the response built as Python objects;
- `serialized`: the response body written to bytes (orjson), just before waitress writes it out.
"""
from __future__ import annotations

import time
from typing import Any

import falcon

REQUEST_HEADER = "X-Stage-Times"
RESPONSE_HEADER = "x-stage-times"


def begin(req: falcon.Request, arrived: float | None) -> None:
    """Start recording when the request asked for its stage times (the first middleware calls this, with the
    listener's arrival stamp)."""
    if req.get_header(REQUEST_HEADER) == "1":
        stages: dict[str, float] = {"arrived": arrived} if arrived is not None else {}
        stages["app"] = time.monotonic()
        req.context.stages = stages


def stamp(req: falcon.Request, name: str) -> None:
    stages = req.context.get("stages")
    if stages is not None:
        stages[name] = time.monotonic()


def finish(req: falcon.Request, resp: falcon.Response, timings: Any) -> None:
    """Serialize the body now (falcon keeps the rendered bytes, so it is not serialized twice) to stamp it, and
    set the response header."""
    stages = req.context.get("stages")
    if stages is None:
        return
    resp.render_body()
    stages["serialized"] = time.monotonic()
    if timings is not None:
        stages.update(tokenize_s=timings.tokenize_s, queue_s=timings.queue_s, inference_s=timings.inference_s)
    resp.set_header(RESPONSE_HEADER, ";".join(f"{name}={value!r}" for name, value in stages.items()))


def parse(header: str) -> dict[str, float]:
    """The response header back into {name: seconds}."""
    return {name: float(value) for name, value in (pair.split("=", 1) for pair in header.split(";") if pair)}
