"""POST /maxsim and /v1/maxsim: a multi-vector (late-interaction) model scores documents for a query by MaxSim.

The body and the answer are the rerank routes' (compat/wire/rerank.py): `query`, `documents` (texts, or images
in any of the rerank routes' forms), `top_n`, `return_documents`, `truncate`; results sorted by score, `usage`
counting every input's tokens, image tokens included (the query's too). A score is the sum over the query's
token vectors of the best dot product with any of the document's (engine/compute/maxsim.py), raw, not averaged. The
query and the documents go through the engine as one embedding request (same batching, limits and /metrics);
a model that is not multi-vector answers 400.
"""
from __future__ import annotations

import uuid

import falcon

from compat.catalog import EMBEDDING
from compat.errors import bad_request
from compat.resources.leasing import check_count, model_request
from compat.resources.rerank import fetch_query_documents
from compat.routing import Models
from compat.wire.inputs import Prompt
from compat.wire.rerank import Item, count_documents, parse_rerank_request, render_rerank_response


class MaxSimResource:
    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, EMBEDDING) as (served, body):
            info = served.engine.info
            check_count(served, count_documents(body()), "documents", n_more=1)  # the query is an input too
            request = parse_rerank_request(body(), cohere_v2=False, takes_images=info.takes_images)
            if request.instruction is not None:
                raise bad_request('"instruction" is not used by MaxSim: the model builds its own query and document '
                                  'prompts')
            prompts = [_prompt(item) for item in (request.query, *request.items)]
            inputs = fetch_query_documents(prompts, served.settings)
            result = served.engine.maxsim(inputs[0], inputs[1:], truncate=request.truncate,
                                          timeout_s=served.remaining_s)
            served.record(result)
        resp.media = render_rerank_response(request, result, served.name, response_id=str(uuid.uuid4()))


def _prompt(item: Item) -> Prompt:
    return [item] if isinstance(item, str) else item
