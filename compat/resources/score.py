"""POST /score and /v1/score (vLLM's score API) on rerankers: parse -> engine -> render."""
from __future__ import annotations

import time
import uuid

import falcon

from compat.catalog import RERANK
from compat.errors import check_client_batch
from compat.resources.leasing import model_request
from compat.routing import Models
from compat.wire.score import parse_score_request, render_score_response
from engine.types import RerankResult


class ScoreResource:
    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, RERANK) as (served, body):
            request = parse_score_request(body())
            check_client_batch(len(request.pairs), served.settings.max_client_batch_size, "pairs")
            served.engine.check_count(len(request.pairs))
            # one engine call per distinct first text (1:N is one call), its pairs batched together
            by_query: dict[str, list[int]] = {}
            for i, (query, _) in enumerate(request.pairs):
                by_query.setdefault(query, []).append(i)
            scores: list[float] = [0.0] * len(request.pairs)
            n_tokens = 0
            for query, indices in by_query.items():
                result: RerankResult = served.engine.rerank(
                    query, [request.pairs[i][1] for i in indices], truncate=request.truncate,
                    timeout_s=served.remaining_s, sigmoid=request.use_activation)
                served.record(result)
                n_tokens += sum(result.n_tokens)
                for i, score in zip(indices, result.scores, strict=True):
                    scores[i] = score
        resp.media = render_score_response(request, scores, n_tokens, served.name,
                                           response_id=f"score-{uuid.uuid4().hex}", created=int(time.time()))
