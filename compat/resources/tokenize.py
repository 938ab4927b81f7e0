"""POST /tokenize and /detokenize (docs/llama-server-contract.md §5; a /tokenize body with TEI's `inputs` gets
TEI's answer, compat/resources/tei.py); on a several-model server `model` picks the tokenizer."""
from __future__ import annotations

import falcon

from compat.resources.leasing import model_request
from compat.resources.tei import tei_tokenize
from compat.routing import Models
from compat.wire.tei import is_tei_tokenize
from compat.wire.tokenize import (
    parse_detokenize_request,
    parse_tokenize_request,
    render_detokenize_response,
    render_tokenize_response,
)


class TokenizeResource:
    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, None, count=False) as (served, body):
            if is_tei_tokenize(body()):  # TEI's body: TEI's answer
                resp.media = tei_tokenize(served, body())
                return
            request = parse_tokenize_request(body())
            ids = served.engine.encode_prompt(request.parts, add_special=request.add_special,
                                              parse_special=request.parse_special)
            pieces = served.engine.token_pieces(ids) if request.with_pieces else None
        resp.media = render_tokenize_response(ids, pieces)


class DetokenizeResource:
    def __init__(self, models: Models):
        self._models = models

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        with model_request(req, self._models, None, count=False) as (served, body):
            text = served.engine.decode(parse_detokenize_request(body()))
        resp.media = render_detokenize_response(text)
