from __future__ import annotations

from collections.abc import Callable

import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.settings import parse_settings
from tests.compat.fakes import FakeEngine


@pytest.fixture
def make_client() -> Callable[..., TestClient]:
    """make_client(*argv, engine=None): a TestClient over create_app with llama-style CLI arguments."""

    def make(*argv: str, engine: FakeEngine | None = None) -> TestClient:
        settings = parse_settings(list(argv), {}, system_config_files=[])
        return TestClient(create_app(settings, engine if engine is not None else FakeEngine()))

    return make
