"""POST /embedding, /embeddings (llama's shape) and /v1/embeddings (OAI shape): parse -> engine -> render."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import falcon

from compat.errors import bad_request
from compat.media import MediaPolicy, image_input
from compat.models import EMBEDDING
from compat.routing import Models
from compat.wire.embeddings import parse_embeddings_request, render_embeddings_response, with_text_prompt
from compat.wire.inputs import MediaRef, Prompt, has_media, lazy_json_object, parse_model_field
from engine import text_formatter
from engine.types import Pooling, Timings

if TYPE_CHECKING:
    from compat.settings import Settings

POOLING_NONE_OAI = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"


class EmbeddingsResource:
    def __init__(self, models: Models, *, oai: bool):
        self._models = models
        self._oai = oai

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = lazy_json_object(req.bounded_stream.read)
        with self._models.lease(EMBEDDING, lambda: parse_model_field(body())) as served:
            engine, settings = served.engine, served.settings
            # single model: llama checks this before reading the body, so it wins over bad JSON and `content`
            if self._oai and engine.info.pooling is Pooling.NONE:
                raise bad_request(POOLING_NONE_OAI)
            request = parse_embeddings_request(body(), oai_route=self._oai, default_normalize=settings.embd_normalize,
                                               width=engine.info.n_embd, takes_images=engine.info.takes_images)
            format_text = text_formatter(engine.info, request.prompt_name, request.instruction)
            policy = _checked_media(request.prompts, settings)
            # tokenize here, on the request thread, so the engine thread only runs forward passes
            started = time.perf_counter()
            token_lists = [image_input(i, prompt, policy) if has_media(prompt)
                           else engine.encode_prompt(with_text_prompt(prompt, format_text))
                           for i, prompt in enumerate(request.prompts)]
            tokenize_s = time.perf_counter() - started
            result = engine.embed(token_lists, truncate=request.truncate, timeout_s=served.remaining_s)
            served.record(result)
        req.context.timings = Timings(tokenize_s=tokenize_s + result.timings.tokenize_s,
                                      queue_s=result.timings.queue_s, inference_s=result.timings.inference_s)
        resp.media = render_embeddings_response(request, result, served.name)


def _checked_media(prompts: list[Prompt], settings: Settings) -> MediaPolicy:
    """Refuse too many images before fetching any; the rules to fetch them by."""
    n_images = sum(isinstance(part, MediaRef) for prompt in prompts for part in prompt)
    if n_images > settings.image_max_count:
        raise bad_request(f"the request has {n_images} images; at most {settings.image_max_count} are allowed "
                          f"(--image-max-count)")
    return MediaPolicy.create(settings.media_path, settings.allow_remote_media, settings.media_max_bytes,
                              settings.media_timeout)
