"""create_app(settings, engine): the falcon app a client talks to, wired like llama-server (single model), or
like its router mode when given a ModelRouter (several models)."""
from __future__ import annotations

import time
from functools import partial
from importlib import metadata
from typing import TYPE_CHECKING

import falcon
import orjson

from compat.errors import (
    JSON_CONTENT_TYPE,
    ApiError,
    handle_api_error,
    handle_engine_error,
    handle_http_error,
    handle_unexpected,
)
from compat.lifecycle import Lifecycle, LifecycleMiddleware
from compat.middleware import (
    ApiKeyMiddleware,
    ApiPrefixMiddleware,
    CorsMiddleware,
    LoadingMiddleware,
    PayloadLimitMiddleware,
    TimingMiddleware,
)
from compat.openapi import OpenApiResource, openapi_document
from compat.resources.cohere_embed import CohereEmbedResource
from compat.resources.embeddings import EmbeddingsResource
from compat.resources.info import HealthResource, MetricsResource, SlotsResource
from compat.resources.maxsim import MaxSimResource
from compat.resources.model_management import ModelActionResource, ModelsResource, PropsResource
from compat.resources.ollama import ollama_routes
from compat.resources.rerank import RerankResource
from compat.resources.tei import tei_routes
from compat.resources.score import ScoreResource
from compat.resources.classify import classify_routes
from compat.resources.tokenize import DetokenizeResource, TokenizeResource
from compat.resources.unsupported import UnsupportedRouteResource, not_served_message
from compat.routing import ModelRouter, Models, SingleModel
from engine import Engine
from engine.errors import EngineError

if TYPE_CHECKING:
    from compat.settings import Settings


def _version() -> str:
    try:
        return metadata.version("mlx-embed-server")
    except metadata.PackageNotFoundError:  # running from a source checkout
        return "dev"


def _json_handler() -> falcon.media.JSONHandler:
    # compact, insertion-ordered, raw UTF-8; numpy vectors serialized natively (NaN/Inf -> null)
    return falcon.media.JSONHandler(dumps=partial(orjson.dumps, option=orjson.OPT_SERIALIZE_NUMPY),
                                    loads=orjson.loads)


def create_app(settings: Settings, engine: Engine | ModelRouter, lifecycle: Lifecycle | None = None) -> falcon.App:
    """`engine`: the one model's Engine, or the ModelRouter of a several-model server. `lifecycle`: the
    in-flight count and drain state the listener shares (a fresh one if not given)."""
    router = engine if isinstance(engine, ModelRouter) else None
    models: Models = router or SingleModel(engine, settings)
    lifecycle = lifecycle or Lifecycle()
    app = falcon.App(
        media_type=JSON_CONTENT_TYPE,
        middleware=[
            LifecycleMiddleware(lifecycle, settings),  # counts every request; 503 to newcomers while draining
            TimingMiddleware(),  # x-total-time covers the rest of the chain
            CorsMiddleware(settings),  # CORS headers, then OPTIONS preflight
            # one model: 503 until it is loaded; several: each request waits for its own model's load
            *([] if router else [LoadingMiddleware(engine)]),
            ApiKeyMiddleware(settings),
            PayloadLimitMiddleware(settings),  # the listener enforces it too, chunked bodies included
            ApiPrefixMiddleware(settings),
        ],
    )
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = _json_handler()

    # falcon picks the most specific handler by MRO, whatever the registration order
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_http_error)
    app.add_error_handler(EngineError, handle_engine_error)
    app.add_error_handler(ApiError, handle_api_error)

    health = HealthResource()
    embeddings = EmbeddingsResource(models, oai=False)
    rerank = RerankResource(models, cohere_v2=False)
    maxsim = MaxSimResource(models)
    listing = ModelsResource(models)
    routes = {
        "/health": health,
        "/v1/health": health,
        "/props": PropsResource(models, settings, _version()),
        "/models": listing,
        "/v1/models": listing,
        "/slots": SlotsResource(models, settings),
        "/metrics": MetricsResource(models, settings, started_unix=int(time.time()), lifecycle=lifecycle),
        "/embedding": embeddings,  # legacy name
        "/embeddings": embeddings,
        "/v1/embeddings": EmbeddingsResource(models, oai=True),
        "/tokenize": TokenizeResource(models),
        "/detokenize": DetokenizeResource(models),
        **{path: rerank for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")},
        "/v2/rerank": RerankResource(models, cohere_v2=True),  # Cohere v2 clients
        "/v1/embed": CohereEmbedResource(models, version=1),  # Cohere embed (docs/routes.md)
        "/v2/embed": CohereEmbedResource(models, version=2),
        **dict.fromkeys(("/score", "/v1/score"), ScoreResource(models)),  # vLLM's score API
        **classify_routes(models),  # TEI's /predict, vLLM's /classify: sequence classifiers (docs/routes.md)
        # ours: late-interaction scoring for multi-vector models (docs/routes.md, "Multi-vector output and MaxSim")
        **{path: maxsim for path in ("/maxsim", "/v1/maxsim")},
        **ollama_routes(models, settings),  # Ollama's /api/embed, /api/embeddings, /api/tags, ... (docs/routes.md)
        **tei_routes(models, _version()),  # Text Embeddings Inference's native routes (docs/routes.md)
        # generation routes exist in llama-server; here they say why they are missing instead of 404
        **{path: UnsupportedRouteResource(not_served_message(path))
           for path in ("/completion", "/completions", "/v1/completions", "/chat/completions",
                        "/v1/chat/completions", "/infill", "/v1/responses", "/v1/messages", "/apply-template")},
    }
    if router is not None:  # llama's router-mode model management
        routes.update({"/models/load": ModelActionResource(router.load),
                       "/models/unload": ModelActionResource(router.unload)})
    openapi = OpenApiResource(models, settings, _version())
    routes["/openapi.json"] = openapi
    for path, resource in routes.items():
        app.add_route(path, resource)
    openapi_document(app, settings, _version())  # every route declared, or this raises
    openapi.app = app
    return app
