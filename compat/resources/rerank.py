"""POST /rerank, /reranking, /v1/rerank, /v1/reranking and /v2/rerank: parse -> engine -> render."""
from __future__ import annotations

import uuid

import falcon

from compat.errors import check_client_batch
from compat.models import RERANK
from compat.resources.leasing import model_request
from compat.routing import Models
from compat.wire.rerank import parse_rerank_request, render_rerank_response


class RerankResource:
    def __init__(self, models: Models, *, cohere_v2: bool):
        self._models = models
        self._cohere_v2 = cohere_v2

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, RERANK) as (served, body):
            request = parse_rerank_request(body(), cohere_v2=self._cohere_v2)
            check_client_batch(len(request.texts), served.settings.max_client_batch_size, "documents")
            result = served.engine.rerank(request.query, request.texts, truncate=request.truncate,
                                          instruction=request.instruction, timeout_s=served.remaining_s)
            served.record(result)
        resp.media = render_rerank_response(request, result, served.name, response_id=str(uuid.uuid4()))
