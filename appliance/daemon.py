"""applianced: the daemon process.

One asyncio process serves two listeners on the same app: the public HTTP
API and console on ``host:port``, and the admin Unix socket in the data dir
(mode 0660), which is how ``appliancectl`` on the box reaches the daemon
without a token. SIGTERM stops accepting, lets in-flight requests drain for
``drain_timeout_seconds``, stops the engines and flushes the ledger.
With TLS on (the ``tls`` setting) the public listener speaks HTTPS only, and
SIGHUP loads the certificate files again without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Iterator
from typing import Any

import uvicorn

from appliance.allocator import use_jemalloc
from appliance.api.http_protocol import EdgeLimits, edge_protocol
from appliance.api.peer_guard import PeerGuard
from appliance.app import create_app, wrap
from appliance.db import engine as dbmod
from appliance.db.private_files import private_dir
from appliance.errors import ApplianceError, ConfigError
from appliance.heap import freeze_startup_objects, map_large_blocks
from appliance.lockfile import DataDirLock
from appliance.logs import setup_logging
from appliance.monitoring.gauges import register_tls_gauge
from appliance.planner.service import cluster_view
from appliance.sdnotify import notify, watchdog_interval, watchdog_loop
from appliance.settings import Settings, load_settings
from appliance.settings.runtime import RESTART_EXIT_CODE
from appliance.tls.context import TlsContext
from appliance.tls.expiry import CHECK_EVERY_SECONDS, ExpiryWatch
from appliance.tls.hsts import StrictTransport
from appliance.tls.mode import tls_mode
from appliance.tls.redirect import RedirectToHttps

log = logging.getLogger("appliance.daemon")


class _Server(uvicorn.Server):
    """uvicorn server whose signals are handled by the daemon, not by uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def check_data_dir(settings: Settings) -> None:
    """Create the data dir layout, or fail with a message that says why."""
    try:
        for path in (
            settings.data_dir,
            settings.run_dir,
            settings.log_dir,
            *(() if settings.store_read_only else (settings.store_dir,)),
        ):
            path.mkdir(parents=True, exist_ok=True)
        private_dir(settings.data_dir)  # key hashes, stored answers and logs: the daemon's user alone
        probe = settings.data_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"data dir {settings.data_dir} is not writable ({exc.strerror}); set APPLIANCE_DATA_DIR to a writable folder"
        ) from None


def _tls_listener(settings: Settings) -> TlsContext | None:
    """The listener's TLS context with its certificate loaded (made or checked first), or None with TLS off."""
    if tls_mode(settings) == "off":
        return None
    tls = TlsContext(settings)
    cert = tls.load()
    fields = {"fingerprint_sha256": cert.fingerprint, "not_after": cert.not_after.isoformat()}
    log.info("TLS %s", tls_mode(settings), extra={"fields": fields})
    return tls


async def _watch_expiry(watch: ExpiryWatch, tls: TlsContext) -> None:
    while True:
        try:
            await watch.check(tls.current)
        except Exception:  # a locked database or a bad webhook must not end the watch
            log.exception("TLS expiry check failed")
        await asyncio.sleep(CHECK_EVERY_SECONDS)


async def _start_redirect(settings: Settings, limits: EdgeLimits, common: dict[str, Any]) -> tuple[_Server, asyncio.Task]:
    """The plain-HTTP port that only redirects to https (``tls_redirect_port``), listening."""
    config = uvicorn.Config(
        RedirectToHttps(settings.allowed_hosts, settings.port),
        host=settings.host,
        port=settings.tls_redirect_port or 0,
        lifespan="off",
        http=edge_protocol(limits),
        limit_concurrency=settings.max_connections,
        **common,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(), name="redirect-server")
    while not server.started:
        if task.done():
            task.result()
            raise ConfigError(f"could not listen on {settings.host}:{settings.tls_redirect_port} (tls_redirect_port)")
        await asyncio.sleep(0.05)
    return server, task


