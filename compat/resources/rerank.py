"""POST /rerank, /reranking, /v1/rerank, /v1/reranking and /v2/rerank: parse -> engine -> render."""
from __future__ import annotations

import uuid

import falcon

from compat.catalog import RERANK
from compat.media import with_images
from compat.resources.leasing import check_count, model_request
from compat.routing import Models
from compat.settings import Settings
from compat.wire.inputs import Prompt
from compat.wire.rerank import Item, count_documents, parse_rerank_request, render_rerank_response
from engine.types import ImageInput


class RerankResource:
    def __init__(self, models: Models, *, cohere_v2: bool):
        self._models = models
        self._cohere_v2 = cohere_v2

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, RERANK) as (served, body):
            check_count(served, count_documents(body()), "documents")
            request = parse_rerank_request(body(), cohere_v2=self._cohere_v2,
                                           takes_images=served.engine.info.takes_images)
            query, *documents = fetch_query_documents([request.query, *request.items], served.settings)
            result = served.engine.rerank(query, documents, truncate=request.truncate,
                                          instruction=request.instruction, max_chunks=request.max_chunks,
                                          timeout_s=served.remaining_s)
            served.record(result)
        resp.media = render_rerank_response(request, result, served.name, response_id=str(uuid.uuid4()))



def fetch_query_documents(items: list[Item], settings: Settings) -> list[str | Prompt | ImageInput]:
    """The query then the documents, images fetched here (the query's once); the engine decodes them off its
    thread. Errors name "query" or "document i"."""
    labels = ["query", *(f"document {i}" for i in range(len(items) - 1))]
    return with_images(labels, items, settings)
