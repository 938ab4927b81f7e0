"""TEI's POST /embed_sparse (compat/wire/sparse.py has the body): a sparse (SPLADE) encoder's vectors through
the same lease, batching, limits and /metrics as every embedding route; errors in TEI's body."""
from __future__ import annotations

import falcon

from compat.catalog import EMBEDDING
from compat.errors import ApiError, check_client_batch
from compat.resources.leasing import model_request
from compat.routing import Models, Served
from compat.wire.sparse import NOT_SPARSE, parse_sparse_request, render_sparse_response
from compat.wire.tei import TeiError, tei_error
from engine.errors import EngineError


def embed_sparse(served: Served, body: dict) -> list:
    """One /embed_sparse body on a leased model (POST / sends a sparse model's requests here too)."""
    if not served.engine.info.is_sparse:
        raise TeiError("Backend", NOT_SPARSE)
    request = parse_sparse_request(body)
    check_client_batch(len(request.prompts), served.settings.max_client_batch_size, "inputs")
    engine = served.engine
    engine.check_count(len(request.prompts))
    prompts = engine.format_prompts(request.prompts, request.prompt_name, None, request.truncate)
    result = engine.embed_sparse(prompts, truncate=request.truncate, timeout_s=served.remaining_s,
                                 truncation_direction="left" if request.truncate_left else "right",
                                 max_active_dims=request.max_active_dims)
    served.record(result)
    return render_sparse_response(result)


class TeiSparseResource:
    """POST /embed_sparse."""

    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        try:
            with model_request(req, self._models, EMBEDDING) as (served, body):
                answer = embed_sparse(served, body())
        except (ApiError, EngineError) as exc:  # TEI's body, as compat/resources/tei.py answers
            raise tei_error(exc) from None
        resp.media = answer
