"""Routes llama-server has that this server answers with 501 not_supported_error."""
from __future__ import annotations

import falcon

from compat.errors import not_supported


def not_served_message(route: str) -> str:
    return f"This server serves embeddings and reranking only; {route} is not available"


class UnsupportedRouteResource:
    def __init__(self, message: str):
        self._message = message

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        raise not_supported(self._message)
