"""Property-based fuzzing of every route in /openapi.json (schemathesis) against the real server: one model (the
bundled MiniLM), and several (MiniLM and the fixture cross-encoder, so the rerank routes and the model management
routes are reached too). Every answer (errors included) matches the document; no answer is a 5xx the operation
does not declare (its 501 where this configuration does not serve it); the requests the document allows are
served: few of them refused (tests/fuzzing.py); and the server is healthy after. Bounded: a few examples per
operation, small request limits, no shrinking."""
from __future__ import annotations

import time
from collections import Counter

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import ce_fixture_dir, minilm_dir
from tests.fuzzing import Tallies, declared_server_error, problems, refused_shares
from tests.server.harness import ServerProcess

EXAMPLES_PER_OPERATION = 4  # per mode; the file stays near a minute on a loaded machine
CE = str(ce_fixture_dir())
LIMITS = ("--max-client-batch-size", "8", "--payload-limit", "20000", "-ub", "128", "-to", "60")


@pytest.fixture(scope="module", params=["one model", "several models"])
def fuzzed_server(request, tmp_path_factory):
    # small limits keep generated requests cheap: past them the answer is a (documented) 413 or 400
    if request.param == "one model":
        argv = ["--embedding", "--metrics", "--props", *LIMITS]
    else:
        preset = tmp_path_factory.mktemp("fuzz") / "models.ini"
        preset.write_text(f"[minilm]\nmodel = {minilm_dir()}\nload-on-startup = true\n"
                          f"[ce]\nmodel = {CE}\nreranking = true\nload-on-startup = true\n")
        argv = ["--models-preset", str(preset), "--metrics", *LIMITS]
    with ServerProcess(*argv) as srv:
        # loaded, the models' limits (vocabulary, width, prompts) are in the document
        deadline = time.monotonic() + 120
        while request.param == "several models" and any(
                model["status"]["value"] != "loaded" for model in srv.get("/models").json()["data"]):
            assert time.monotonic() < deadline, srv.get("/models").json()
            time.sleep(0.2)
        yield srv


def test_every_operation_holds_to_the_document(fuzzed_server):
    # one hypothesis run per operation, driven here: schemathesis' pytest plugin does not run under pytest 9
    document = requests.get(fuzzed_server.base + "/openapi.json", timeout=60).json()
    api_schema = schemathesis.openapi.from_dict(document)

    def no_undeclared_server_error(ctx: schemathesis.CheckContext, response: schemathesis.Response,
                                   case: schemathesis.Case) -> None:
        if not declared_server_error(document, case, response.status_code):  # a documented 501
            not_a_server_error(ctx, response, case)

    checks = [no_undeclared_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    failures, labels, tallies = [], [], Tallies()
    for result in api_schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)
        statuses = tallies.setdefault((operation.method.lower(), operation.path), Counter())
        for mode in schemathesis.GenerationMode:  # valid requests, then requests the document says are invalid

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            def holds(case: schemathesis.Case) -> None:
                response = case.call(base_url=fuzzed_server.base, timeout=60)
                if mode is schemathesis.GenerationMode.POSITIVE:
                    statuses[response.status_code] += 1
                case.validate_response(response, checks=checks)

            try:
                holds()
            except Unsatisfiable:  # nothing the document calls invalid can be sent (no body, no parameters)
                assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - every operation is fuzzed and reported
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert len(labels) >= 30 and {"POST /v1/embeddings", "POST /rerank", "POST /tokenize"} <= set(labels)
    assert not failures, "\n\n".join(failures)
    assert not problems(document, tallies), refused_shares(tallies)


def test_the_server_is_healthy_after_the_fuzzing(fuzzed_server):
    assert fuzzed_server.proc.poll() is None
    assert fuzzed_server.get("/health").status_code == 200
    res = fuzzed_server.post("/v1/embeddings", {"input": "still right"})
    assert res.status_code == 200 and len(res.json()["data"][0]["embedding"]) == 384
