"""POST /embedding, /embeddings (llama's shape) and /v1/embeddings (OAI shape): parse -> engine -> render."""
from __future__ import annotations

import falcon

from compat.errors import bad_request, check_client_batch
from compat.media import image_input, request_media_policy
from compat.models import EMBEDDING
from compat.resources.leasing import model_request
from compat.routing import Models
from compat.wire.embeddings import parse_embeddings_request, render_embeddings_response
from compat.wire.inputs import has_media
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
            info = served.engine.info
            request = parse_embeddings_request(body(), oai_route=self._oai,
                                               default_normalize=served.settings.embd_normalize,
                                               width=info.n_embd, takes_images=info.takes_images)
            check_client_batch(len(request.prompts), served.settings.max_client_batch_size, "inputs")
            served.engine.check_count(len(request.prompts))  # before any image is fetched
            policy = request_media_policy(request.prompts, served.settings)
            texts = iter(served.engine.format_prompts([p for p in request.prompts if not has_media(p)],
                                                      request.prompt_name, request.instruction, request.truncate))
            # images are fetched here; the engine decodes them and tokenizes the texts, both off its thread
            prompts = [image_input(f"input {i}", prompt, policy) if has_media(prompt) else next(texts)
                       for i, prompt in enumerate(request.prompts)]
            result = served.engine.embed_prompts(prompts, truncate=request.truncate, timeout_s=served.remaining_s)
            served.record(result)
        resp.media = render_embeddings_response(request, result, served.name)

