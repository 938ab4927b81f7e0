"""POST /embedding, /embeddings (llama's shape) and /v1/embeddings (OAI shape): parse -> engine -> render."""
from __future__ import annotations

import falcon

from compat import stages
from compat.catalog import EMBEDDING
from compat.errors import bad_request
from compat.media import with_images
from compat.resources.leasing import check_count, model_request
from compat.routing import Models, Served
from compat.wire.embeddings import parse_embeddings_request, render_embeddings_response
from compat.wire.inputs import Prompt, chunk_texts, count_prompts, has_media
from engine.types import EmbedResult, ImageInput, Pooling

POOLING_NONE_OAI = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"


class EmbeddingsResource:
    def __init__(self, models: Models, *, oai: bool):
        self._models = models
        self._oai = oai

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, EMBEDDING) as (served, body):
            # single model: llama checks this before reading the body, so it wins over bad JSON and `content`
            info = served.engine.info
            # a multi-vector model's rows are its OAI answer (one list of rows per input)
            if self._oai and info.pooling is Pooling.NONE and not info.multi_vector:
                raise bad_request(POOLING_NONE_OAI)
            raw = body()
            stages.stamp(req, "parsed")
            check_count(served, count_prompts(raw["input"] if "input" in raw else raw.get("content")), "inputs")
            request = parse_embeddings_request(raw, oai_route=self._oai,
                                               default_normalize=served.settings.embd_normalize,
                                               width=info.n_embd, takes_images=info.takes_images,
                                               multi_vector=info.multi_vector)
            stages.stamp(req, "engine_in")
            result = embed_request_prompts(served, request.prompts, request.truncate, request.prompt_name,
                                           request.instruction, request.embd_normalize, request.dimensions,
                                           request.truncation_direction, request.late_chunking, request.task)
            stages.stamp(req, "engine_out")
            served.record(result)
        resp.media = render_embeddings_response(request, result, served.name)
        stages.stamp(req, "rendered")


def embed_request_prompts(served: Served, prompts: list[Prompt], truncate: bool | None, prompt_name: str | None,
                          instruction: str | None, embd_normalize: int, dimensions: int | None,
                          truncation_direction: str = "right", late_chunking: bool = False,
                          task: str | None = None) -> EmbedResult:
    """A request's prompts through the engine: images fetched here (the engine decodes them, and tokenizes the
    texts, off its thread); prompt_name / instruction applied as the model's family does; the vectors come back
    finished by the engine (dimensions, then embd_normalize); truncation_direction "left": cut inputs lose
    their start (TEI's Left). late_chunking: the prompts are texts, consecutive chunks of one document, one vector
    each (Engine.embed_late_chunks). task: the task adapter (None: prompt_name's task, else the model's default),
    whose instruction the texts get when neither prompt_name nor instruction is given."""
    engine = served.engine
    if late_chunking:
        return engine.embed_late_chunks(chunk_texts(prompts), truncate=truncate, timeout_s=served.remaining_s,
                                        prompt_name=prompt_name, instruction=instruction,
                                        embd_normalize=embd_normalize, dimensions=dimensions,
                                        truncation_direction=truncation_direction, task=task)
    engine.check_count(len(prompts))  # before any image is fetched
    labels = [f"input {i}" for i in range(len(prompts))]
    if engine.info.vision_language or engine.info.query_document_roles:  # the family formats its inputs
        return engine.embed_prompts(with_images(labels, prompts, served.settings), truncate=truncate,
                                    timeout_s=served.remaining_s, prompt_name=prompt_name, instruction=instruction,
                                    embd_normalize=embd_normalize, dimensions=dimensions,
                                    truncation_direction=truncation_direction, task=task)
    texts = iter(engine.format_prompts([p for p in prompts if not has_media(p)], prompt_name, instruction, truncate,
                                       task=task))
    inputs = with_images(labels, prompts, served.settings)
    return engine.embed_prompts([item if isinstance(item, ImageInput) else next(texts) for item in inputs],
                                truncate=truncate, timeout_s=served.remaining_s, embd_normalize=embd_normalize,
                                dimensions=dimensions, truncation_direction=truncation_direction,
                                prompt_name=prompt_name, task=task)
