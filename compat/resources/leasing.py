"""How a route that needs a model reaches it: the body is read once, its `model` picks the engine, the engine
is leased for the whole request, and the engine's timings end up in the timing headers."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import falcon

from compat.catalog import Kind
from compat.errors import check_client_batch
from compat.routing import Models, Served
from compat.wire.inputs import lazy_json_object, parse_model_field

Body = Callable[[], dict[str, Any]]  # the request body as a JSON object, parsed on the first call


@contextmanager
def model_request(req: falcon.Request, models: Models, kind: Kind | None, *,
                  count: bool = True) -> Iterator[tuple[Served, Body]]:
    """(served, body) inside the lease. The body is parsed lazily: a single-model server never needs its `model`,
    and some checks (llama's order) come before the body is parsed at all."""
    body = lazy_json_object(req.bounded_stream.read)
    with models.lease(kind, lambda: parse_model_field(body()), count=count) as served:
        yield served, body
    if served.timings is not None:
        req.context.timings = served.timings


def check_count(served: Served, n_items: int, what: str, *, n_more: int = 0) -> None:
    """--max-client-batch-size on a request's `n_items` inputs or documents (`what`), then the engine queue's bound
    on them and `n_more` other inputs (MaxSim's query): both 413, checked on the raw list before any item is
    parsed, tokenized or fetched."""
    check_client_batch(n_items, served.settings.max_client_batch_size, what)
    served.engine.check_count(n_items + n_more)
