"""POST /embedding, /embeddings (llama's shape) and /v1/embeddings (OAI shape): parse -> engine -> render."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import falcon

from compat.errors import INVALID_REQUEST, NOT_SUPPORTED, ApiError
from compat.wire.embeddings import parse_embeddings_request, render_embeddings_response
from compat.wire.inputs import parse_json_object
from engine import Engine
from engine.types import Pooling, Timings

if TYPE_CHECKING:
    from compat.settings import Settings

NOT_ENABLED = "This server does not support embeddings. Start it with `--embeddings`"
POOLING_NONE_OAI = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"


class EmbeddingsResource:
    def __init__(self, engine: Engine, settings: Settings, *, oai: bool):
        self._engine = engine
        self._settings = settings
        self._oai = oai

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._settings.embedding:
            raise ApiError(501, NOT_SUPPORTED, NOT_ENABLED)
        # llama checks this before reading the body, so it wins over bad JSON and over `content`
        if self._oai and self._engine.info.pooling is Pooling.NONE:
            raise ApiError(400, INVALID_REQUEST, POOLING_NONE_OAI)
        request = parse_embeddings_request(parse_json_object(req.bounded_stream.read()), oai_route=self._oai,
                                           default_normalize=self._settings.embd_normalize)
        # tokenize here, on the request thread, so the engine thread only runs forward passes
        started = time.perf_counter()
        token_lists = [self._engine.encode_prompt(prompt) for prompt in request.prompts]
        tokenize_s = time.perf_counter() - started
        result = self._engine.embed(token_lists, truncate=request.truncate, timeout_s=self._settings.timeout)
        req.context.timings = Timings(tokenize_s=tokenize_s + result.timings.tokenize_s,
                                      queue_s=result.timings.queue_s, inference_s=result.timings.inference_s)
        resp.media = render_embeddings_response(request, result, self._settings.model_name)
