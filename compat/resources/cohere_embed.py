"""POST /v1/embed and /v2/embed (Cohere): parse -> engine -> render, every error in Cohere's {"message"} shape."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import falcon

from compat.catalog import EMBEDDING
from compat.errors import ApiError, api_error_from_engine, bad_request, check_client_batch
from compat.resources.embeddings import embed_request_prompts
from compat.resources.leasing import model_request
from compat.routing import Models
from compat.wire.cohere_embed import cohere_error, parse_cohere_embed_request, render_cohere_embed_response
from engine.errors import EngineError
from engine.types import Pooling

NOT_POOLED = ("this model answers one vector per token (--pooling none or a multi-vector model); Cohere's embed "
              "answers one vector per text")


@contextmanager
def cohere_errors() -> Iterator[None]:
    """Our errors (ApiError, engine errors) re-raised in Cohere's envelope with the same status."""
    try:
        yield
    except ApiError as exc:
        raise cohere_error(exc) from exc
    except EngineError as exc:
        raise cohere_error(api_error_from_engine(exc)) from exc


class CohereEmbedResource:
    def __init__(self, models: Models, *, version: int):
        self._models = models
        self._version = version

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with cohere_errors(), model_request(req, self._models, EMBEDDING) as (served, body):
            info = served.engine.info
            if info.pooling is Pooling.NONE or info.multi_vector:
                raise bad_request(NOT_POOLED)
            request = parse_cohere_embed_request(body(), version=self._version, width=info.n_embd,
                                                 prompt_names=[name for name, _ in info.prompts],
                                                 task_names=[name for name, _ in info.tasks])
            check_client_batch(len(request.texts), served.settings.max_client_batch_size, "texts")
            result = embed_request_prompts(served, [[text] for text in request.texts], request.truncate,
                                           request.prompt_name, None, 2, request.dimensions,
                                           request.truncation_direction, request.late_chunking, request.task)
            served.record(result)
        resp.media = render_cohere_embed_response(request, result, response_id=str(uuid.uuid4()))
