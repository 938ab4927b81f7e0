"""A lone short request, stage by stage: where the time outside the forward pass goes, and the p50 against
llama-server's in the same invocation.

Both servers run as real processes (benchmarks/harness.py: ours with `--embedding -m <MiniLM>`, llama-server on
the same model's f16 GGUF with `--pooling mean`, both with vs_llama.py's flags `-c 8192 -b 2048 -ub 2048 -np 8
-t 2`). One client, one keep-alive connection (http.client, the body prebuilt: the client's own cost stays
small and is the same for both), one ~15-token text per `/v1/embeddings` request, requests one after another.

Rounds interleave three batches of requests, their order rotated each round: ours, llama-server, and ours with
`X-Stage-Times: 1` (compat/stages.py), which makes our server report time.monotonic() stamps of each stage; the
client stamps the same clock (same host) before it sends and after it has read the answer. The p50s compare the
plain batches; the stage table is the medians over the stamped ones:

  client -> waitress      the client's send until waitress made the request's parser (kernel, select wake-up)
  waitress -> app         HTTP parse and the hand-off to a waitress task thread, until the falcon app runs
  middleware + JSON       the middleware chain, routing, the lease and the body's JSON parse
  request fields          the request's fields checked and its inputs read (compat/wire/embeddings.py)
  tokenize + fit          the engine's tokenize_s (prompts tokenized and fitted, on the request thread)
  queue -> pass           submit to the engine lane until its pass starts (the hand-off, batch assembly)
  forward pass            the engine's inference_s: the pass launched, evaluated, its rows in numpy
  hand-back + finish      the rest of the engine call: prompt formatting, the wake-up of the request thread,
                          normalizing the vector
  render                  the OpenAI response built as Python objects
  serialize               orjson to bytes
  write -> client         waitress writes the answer out and the client reads it

"outside the pass (server)" sums the server's stages (waitress -> app through serialize, the forward pass left
out); "outside the pass (client)" is the client's whole time less the forward pass. Medians are per stage (they
do not add up to the median total exactly).
"""
from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    MeasuredServer,
    free_port,
    llama_argv,
    load_tokenizer,
    make_texts,
    our_server_argv,
    token_counts,
)
from compat import stages  # noqa: E402

PEERS = Path("/work/shared/peers/llama-server")
GGUF = Path("/work/shared/fixtures/gguf/minilm-f16.gguf")
SERVER_FLAGS = "-c 8192 -b 2048 -ub 2048 -np 8 -t 2"  # vs_llama.py's

STAGES = (  # (label, function of one stamped request's stamps and client times, in seconds)
    ("client -> waitress", lambda s: s["arrived"] - s["sent"]),
    ("waitress -> app", lambda s: s["app"] - s["arrived"]),
    ("middleware + JSON", lambda s: s["parsed"] - s["app"]),
    ("request fields", lambda s: s["engine_in"] - s["parsed"]),
    ("tokenize + fit", lambda s: s["tokenize_s"]),
    ("queue -> pass", lambda s: s["queue_s"]),
    ("forward pass", lambda s: s["inference_s"]),
    ("hand-back + finish", lambda s: (s["engine_out"] - s["engine_in"]) - s["tokenize_s"] - s["queue_s"]
     - s["inference_s"]),
    ("render", lambda s: s["rendered"] - s["engine_out"]),
    ("serialize", lambda s: s["serialized"] - s["rendered"]),
    ("write -> client", lambda s: s["received"] - s["serialized"]),
)
SUMMARY = (
    ("outside the pass (server)", lambda s: (s["serialized"] - s["arrived"]) - s["inference_s"]),
    ("outside the pass (client)", lambda s: (s["received"] - s["sent"]) - s["inference_s"]),
    ("whole request (client)", lambda s: s["received"] - s["sent"]),
)


class Client:
    """One keep-alive connection; request i embeds text i of the pool (cycling)."""

    def __init__(self, port: int, pool: list[str]):
        import orjson

        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.bodies = [orjson.dumps({"input": text, "model": "bench"}) for text in pool]

    def reconnect(self) -> None:
        """A fresh connection, its first request untimed (a server may close an idle keep-alive connection
        while the other batches run)."""
        self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        self.call(0)

    def call(self, i: int, staged: bool = False) -> dict[str, float]:
        headers = {"Content-Type": "application/json"}
        if staged:
            headers[stages.REQUEST_HEADER] = "1"
        sent = time.monotonic()
        self.conn.request("POST", "/v1/embeddings", self.bodies[i % len(self.bodies)], headers)
        resp = self.conn.getresponse()
        body = resp.read()
        received = time.monotonic()
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {body[:300]!r}")
        stamps = {"sent": sent, "received": received}
        if staged:
            stamps.update(stages.parse(resp.getheader(stages.RESPONSE_HEADER) or ""))
        return stamps


