"""compat/app_routes.py against falcon.inspect.inspect_routes, on our own apps (single-model and router mode)."""
from __future__ import annotations

import falcon.inspect

from compat import app_routes
from compat.app import create_app
from compat.settings import parse_settings
from tests.compat.fakes import FakeEngine
from tests.compat.test_routing import Server


def _records(routes) -> list[tuple]:
    return [(route.path, route.class_name, [(m.method, m.function_name, m.internal) for m in route.methods])
            for route in routes]


def test_the_listing_is_falcons_without_the_source_lookups(tmp_path):
    settings = parse_settings(["--embedding", "--metrics", "--api-prefix", "/v9"], {}, system_config_files=[])
    for app in (create_app(settings, FakeEngine()), Server(tmp_path).client.app):
        ours, falcons = app_routes.inspect_routes(app), falcon.inspect.inspect_routes(app)
        assert _records(ours) == _records(falcons)
        assert any(m.internal for route in ours for m in route.methods)  # falcon's own responders say so
        assert {route.source_info for route in ours} == {app_routes.UNKNOWN_SOURCE}

