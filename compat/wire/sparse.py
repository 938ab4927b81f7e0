"""TEI's POST /embed_sparse body and answer (router/src/http/types.rs EmbedSparseRequest, server.rs
embed_sparse). Pure: no falcon.

- request: `inputs` (a string, a list of them, token ids, or a list of token-id lists), `truncate` (null: the
  server's --truncate), `truncation_direction` (`Right`/`right`, the default; `Left`/`left`), `prompt_name`; ours:
  `max_active_dims` (keep each vector's largest entries, as sentence-transformers' SparseEncoder.encode does;
  null: the checkpoint's own max_active_dims, else all) and `model` (several models);
- answer: per input, its nonzero entries `[{"index", "value"}]`, indices ascending (TEI's order), a list per input
  even for one string.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compat.wire.inputs import Prompt, whole
from compat.wire.tei import TeiError, _prompt_name, _prompts, _truncation
from engine.types import SparseResult

NOT_SPARSE = ("Model is not an embedding model with SPLADE pooling (sparse vectors need a sentence-transformers "
              "SparseEncoder checkpoint, or a BertForMaskedLM / DistilBertForMaskedLM started with --pooling splade)")
BAD_MAX_ACTIVE_DIMS = '"max_active_dims" must be a positive integer'


@dataclass(frozen=True)
class SparseRequest:
    prompts: list[Prompt]
    truncate: bool | None
    prompt_name: str | None
    truncate_left: bool
    max_active_dims: int | None


def parse_sparse_request(body: dict[str, Any]) -> SparseRequest:
    prompts = _prompts(body.get("inputs"))
    truncate, left = _truncation(body)
    top = whole(body.get("max_active_dims"))
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top <= 0):
        raise TeiError("Validation", BAD_MAX_ACTIVE_DIMS, status=422)
    return SparseRequest(prompts, truncate, _prompt_name(body), left, top)


def render_sparse_response(result: SparseResult) -> list[list[dict[str, Any]]]:
    return [[{"index": index, "value": value}
             for index, value in zip(vector.indices.tolist(), vector.values.tolist())]
            for vector in result.vectors]
