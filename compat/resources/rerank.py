"""POST /rerank, /reranking, /v1/rerank, /v1/reranking and /v2/rerank: parse -> engine -> render."""
from __future__ import annotations

import uuid

import falcon

from compat.errors import check_client_batch
from compat.media import MediaPolicy, image_input, request_media_policy
from compat.models import RERANK
from compat.resources.leasing import model_request
from compat.routing import Models
from compat.wire.rerank import Item, parse_rerank_request, render_rerank_response
from engine.types import ImageInput


class RerankResource:
    def __init__(self, models: Models, *, cohere_v2: bool):
        self._models = models
        self._cohere_v2 = cohere_v2

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, RERANK) as (served, body):
            request = parse_rerank_request(body(), cohere_v2=self._cohere_v2,
                                           takes_images=served.engine.info.takes_images)
            check_client_batch(len(request.items), served.settings.max_client_batch_size, "documents")
            served.engine.check_count(len(request.items))  # before any image is fetched
            items = [request.query, *request.items]
            # images are fetched here (the query's once); the engine decodes them off its thread
            policy = request_media_policy([item for item in items if not isinstance(item, str)], served.settings)
            query = _engine_item("query", request.query, policy)
            documents = [_engine_item(f"document {i}", item, policy) for i, item in enumerate(request.items)]
            result = served.engine.rerank(query, documents, truncate=request.truncate,
                                          instruction=request.instruction, timeout_s=served.remaining_s)
            served.record(result)
        resp.media = render_rerank_response(request, result, served.name, response_id=str(uuid.uuid4()))


def _engine_item(label: str, item: Item, policy: MediaPolicy | None) -> str | ImageInput:
    """The text, or the text pieces and fetched images in order (an item may hold several images)."""
    return item if isinstance(item, str) else image_input(label, item, policy)
