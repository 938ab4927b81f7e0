"""Sequence classification: TEI's POST /predict (and POST / on a classifier, compat/resources/tei.py) and vLLM's
POST /classify, on a classifier or a one-label cross-encoder: parse (compat/wire/classify.py) -> Engine.classify
-> render. The engine is leased as on every route (same batching, limits, /metrics); /predict's errors leave in
TEI's body, /classify's in our OpenAI-style envelope."""
from __future__ import annotations

import time
import uuid

import falcon

from compat.errors import check_client_batch
from compat.resources.leasing import model_request
from compat.routing import Models, Served
from compat.wire.classify import (
    parse_classify_request,
    parse_predict_request,
    render_classify_response,
    render_predict_response,
)
from compat.wire.tei import tei_errors


def tei_predict(served: Served, body: dict) -> list:
    """TEI's /predict body on the leased model (POST / hands a classifier's requests here too)."""
    request = parse_predict_request(body)
    check_client_batch(len(request.inputs), served.settings.max_client_batch_size, "inputs")
    result = served.engine.classify(request.inputs, truncate=request.truncate,
                                    truncation_direction="left" if request.truncate_left else "right",
                                    raw_scores=request.raw_scores, timeout_s=served.remaining_s)
    served.record(result)
    return render_predict_response(request, result)


class PredictResource:
    """POST /predict (TEI)."""

    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with tei_errors(), model_request(req, self._models, None) as (served, body):
            answer = tei_predict(served, body())
        resp.media = answer


class ClassifyResource:
    """POST /classify and /v1/classify (vLLM)."""

    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, None) as (served, body):
            request = parse_classify_request(body())
            check_client_batch(len(request.texts), served.settings.max_client_batch_size, "input")
            result = served.engine.classify(request.texts, truncate=request.truncate,
                                            raw_scores=not request.use_activation, timeout_s=served.remaining_s)
            served.record(result)
        resp.media = render_classify_response(request, result, served.name,
                                              response_id=f"classify-{uuid.uuid4().hex}", created=int(time.time()))


def classify_routes(models: Models) -> dict[str, object]:
    """The classification routes for the app's route table."""
    classify = ClassifyResource(models)
    return {"/predict": PredictResource(models), "/classify": classify, "/v1/classify": classify}
