"""The several-model server's own routes (llama-server's router mode): the model list with ?reload=1, /props
without ?model, and POST /models/load and /models/unload."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import falcon

from compat.errors import bad_request, not_supported
from compat.resources.info import PROPS_DISABLED
from compat.routing import ModelRouter
from compat.settings import SettingsError
from compat.wire.info import render_props_response
from compat.wire.inputs import parse_json_object
from compat.wire.models import (
    parse_model_request,
    render_router_models_response,
    render_router_props_response,
)

if TYPE_CHECKING:
    from compat.settings import Settings

NO_DOWNLOADS = ("POST /models downloads a model in llama-server; here, add the model to the preset and reload "
                "with POST /models?reload=1")


class RouterModelsResource:
    """GET /models and /v1/models; `?reload=1` (on GET as llama has it, or on POST) re-reads the configuration
    first, and a configuration that does not read is 400 with the previous one still served."""

    def __init__(self, router: ModelRouter):
        self._router = router

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.get_param("reload"):
            self._reload()
        resp.media = render_router_models_response(self._router.describe(), created=int(time.time()))

    on_head = on_get

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not req.get_param("reload"):
            raise not_supported(NO_DOWNLOADS)
        self.on_get(req, resp)

    def _reload(self) -> None:
        try:
            self._router.reload()
        except SettingsError as exc:
            raise bad_request(f"the configuration was not reloaded: {exc}") from None


class ModelActionResource:
    """POST /models/load or /models/unload with {"model": "<id or alias>"}: {"success": true}."""

    def __init__(self, action: Callable[[str], None]):
        self._action = action

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._action(parse_model_request(parse_json_object(req.bounded_stream.read())))
        resp.media = {"success": True}


class RouterPropsResource:
    """GET /props: llama's router answer; with ?model= that model's own /props (loading it if need be)."""

    def __init__(self, router: ModelRouter, settings: Settings, version: str):
        self._router = router
        self._settings = settings
        self._version = version

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        name = req.get_param("model")
        if not name:
            resp.media = render_router_props_response(self._settings, self._version)
            return
        with self._router.lease(None, lambda: name, count=False) as served:
            resp.media = render_props_response(served.settings, served.engine.info, self._version,
                                               model_name=served.name)

    on_head = on_get

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self._settings.props:
            raise not_supported(PROPS_DISABLED)
        resp.media = {"success": True}  # a no-op, as llama's
