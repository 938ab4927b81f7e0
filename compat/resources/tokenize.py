"""POST /tokenize and /detokenize (contract §5)."""
from __future__ import annotations

import falcon

from compat.wire.inputs import parse_json_object
from compat.wire.tokenize import (parse_detokenize_request, parse_tokenize_request, render_detokenize_response,
                                  render_tokenize_response)
from engine import Engine


class TokenizeResource:
    def __init__(self, engine: Engine):
        self._engine = engine

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = parse_tokenize_request(parse_json_object(req.bounded_stream.read()))
        ids = self._engine.encode_prompt(request.parts, add_special=request.add_special,
                                         parse_special=request.parse_special)
        pieces = self._engine.token_pieces(ids) if request.with_pieces else None
        resp.media = render_tokenize_response(ids, pieces)


class DetokenizeResource:
    def __init__(self, engine: Engine):
        self._engine = engine

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ids = parse_detokenize_request(parse_json_object(req.bounded_stream.read()))
        resp.media = render_detokenize_response(self._engine.decode(ids))
