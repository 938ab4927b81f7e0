"""The routes about the served models rather than inference: GET /models and /v1/models, GET and POST /props,
and (router mode only) POST /models/load and /models/unload. One model: llama's single-model answers
(compat/wire/info.py); several: its router-mode ones (compat/wire/router.py)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import falcon

from compat.errors import bad_request, not_supported
from compat.routing import Models
from compat.settings import SettingsError
from compat.wire.info import render_models_response, render_props_response
from compat.wire.inputs import parse_json_object
from compat.wire.router import parse_model_request, render_router_models_response, render_router_props_response

if TYPE_CHECKING:
    from compat.settings import Settings

PROPS_DISABLED = "This server does not support changing global properties. Start it with `--props`"
NO_DOWNLOADS = ("POST /models downloads a model in llama-server; here, add the model to the preset and reload "
                "with POST /models?reload=1")


class ModelsResource:
    """GET /models and /v1/models; several models: `?reload=1` (on GET as llama's router has it, or on POST)
    re-reads the configuration first, and a configuration that does not read is 400 with the previous one still
    served. One model: GET ignores ?reload, as a one-model llama-server does; POST is 501."""

    def __init__(self, models: Models):
        self._models = models

    def _reload(self) -> None:
        try:
            self._models.reload()  # one model: 501, there is nothing to reload
        except SettingsError as exc:
            raise bad_request(f"the configuration was not reloaded: {exc}") from None

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self._models.router_mode and req.get_param("reload"):
            self._reload()
        self._list(resp)

    on_head = on_get

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not req.get_param("reload"):
            raise not_supported(NO_DOWNLOADS)
        self._reload()
        self._list(resp)

    def _list(self, resp: falcon.Response) -> None:
        created = int(time.time())
        if self._models.router_mode:
            resp.media = render_router_models_response(self._models.describe(), created=created)
            return
        with self._models.lease(None, lambda: None, count=False) as served:
            resp.media = render_models_response(served.settings, served.engine.info, created=created)


class PropsResource:
    """GET /props: the model's properties. Router mode: llama's router answer, or with ?model= that model's own
    /props (loading it if need be); one model: ?model= is ignored, as in llama-server."""

    def __init__(self, models: Models, settings: Settings, version: str):
        self._models = models
        self._settings = settings
        self._version = version

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        name = req.get_param("model")
        if self._models.router_mode and not name:
            resp.media = render_router_props_response(self._settings, self._version)
            return
        with self._models.lease(None, lambda: name, count=False) as served:
            resp.media = render_props_response(served.settings, served.engine.info, self._version,
                                               model_name=served.name)

    on_head = on_get

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._settings.props:
            raise not_supported(PROPS_DISABLED)
        resp.media = {"success": True}  # nothing is changeable; llama's POST /props is a no-op too


class ModelActionResource:
    """POST /models/load or /models/unload with {"model": "<id or alias>"}: {"success": true}."""

    def __init__(self, action: Callable[[str], None]):
        self._action = action

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._action(parse_model_request(parse_json_object(req.bounded_stream.read())))
        resp.media = {"success": True}
