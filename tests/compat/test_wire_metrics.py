"""compat.wire.metrics: llama's Prometheus text, without HTTP."""
from __future__ import annotations

from compat.wire.metrics import prompt_throughput, render_metrics_response
from tests.conftest import parse_metrics

STATS = {"prompt_tokens_total": 1234567, "prompt_seconds_total": 54.285, "n_decode_total": 332,
         "n_tokens_max": 512, "requests_processing": 1, "requests_deferred": 0}


def test_values_print_like_cpp_ostream():
    got = parse_metrics(render_metrics_response(STATS, 1249.6543))
    assert got["llamacpp:prompt_tokens_total"] == "1.23457e+06"
    assert got["llamacpp:prompt_seconds_total"] == "54.285"
    assert got["llamacpp:prompt_tokens_seconds"] == "1249.65"
    assert got["llamacpp:n_decode_total"] == "332"
    assert got["llamacpp:spec_decode_num_drafts_total"] == "0"


def test_throughput_is_measured_since_the_previous_scrape():
    assert prompt_throughput(STATS, None) == 1234567 / 54.285
    later = {**STATS, "prompt_tokens_total": 1234567 + 300, "prompt_seconds_total": 54.285 + 0.5}
    assert abs(prompt_throughput(later, STATS) - 600.0) < 1e-6
    assert prompt_throughput(STATS, STATS) == 0.0
