"""The Prometheus text of /metrics (docs/llama-server-contract.md §6.5): every `llamacpp:` metric, in llama-server's order, then on a
several-model server the `mlx_embed:` metrics of each model, labelled by its id. Pure."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from engine.types import ModelState

if TYPE_CHECKING:
    from compat.routing import ModelView

# (name, type, help). Generation and speculative-decoding metrics exist for llama's clients and stay 0 here.
_METRICS = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed."),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache."),
    ("prompt_seconds_total", "counter", "Prompt process time"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed."),
    ("tokens_predicted_seconds_total", "counter", "Predict process time"),
    ("n_decode_total", "counter", "Total number of llama_decode() calls"),
    ("n_tokens_max", "counter", "Largest observed n_tokens."),
    ("spec_decode_num_draft_tokens_total", "counter", "Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Total draft tokens accepted"),
    ("spec_decode_num_drafts_total", "counter", "Total speculative decoding steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s."),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s."),
    ("requests_processing", "gauge", "Number of requests processing."),
    ("requests_deferred", "gauge", "Number of requests deferred."),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
)


def prompt_throughput(stats: Mapping[str, float], previous: Mapping[str, float] | None) -> float:
    """Prompt tokens per second since the previous scrape (llama resets this bucket on every scrape)."""
    before = previous or {}
    tokens = stats["prompt_tokens_total"] - before.get("prompt_tokens_total", 0)
    seconds = stats["prompt_seconds_total"] - before.get("prompt_seconds_total", 0.0)
    return tokens / seconds if tokens > 0 and seconds > 0 else 0.0


def render_metrics_response(stats: Mapping[str, float], prompt_tokens_seconds: float) -> str:
    values = {
        "prompt_tokens_total": stats["prompt_tokens_total"],
        "prompt_seconds_total": stats["prompt_seconds_total"],
        "n_decode_total": stats["n_decode_total"],
        "n_tokens_max": stats["n_tokens_max"],
        "prompt_tokens_seconds": prompt_tokens_seconds,
        "requests_processing": stats["requests_processing"],
        "requests_deferred": stats["requests_deferred"],
    }
    lines = []
    for name, kind, help_text in _METRICS:
        # `:g` is C++'s default `ostream << double` (6 significant digits), which llama uses
        lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {float(values.get(name, 0)):g}"]
    return "\n".join(lines) + "\n"


# (name, type, help, value). Load time is its own gauge: it is never part of a request's queue or compute time.
_MODEL_METRICS: tuple[tuple[str, str, str, Callable[[ModelView], float]], ...] = (
    ("requests_total", "counter", "Requests routed to the model.", lambda v: v.usage.requests),
    ("errors_total", "counter", "Requests to the model that failed.", lambda v: v.usage.errors),
    ("items_total", "counter", "Inputs embedded or documents scored.", lambda v: v.usage.items),
    ("tokens_total", "counter", "Tokens of the inputs and document pairs served.", lambda v: v.usage.tokens),
    ("queue_seconds_total", "counter", "Time inputs waited for the engine thread.", lambda v: v.usage.queue_s),
    ("compute_seconds_total", "counter", "Forward-pass time spent on the model's requests.",
     lambda v: v.usage.compute_s),
    ("in_use", "gauge", "Requests using the model right now (its load).", lambda v: v.status.in_use),
    ("loaded", "gauge", "1 while the model is loaded.", lambda v: v.status.state is ModelState.LOADED),
    ("load_seconds", "gauge", "How long the model's last load took.", lambda v: v.status.load_s or 0.0),
    ("loaded_bytes", "gauge", "Bytes the model's weights hold resident while it is loaded (measured at load).",
     lambda v: v.status.loaded_bytes),
    ("memory_bytes", "gauge", "What the model holds resident now, as /models memory_bytes: counted against "
     "--models-memory.", lambda v: v.status.loaded_bytes),
)


def render_model_metrics(views: Sequence[ModelView]) -> str:
    lines = []
    for name, kind, help_text, value in _MODEL_METRICS:
        lines += [f"# HELP mlx_embed:{name} {help_text}", f"# TYPE mlx_embed:{name} {kind}"]
        lines += [f'mlx_embed:{name}{{model="{_label(view.spec.id)}"}} {_number(value(view))}' for view in views]
    return "\n".join(lines) + "\n"


def render_server_metrics(requests_in_flight: int, draining: bool) -> str:
    """What an autoscaler or load balancer reads beside llama's queue gauges (requests_processing,
    requests_deferred): HTTP requests inside the server and whether it is draining after SIGTERM."""
    lines = []
    for name, help_text, value in (
            ("requests_in_flight", "HTTP requests being handled now, every route.", requests_in_flight),
            ("draining", "1 after SIGTERM/SIGINT while requests in flight finish.", int(draining))):
        lines += [f"# HELP mlx_embed:{name} {help_text}", f"# TYPE mlx_embed:{name} gauge",
                  f"mlx_embed:{name} {value}"]
    return "\n".join(lines) + "\n"


def _label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Exact: counts print as integers, times in full (llama's 6-digit `:g` would round big counters)."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)