def run(args: argparse.Namespace) -> dict:
    from engine import default_model

    model = Path(args.model or default_model())
    tok = load_tokenizer(model)
    pool = make_texts(tok, 256, "short", args.seed)
    n_tokens = statistics.median(token_counts(tok, pool))
    flags = args.flags.split()
    ours_latency: list[float] = []
    llama_latency: list[float] = []
    stamped: list[dict[str, float]] = []
    rounds: list[tuple[float, float]] = []  # per-round p50s (ours, llama)
    with tempfile.TemporaryDirectory(prefix="request-path-") as tmp:
        ours = MeasuredServer("ours", our_server_argv(model, port := free_port(), False) + flags, port, Path(tmp))
        try:
            llama = MeasuredServer("llama", llama_argv(args.llama_server_bin, args.gguf, lport := free_port(), False,
                                                       args.flags + " --pooling mean"), lport, Path(tmp))
        except BaseException:
            ours.stop()
            raise
        try:
            print(f"started: ours {ours.startup_s:.1f} s, llama-server {llama.startup_s:.1f} s", file=sys.stderr,
                  flush=True)
            clients = {"ours": Client(ours.port, pool), "llama": Client(llama.port, pool)}
            for c in clients.values():  # warm: first requests, caches, allocator
                for i in range(20):
                    c.call(i)
            clients["ours"].call(0, staged=True)
            batches = ["ours", "llama", "staged"]
            for r in range(args.rounds):
                order = batches[r % 3:] + batches[:r % 3]
                got: dict[str, list[float]] = {}
                for batch in order:
                    client = clients["llama" if batch == "llama" else "ours"]
                    client.reconnect()
                    for i in range(args.requests):
                        s = client.call(r * args.requests + i, staged=batch == "staged")
                        if batch == "staged":
                            stamped.append(s)
                        else:
                            got.setdefault(batch, []).append(s["received"] - s["sent"])
                ours_latency += got["ours"]
                llama_latency += got["llama"]
                rounds.append((statistics.median(got["ours"]), statistics.median(got["llama"])))
                print(f"round {r + 1}: p50 ours {rounds[-1][0] * 1e3:.1f} ms, llama {rounds[-1][1] * 1e3:.1f} ms",
                      file=sys.stderr, flush=True)
        finally:
            ours.stop()
            llama.stop()
    return {"n_tokens": n_tokens, "ours": ours_latency, "llama": llama_latency, "stamped": stamped,
            "rounds": rounds}


def report(res: dict, args: argparse.Namespace, load_avg: tuple[float, float, float]) -> str:
    ms = lambda v: f"{v * 1e3:.3f}"  # noqa: E731
    lines = [f"# A lone short request: {args.rounds} rounds x {args.requests} requests per server, one "
             f"{res['n_tokens']:.0f}-token text each, flags `{args.flags}`; load average at the start "
             f"{load_avg[0]:.2f}", "", "| stage | median ms | p90 ms |", "|---|---|---|"]
    for label, f in STAGES + SUMMARY:
        values = sorted(f(s) for s in res["stamped"])
        lines.append(f"| {label} | {ms(statistics.median(values))} | {ms(values[int(0.9 * (len(values) - 1))])} |")
    p50_ours, p50_llama = statistics.median(res["ours"]), statistics.median(res["llama"])
    per_round = ", ".join(f"{o / l:.2f}" for o, l in res["rounds"])
    lines += ["", f"single-request p50: ours {ms(p50_ours)} ms, llama-server {ms(p50_llama)} ms, "
                  f"ours / llama {p50_ours / p50_llama:.2f} (per round: {per_round}; best: ours "
                  f"{ms(min(res['ours']))}, llama {ms(min(res['llama']))})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=100, help="requests per server per round (default 100)")
    p.add_argument("--llama-server-bin", default=str(PEERS))
    p.add_argument("--gguf", default=str(GGUF))
    p.add_argument("--model", default=None, help="our model folder (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--flags", default=SERVER_FLAGS, help=f"both servers' flags (default: {SERVER_FLAGS})")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    load_avg = os.getloadavg()
    print(report(run(args), args, load_avg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
