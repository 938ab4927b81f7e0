"""POST /embedding, /embeddings (llama's shape) and /v1/embeddings (OAI shape): parse -> engine -> render."""
from __future__ import annotations

import falcon

from compat.errors import bad_request, check_client_batch
from compat.models import EMBEDDING
from compat.resources.leasing import model_request
from compat.routing import Models
from compat.wire.embeddings import parse_embeddings_request, render_embeddings_response
from engine.types import Pooling

POOLING_NONE_OAI = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"


class EmbeddingsResource:
    def __init__(self, models: Models, *, oai: bool):
        self._models = models
        self._oai = oai

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, EMBEDDING) as (served, body):
            # single model: llama checks this before reading the body, so it wins over bad JSON and `content`
            if self._oai and served.engine.info.pooling is Pooling.NONE:
                raise bad_request(POOLING_NONE_OAI)
            request = parse_embeddings_request(body(), oai_route=self._oai,
                                               default_normalize=served.settings.embd_normalize,
                                               width=served.engine.info.n_embd)
            check_client_batch(len(request.prompts), served.settings.max_client_batch_size, "inputs")
            prompts = served.engine.format_prompts(request.prompts, request.prompt_name, request.instruction,
                                                   request.truncate)
            result = served.engine.embed_prompts(prompts, truncate=request.truncate, timeout_s=served.remaining_s)
            served.record(result)
        resp.media = render_embeddings_response(request, result, served.name)
