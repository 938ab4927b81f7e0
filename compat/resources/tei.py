"""Text Embeddings Inference's native routes: POST /embed, /embed_all, /similarity, POST / and GET /info
(/predict: compat/resources/classify.py)
(compat/wire/tei.py has the bodies). Every one leases the engine as the llama routes do (same batching, limits,
/metrics); its errors leave in TEI's body and statuses."""
from __future__ import annotations

import falcon

from compat.catalog import EMBEDDING
from compat.errors import check_client_batch, not_supported
from compat.listener import http_threads
from compat.resources.classify import tei_predict
from compat.resources.embeddings import embed_request_prompts
from compat.resources.leasing import model_request
from compat.resources.sparse import TeiSparseResource, embed_sparse
from compat.routing import EMBEDDINGS_DISABLED, Models, Served
from compat.wire.tei import (
    TeiError,
    check_embed_all,
    check_similarity,
    is_similarity,
    parse_decode_request,
    parse_embed_request,
    parse_similarity_request,
    parse_tokenize_request,
    render_embed_response,
    render_info_response,
    render_similarity_response,
    render_tokenize_response,
    tei_errors,
)

RERANKER_ROOT = ("this model is a reranker: POST /rerank with {\"query\", \"texts\"}, or /predict with "
                 "{\"inputs\": [query, text]} for one pair's score")


def _check_batch(served: Served, n_inputs: int) -> None:
    check_client_batch(n_inputs, served.settings.max_client_batch_size, "inputs")


def _embed(served: Served, body: dict, *, per_token: bool) -> list:
    info = served.engine.info
    if per_token:
        check_embed_all(info)
    request = parse_embed_request(body, width=info.n_embd, per_token=per_token)
    _check_batch(served, len(request.prompts))
    result = embed_request_prompts(served, request.prompts, request.truncate, request.prompt_name, None,
                                   request.embd_normalize, request.dimensions,
                                   "left" if request.truncate_left else "right", request.late_chunking, request.task)
    served.record(result)
    return render_embed_response(result)


def _similarity(served: Served, body: dict) -> list[float]:
    check_similarity(served.engine.info)
    request = parse_similarity_request(body)
    _check_batch(served, len(request.sentences) + 1)
    result = embed_request_prompts(served, [[request.source], *([s] for s in request.sentences)],
                                   request.truncate, request.prompt_name, None, -1, None,
                                   "left" if request.truncate_left else "right", task=request.task)
    served.record(result)
    return render_similarity_response(result)


class TeiEmbedResource:
    """POST /embed, or (per_token) POST /embed_all."""

    def __init__(self, models: Models, *, per_token: bool = False):
        self._models = models
        self._per_token = per_token

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with tei_errors(), model_request(req, self._models, EMBEDDING) as (served, body):
            answer = _embed(served, body(), per_token=self._per_token)
        resp.media = answer


class TeiSimilarityResource:
    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with tei_errors(), model_request(req, self._models, EMBEDDING) as (served, body):
            answer = _similarity(served, body())
        resp.media = answer


class TeiRootResource:
    """POST /: TEI routes by the model's type; an embedder answers `inputs` as /embed (a sparse one as
    /embed_sparse), or as /similarity when `inputs` is {source_sentence, sentences} (huggingface_hub's
    InferenceClient posts both here)."""

    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with tei_errors(), model_request(req, self._models, None) as (served, body):
            if served.engine.info.is_classifier:  # TEI routes a classifier's POST / to /predict
                resp.media = tei_predict(served, body())
                return
            if served.engine.info.is_reranker:
                raise TeiError("Backend", RERANKER_ROOT)
            if not served.settings.embedding:  # as /embed: embeddings need --embedding
                raise not_supported(EMBEDDINGS_DISABLED)
            request = body()
            if is_similarity(request):
                answer = _similarity(served, request)
            elif served.engine.info.is_sparse:  # TEI routes a splade model's POST / to /embed_sparse
                answer = embed_sparse(served, request)
            else:
                answer = _embed(served, request, per_token=False)
        resp.media = answer


class TeiInfoResource:
    """GET /info: TEI's Info for the model (several models: ?model= picks one, else the first)."""

    def __init__(self, models: Models, version: str):
        self._models = models
        self._version = version

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        with tei_errors(), self._models.lease(None, lambda: req.get_param("model") or None, count=False) as served:
            settings = served.settings
            threads = http_threads(settings)
            resp.media = render_info_response(
                served.engine.info, model_id=served.name, version=self._version,
                max_concurrent_requests=settings.connection_limit, max_client_batch_size=settings.max_client_batch_size,
                auto_truncate=settings.truncate, tokenization_workers=threads)

    on_head = on_get


def tei_tokenize(served: Served, body: dict) -> list:
    """TEI's /tokenize body (the llama route hands it here when the body has `inputs`)."""
    with tei_errors():
        request = parse_tokenize_request(body)
        engine = served.engine
        if request.prompt_name is not None or engine.info.default_prompt_name is not None:
            prompted = engine.format_prompts([[text] for text in request.texts], request.prompt_name)
            if not all(len(p) == 1 and isinstance(p[0], str) for p in prompted):
                raise TeiError("Validation", "prompt_name: this model's texts go through its chat template, "
                                             "which /tokenize does not render", status=422)
            texts = [p[0] for p in prompted]
        else:
            texts = request.texts
        return render_tokenize_response([engine.token_spans(text, request.add_special) for text in texts])


class TeiDecodeResource:
    """POST /decode: token ids back to text, one string per list."""

    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with tei_errors(), model_request(req, self._models, None, count=False) as (served, body):
            request = parse_decode_request(body())
            answer = [served.engine.decode(ids, request.skip_special) for ids in request.ids]
        resp.media = answer


def tei_routes(models: Models, version: str) -> dict[str, object]:
    """TEI's native routes for the app's route table (its /rerank is the llama route's `texts` shape)."""
    return {"/": TeiRootResource(models), "/embed": TeiEmbedResource(models),
            "/embed_all": TeiEmbedResource(models, per_token=True), "/similarity": TeiSimilarityResource(models),
            "/embed_sparse": TeiSparseResource(models),
            "/decode": TeiDecodeResource(models),
            "/info": TeiInfoResource(models, version)}
