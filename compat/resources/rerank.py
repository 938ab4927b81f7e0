"""POST /rerank, /reranking, /v1/rerank, /v1/reranking and /v2/rerank in rank mode: parse -> engine -> render."""
from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import falcon

from compat.wire.inputs import parse_json_object
from compat.wire.rerank import parse_rerank_request, render_rerank_response
from engine import Engine

if TYPE_CHECKING:
    from compat.settings import Settings


class RerankResource:
    def __init__(self, engine: Engine, settings: Settings, *, cohere_v2: bool):
        self._engine = engine
        self._settings = settings
        self._cohere_v2 = cohere_v2

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_rerank_request(parse_json_object(req.bounded_stream.read()), cohere_v2=self._cohere_v2)
        result = self._engine.rerank(request.query, request.texts, truncate=request.truncate,
                                     instruction=request.instruction, timeout_s=self._settings.timeout)
        req.context.timings = result.timings
        resp.media = render_rerank_response(request, result, self._settings.model_name,
                                            response_id=str(uuid.uuid4()))
