"""The routes a falcon app serves, as `falcon.inspect.inspect_routes` lists them, without looking up each
responder's source file and line (which falcon.inspect does by parsing every resource module with `ast`: 1.2 s
a listing for our route table, run when the app is made to check every route has its OpenAPI declaration, and
again for every GET /openapi.json)."""
from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import falcon
import falcon.inspect
from falcon.inspect import RouteInfo, RouteMethodInfo
from falcon.routing import CompiledRouter

UNKNOWN_SOURCE = "[not looked up]"  # the source_info of every entry


def inspect_routes(app: falcon.App) -> list[RouteInfo]:
    """Every route of `app` in falcon.inspect's order and records (path, class name, methods with their
    function names and whether falcon added them), source_info left out; a router that is not falcon's
    CompiledRouter: falcon.inspect's own listing (it knows no other router type)."""
    router = app._router  # falcon.inspect reads the same attribute
    if not isinstance(router, CompiledRouter):
        return falcon.inspect.inspect_routes(app)
    found: list[RouteInfo] = []

    def walk(nodes: list[Any], parent: str) -> None:
        for node in nodes:
            path = parent + "/" + node.raw_segment
            if node.resource is not None:
                methods = []
                for method, func in (node.method_map or {}).items():
                    real = func.func if isinstance(func, partial) else func
                    methods.append(RouteMethodInfo(method, UNKNOWN_SOURCE, real.__name__, _internal(real)))
                name = getattr(node.resource, "__name__", None) or type(node.resource).__name__
                found.append(RouteInfo(path, name, UNKNOWN_SOURCE, methods))
            if node.children:
                walk(node.children, path)

    walk(router._roots, "")
    return found


def _internal(func: Any) -> bool:
    """falcon.inspect's test: a responder defined in a falcon module (its default OPTIONS, 405 responders)."""
    module = inspect.getmodule(func)
    return module is not None and module.__name__.startswith("falcon.")