async def serve(settings: Settings) -> bool:
    tls = _tls_listener(settings)
    app = create_app(settings)
    common: dict[str, Any] = dict(
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=settings.drain_timeout_seconds,
        timeout_keep_alive=30,
        loop="uvloop",
    )
    limits = EdgeLimits(
        header_timeout=settings.header_timeout_seconds,
        body_timeout=settings.body_timeout_seconds,
        max_header_bytes=settings.max_header_bytes,
        max_header_count=settings.max_header_count,
    )
    # X-Forwarded-For is believed only from the configured reverse proxies (uvicorn would trust any local peer).
    edge: dict[str, Any] = dict(
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=settings.trusted_proxies or None,
        limit_concurrency=settings.max_connections,
        http=edge_protocol(limits, PeerGuard(settings.anonymous_connections_per_address, settings.trusted_proxies)),
    )
    public_app: Any = wrap(app, settings)
    if tls is not None and settings.tls_hsts_seconds:
        public_app = StrictTransport(public_app, settings.tls_hsts_seconds)
    public = _Server(
        uvicorn.Config(
            public_app,
            host=settings.host,
            port=settings.port,
            lifespan="on",
            **edge,
            **common,
        )
    )
    if tls is not None:
        # One SSLContext for the listener's life: a reload loads new files into it (see appliance.tls.context).
        public.config.ssl_context_factory = lambda _config, _default: tls.context
    settings.admin_socket.unlink(missing_ok=True)
    admin_app, admin_http = wrap(app, settings, local=True), edge_protocol(limits)
    admin = _Server(uvicorn.Config(admin_app, uds=str(settings.admin_socket), lifespan="off", http=admin_http, **common))

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def request_stop(signum: int) -> None:
        log.info("received %s: draining", signal.Signals(signum).name)
        notify("STOPPING=1")
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signum)
    expiry: asyncio.Task | None = None
    watch: ExpiryWatch | None = None

    def reload_tls() -> None:
        if tls is None:
            log.info("received SIGHUP: TLS is off, nothing to reload")
        elif tls.reload() is not None and watch is not None:
            loop.create_task(watch.check(tls.current))

    loop.add_signal_handler(signal.SIGHUP, reload_tls)

    public_task = asyncio.create_task(public.serve(), name="public-server")
    while not public.started:
        if public_task.done():
            public_task.result()  # raises the startup error
            raise ConfigError(f"could not listen on {settings.host}:{settings.port}")
        await asyncio.sleep(0.05)
    old_umask = os.umask(0o117)
    try:
        admin_task = asyncio.create_task(admin.serve(), name="admin-server")
        while not admin.started and not admin_task.done():
            await asyncio.sleep(0.02)
    finally:
        os.umask(old_umask)
    if settings.admin_socket.exists():
        os.chmod(settings.admin_socket, 0o660)
    redirect = await _start_redirect(settings, limits, common) if tls is not None and settings.tls_redirect_port else None

    watchdog: asyncio.Task | None = None
    interval = watchdog_interval()
    if interval:
        services = app.state.services
        watchdog = asyncio.create_task(watchdog_loop(interval, lambda: dbmod.ping(services.db)), name="watchdog")
    if tls is not None:
        watch = ExpiryWatch(settings, app.state.services.db)
        register_tls_gauge(app.state.services.metrics, lambda: tls.current)
        expiry = asyncio.create_task(_watch_expiry(watch, tls), name="tls-expiry")
    freeze_startup_objects()
    notify("READY=1")
    scheme = "https" if tls is not None else "http"
    log.info(
        "appliance ready",
        extra={"fields": {"url": f"{scheme}://{settings.host}:{settings.port}/", "data_dir": str(settings.data_dir)}},
    )
    cluster_view(settings)  # with ray_address: the Ray cluster is read in a thread; the log says what it found

    restart = asyncio.create_task(app.state.services.runtime_settings.restart_requested.wait(), name="restart-request")
    done, _ = await asyncio.wait(
        {public_task, admin_task, asyncio.create_task(stop.wait()), restart}, return_when=asyncio.FIRST_COMPLETED
    )
    if restart in done:
        log.info("restart asked for: draining")
        notify("STOPPING=1")
    else:
        restart.cancel()
    admin.should_exit = True
    public.should_exit = True
    if redirect is not None:
        redirect[0].should_exit = True
    await asyncio.gather(public_task, admin_task, *(redirect[1:] if redirect else ()), return_exceptions=True)
    if watchdog:
        watchdog.cancel()
    if expiry:
        expiry.cancel()
    settings.admin_socket.unlink(missing_ok=True)
    for task in done:
        error = task.exception() if task in (public_task, admin_task) else None
        if error is not None:
            raise error
    return restart in done


def run_loop(main: Coroutine[object, object, bool]) -> bool:
    """Run the daemon's event loop: uvloop (libuv), as the engines' workers do.

    uvicorn's own ``loop`` setting applies only when uvicorn runs the loop itself; the daemon runs
    two servers in one loop, so it chooses the loop here. On the request path the loop's own cost
    (polling sockets, scheduling callbacks, writing) is a large part of the gateway's overhead.
    """
    import uvloop

    return uvloop.run(main)


def run(settings: Settings) -> int:
    """Run the daemon in the foreground until SIGTERM or a restart request. Returns the exit code: 0, or
    RESTART_EXIT_CODE after a restart asked for from the console or the API (systemd starts the service again)."""
    # Its children (engines, the quantizer, the jemalloc re-exec) run `python -m appliance...`: without the current
    # folder first on their sys.path, a daemon started in a source checkout runs the installed package (a release
    # from a bundle), not the checkout's folder of the same name.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    setup_logging(settings.log_level, settings.log_format, settings.log_dir if settings.data_dir.exists() else None)
    allocator = use_jemalloc(settings.allocator, given_settings(settings))
    lock = DataDirLock(settings.lock_path)
    try:
        check_data_dir(settings)
        setup_logging(settings.log_level, settings.log_format, settings.log_dir)
        lock.acquire()
        dbmod.migrate(settings.db_path)
        _first_admin(settings)
        if allocator == "system":
            map_large_blocks()
        log.info("C allocator: %s", allocator)
        restart = run_loop(serve(settings))
    except ApplianceError as exc:
        print(f"applianced: error: {exc.message}", file=sys.stderr)
        return 2
    finally:
        lock.release()
    return RESTART_EXIT_CODE if restart else 0


def _first_admin(settings: Settings) -> None:
    """A data dir with no admin gets `admin` and a one-time password file, as the installer makes (appliance.cli.first_admin)."""
    from appliance.cli.first_admin import ensure_first_admin

    engine = dbmod.make_engine(settings.db_path)
    try:
        ensure_first_admin(settings, engine)
    finally:
        engine.dispose()


def given_settings(settings: Settings) -> dict[str, str]:
    """The settings given on the command line, as the ``APPLIANCE_*`` variables that carry them across a re-exec."""
    out = {}
    for name in type(settings).model_fields:
        if settings.origin(name).source == "command line":
            value = getattr(settings, name)
            out[f"APPLIANCE_{name.upper()}"] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="applianced", description="Run the LLM appliance daemon in the foreground.")
    parser.add_argument("--host", help="listen address (APPLIANCE_HOST)")
    parser.add_argument("--port", type=int, help="listen port (APPLIANCE_PORT)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:
        print(f"applianced: error: {exc.message}", file=sys.stderr)
        return 2
    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
