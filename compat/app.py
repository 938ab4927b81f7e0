"""create_app(settings, engine): the falcon app a client talks to, wired like llama-server."""
from __future__ import annotations

import time
from functools import partial
from importlib import metadata
from typing import TYPE_CHECKING

import falcon
import orjson

from compat.errors import (JSON_CONTENT_TYPE, ApiError, handle_api_error, handle_engine_error, handle_http_error,
                           handle_unexpected)
from compat.middleware import (ApiKeyMiddleware, ApiPrefixMiddleware, CorsMiddleware, LoadingMiddleware,
                               TimingMiddleware)
from compat.resources.embeddings import EmbeddingsResource
from compat.resources.info import (HealthResource, MetricsResource, ModelsResource, PropsResource,
                                   SlotsResource)
from compat.resources.rerank import RerankResource
from compat.resources.tokenize import DetokenizeResource, TokenizeResource
from compat.resources.unsupported import RERANK_DISABLED, UnsupportedRouteResource, not_served_message
from engine import Engine
from engine.errors import EngineError
from engine.types import Pooling

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


def create_app(settings: Settings, engine: Engine) -> falcon.App:
    app = falcon.App(
        media_type=JSON_CONTENT_TYPE,
        middleware=[
            TimingMiddleware(),  # first in, last out: x-total-time covers the whole chain
            CorsMiddleware(settings),  # CORS headers, then OPTIONS preflight
            LoadingMiddleware(engine),
            ApiKeyMiddleware(settings),
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
    # the engine refuses to load an embedder in rank mode and a reranker outside it, so this names the model
    models = ModelsResource(engine, settings,
                            capabilities=["rerank"] if settings.pooling is Pooling.RANK else ["embedding"])
    # llama serves rerank only with --embedding AND a CLI pooling of rank (§4.1); --reranking sets both
    rank_mode = settings.embedding and settings.pooling is Pooling.RANK
    rerank_disabled = UnsupportedRouteResource(RERANK_DISABLED)
    rerank = RerankResource(engine, settings, cohere_v2=False) if rank_mode else rerank_disabled
    rerank_v2 = RerankResource(engine, settings, cohere_v2=True) if rank_mode else rerank_disabled
    embeddings = EmbeddingsResource(engine, settings, oai=False)
    routes = {
        "/health": health,
        "/v1/health": health,
        "/props": PropsResource(engine, settings, _version()),
        "/models": models,
        "/v1/models": models,
        "/slots": SlotsResource(engine, settings),
        "/metrics": MetricsResource(engine, settings, started_unix=int(time.time())),
        "/embedding": embeddings,  # legacy name
        "/embeddings": embeddings,
        "/v1/embeddings": EmbeddingsResource(engine, settings, oai=True),
        "/tokenize": TokenizeResource(engine),
        "/detokenize": DetokenizeResource(engine),
        **{path: rerank for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")},
        "/v2/rerank": rerank_v2,  # Cohere v2 clients
        # generation routes exist in llama-server; here they say why they are missing instead of 404
        **{path: UnsupportedRouteResource(not_served_message(path))
           for path in ("/completion", "/completions", "/v1/completions", "/chat/completions",
                        "/v1/chat/completions", "/infill", "/v1/responses", "/v1/messages", "/apply-template")},
    }
    for path, resource in routes.items():
        app.add_route(path, resource)
    return app
