"""What /openapi.json knows of the models it describes (compat/openapi.py and the other servers' declarations,
compat/openapi_tei.py, compat/openapi_others.py, compat/openapi_ollama.py, share it): the served models, what
each accepts once loaded, the names a request may give, and the operations this configuration never serves."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compat.catalog import EMBEDDING, RERANK, Kind
from engine.types import ModelInfo, Pooling

if TYPE_CHECKING:
    from compat.routing import Models
    from compat.settings import Settings

Schema = dict[str, Any]
Refusal = tuple[int, str]  # an operation's one answer where it is never served: (status, why)


@dataclass(frozen=True)
class ServedModel:
    """One model as the document describes it: the names a request may give it (several models; a one-model
    server's `model` is only echoed), its kind, and what it is once loaded (None: not loaded, so unknown)."""

    names: tuple[str, ...]
    kind: Kind
    info: ModelInfo | None


@dataclass(frozen=True)
class Serving:
    """What the server serves as the document is made: one model, or several (router)."""

    router: bool
    models: tuple[ServedModel, ...]

    @classmethod
    def of(cls, models: Models, settings: Settings) -> Serving:
        if models.router_mode:
            return cls(True, tuple(ServedModel(view.spec.names, view.spec.kind, view.status.info)
                                   for view in models.describe()))
        kind = RERANK if settings.pooling is Pooling.RANK else EMBEDDING
        with models.lease(None, lambda: None, count=False) as served:
            info = served.engine.info if served.engine.is_loaded else None
        return cls(False, (ServedModel((), kind, info),))

    def of_kind(self, kind: Kind) -> list[ServedModel]:
        return [model for model in self.models if model.kind == kind]


def known(models: list[ServedModel]) -> list[ModelInfo]:
    return [model.info for model in models if model.info is not None]


def every_known(infos: list[ModelInfo], test: Any) -> bool:
    """Every known model passes `test`; with none known, nothing can be ruled out."""
    return all(test(info) for info in infos)


def token(infos: list[ModelInfo]) -> Schema:
    """A token id: an integer the vocabulary of every model the route may pick holds."""
    schema: Schema = {"type": "integer", "minimum": 0}
    if infos:
        schema["maximum"] = min(info.n_vocab for info in infos) - 1
    return schema


def model_field(serving: Serving, names: list[str] | None, what: str) -> Schema:
    """The body's `model`: anything on a one-model server (echoed when a string); with several models, one of
    the names that route may pick (null or "": the route's default model)."""
    if not serving.router:
        return {"description": "only echoed in the answer (when a string): this server serves one model"}
    listed = sorted(set(names or ()))
    return {"enum": [None, "", *listed], "description": f"{what} by id or alias; absent, null or \"\": the "
                                                          f"route's default (the first configured)"}


def names(models: list[ServedModel]) -> list[str]:
    return [name for model in models for name in model.names]


def refusals(settings: Settings, serving: Serving) -> tuple[Refusal | None, Refusal | None, Refusal | None,
                                                             Refusal | None]:
    """What this configuration never serves, in llama's statuses: (embeddings, rerank, maxsim, OAI shape)."""
    embedders, rerankers = serving.of_kind(EMBEDDING), serving.of_kind(RERANK)
    router = serving.router
    no_embeddings = no_rerank = no_maxsim = no_oai = None
    if router:
        if not embedders:
            no_embeddings = no_maxsim = (501, "no embedding model is configured")
        if not rerankers:
            no_rerank = (501, "no reranking model is configured")
        infos = known(embedders)
        if embedders and len(infos) == len(embedders) and not any(info.multi_vector for info in infos):
            no_maxsim = (400, "MaxSim needs a multi-vector model: none is configured")
    else:
        info = serving.models[0].info
        if not settings.embedding:
            no_embeddings = no_maxsim = (501, "not served: start the server with --embedding")
        elif serving.models[0].kind == RERANK:
            no_embeddings = no_maxsim = (400, "this server runs a reranker: it serves /rerank, not embeddings")
        elif info is not None and not info.multi_vector:
            no_maxsim = (400, "MaxSim needs a multi-vector (late-interaction) model; this one is not")
        if info is not None and info.pooling is Pooling.NONE and not info.multi_vector:
            no_oai = (400, "pooling none is not OAI compatible")
        if not (settings.embedding and settings.pooling is Pooling.RANK):
            no_rerank = (501, "not served: start the server with --reranking")
    return no_embeddings, no_rerank, no_maxsim, no_oai
