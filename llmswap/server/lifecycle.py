"""One llmswap server's life: logging, router, listener, preload, signals, config reload, graceful stop.

    start   logging as the config says; router; the HTTP listener; then `hooks.on_startup.preload`, each
            model in turn through `router.acquire` — a request's own path, so it swaps like one would
    run     SIGHUP, or a changed file under --watch-config, reloads the config (`llmswap.server.reload`):
            every source again, the --config-dir's files as they are now
    stop    SIGINT/SIGTERM: stop accepting, let the responses in flight finish for a grace period
            (`--shutdown-grace`, 10 s), then end those still running with an error in the client's
            dialect, stop every upstream, exit 0 within the grace plus 2 s. A second signal cuts
            everything at once.

The upstreams also die with us if we are killed outright: each child has a parent-death signal
(`llmswap.process.child`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import ssl
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from llmswap import __version__
from llmswap.config import Config, ConfigSources
from llmswap.process.logring import LogRing
from llmswap.router import build_router
from llmswap.scheduler.errors import SchedulerError
from llmswap.server.app import create_app
from llmswap.server.http.connections import DescriptorWarnings, Runner, raise_open_file_limit
from llmswap.server.http.guard import is_loopback_listener
from llmswap.server.inference.inflight import Cut
from llmswap.server.loopwatch import watch_from_environment
from llmswap.server.observe.logsetup import configure_logging
from llmswap.server.reload import WATCH_INTERVAL, ConfigWatcher, ReloadOutcome, reload_from_sources
from llmswap.server.services import Services, build_services
from llmswap.server.state import ServerState

log = logging.getLogger("llmswap.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
SHUTDOWN_GRACE = 10.0  # seconds responses in flight get to finish once a stop is asked for
UPSTREAM_STOP_GRACE = 5.0  # seconds each upstream gets between SIGTERM and SIGKILL at shutdown
HURRY_GRACE = 1.0  # the same two, after a second signal
EXIT_MARGIN = 2.0  # seconds past the grace by which llmswap has exited, its upstreams stopped
CUT_WAIT = 1.0  # seconds the answers cut at the grace's end get to write their ending
MIN_UPSTREAM_GRACE = 0.2  # the least an upstream gets between SIGTERM and SIGKILL, whatever is left


@dataclass(frozen=True)
class ServeOptions:
    """What `llmswap --config ...` was asked for, beyond the config itself."""

    config_path: Path | None
    config_dir: Path | None = None  # --config-dir: its YAML files merged after config_path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: any free port (the log says which)
    watch_config: bool = False
    log_level: str | None = None  # overrides the config's logLevel
    shutdown_grace: float = SHUTDOWN_GRACE
    watch_interval: float = WATCH_INTERVAL
    tls_cert_file: Path | None = None  # both set: serve HTTPS
    tls_key_file: Path | None = None

    @property
    def sources(self) -> ConfigSources:
        return ConfigSources(self.config_path, self.config_dir)


class StartError(Exception):
    """The server cannot start; the message says what to change."""


# How the command that started llmswap chooses its address, when not with --listen (`make run` sets it).
LISTEN_HINT_ENV = "LLMSWAP_LISTEN_HINT"


class ListenError(StartError):
    """The HTTP listener could not be opened (address in use, bad host, no permission)."""


class UnusableConfig(StartError):
    """The config loaded but no router can be built for it."""


async def preload(state: ServerState, models: Sequence[str]) -> None:
    """Load `models` one after the other, each as a request would; a failure is logged and skipped."""
    for model in models:
        router = state.router  # read per model: a reload meanwhile hands the rest to the new router
        began = time.monotonic()
        try:
            async with router.acquire(model):
                pass
        except SchedulerError as err:
            log.warning("preload: %s did not load: %s", model, err.message)
        except Exception:
            log.exception("preload: %s did not load", model)
        else:
            log.info("preload: %s ready (%.2fs)", model, time.monotonic() - began)


class Server:
    """A running llmswap: `await start()`, then `await run()` until a signal (or `request_stop()`)."""

    def __init__(self, options: ServeOptions, config: Config) -> None:
        self.options = options
        self.proxy_log = LogRing("proxy")
        try:
            router = build_router(config)
        except ValueError as err:
            raise UnusableConfig(f"{config.path or 'the config'}: {err}") from None
        self.state = ServerState(config=config, router=router, proxy_log=self.proxy_log,
                                 loopback_listener=is_loopback_listener(options.host),
                                 listen_port=options.port)
        self.runner: Runner | None = None
        self.services: Services | None = None  # built at start, inside the running loop
        self.url = ""
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watcher: ConfigWatcher | None = None

    # ------------------------------------------------------------------ start

    def configure_logging(self, config: Config) -> None:
        configure_logging(
            level=self.options.log_level or config.log_level,
            to_stdout=config.log_to_stdout,
            time_format=config.log_time_format,
            proxy_log=self.proxy_log,
        )

    async def start(self) -> None:
        """Listen and serve; raises ListenError (with the router already stopped) if it cannot listen."""
        config = self.state.config
        try:
            tls = tls_context(self.options)
        except StartError:
            await self.state.router.shutdown(HURRY_GRACE)
            raise
        self.configure_logging(config)
        raise_open_file_limit()
        asyncio.get_running_loop().set_exception_handler(DescriptorWarnings())
        for warning in config.warnings:
            log.warning("config: %s", warning)
        if self.options.watch_config:
            # Read before serving: an edit from now on is a change, even one made during startup.
            self._watcher = ConfigWatcher(self.options.sources, self.options.watch_interval)
        self.state.router.start()
        self.services = build_services(self.state)
        app = create_app(self.state, self.services)
        self.runner = Runner(
            app, header_timeout=lambda: self.state.config.client_header_timeout,
            shutdown_timeout=self.options.shutdown_grace,
        )
        try:
            await self.runner.setup()  # runs the app's on_startup hooks (e.g. opening the task database)
        except OSError as exc:
            await self.state.router.shutdown(HURRY_GRACE)
            raise StartError(f"starting the server failed: {exc}") from None
        site = web.TCPSite(self.runner, self.options.host or None, self.options.port, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:
            await self.runner.cleanup()
            await self.state.router.shutdown(HURRY_GRACE)
            where = f"{self.options.host}:{self.options.port}"
            how = os.environ.get(LISTEN_HINT_ENV, "").strip() or "--listen HOST:PORT"
            raise ListenError(
                f"cannot listen on {where}: {exc.strerror or exc}; "
                f"is another server using it? choose another address with {how}"
            ) from None
        self.url = _url(self.runner, self.options.host, "https" if tls else "http")
        log.info("llmswap %s listening on %s (%d models, router %s); the status page is %s/ui", __version__,
                 self.url, len(config.models), self.state.router.name, self.url)
        if config.preload:
            self._spawn(preload(self.state, config.preload), "preload")
        if self._watcher is not None:
            self._spawn(self._watcher.watch(self.reload_soon), "config-watcher")

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ run

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.request_stop, signum)
        loop.add_signal_handler(signal.SIGHUP, self.reload_soon)

    def request_stop(self, signum: int | None = None) -> None:
        """First call: graceful stop. Second call: cut everything now."""
        what = signal.Signals(signum).name if signum is not None else "stop requested"
        if not self._stop.is_set():
            log.info("%s: shutting down (responses in flight get %gs to finish)", what,
                     self.options.shutdown_grace)
            self._stop.set()
        elif not self._hurry.is_set():
            log.warning("%s again: cutting responses in flight and stopping every upstream now", what)
            self._hurry.set()

    def reload_soon(self) -> None:
        """Reload the config file (SIGHUP, --watch-config); ignored once stopping."""
        if self._stopping:
            return
        log.info("config reload: reading %s", self.options.sources)
        self.reload()

    def reload(self) -> ReloadOutcome:
        outcome = reload_from_sources(self.state, self.options.sources)
        if outcome.applied:
            self.configure_logging(self.state.config)
            wanted = [m for m in self.state.config.preload if m in outcome.to_preload]
            if wanted:
                self._spawn(preload(self.state, wanted), "preload")
        return outcome

    async def run(self) -> int:
        """Serve until asked to stop, then stop gracefully; the exit status."""
        await self._stop.wait()
        await self.stop()
        return 0

    async def stop(self) -> None:
        """Stop accepting, let the answers in flight finish within the grace, then give those still running
        a clean end (`_cut_in_flight`), stop every upstream, and be done within the grace plus
        `EXIT_MARGIN`. A second signal cuts at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.shutdown_grace + EXIT_MARGIN
        self._stopping = True
        if self.runner is not None:
            self.runner.begin_stop()  # every response from now on says Connection: close
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.runner is not None:
            # Stops accepting, closes idle connections and waits for the handlers (aiohttp would wait
            # for them twice over before cancelling: the cut below comes first).
            cleanup = asyncio.ensure_future(self.runner.cleanup())
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait({cleanup, hurry}, timeout=self.options.shutdown_grace,
                               return_when=asyncio.FIRST_COMPLETED)
            if not cleanup.done():
                self._cut_in_flight()
                if self._hurry.is_set():
                    await self._shutdown_router(HURRY_GRACE)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(cleanup), CUT_WAIT)
            hurry.cancel()
            if not cleanup.done():
                log.warning("shutdown: connections still open after the grace are closed as llmswap exits")
                cleanup.cancel()
            elif not cleanup.cancelled() and cleanup.exception() is not None:
                log.error("shutdown: closing the HTTP server failed: %r", cleanup.exception())
        left = deadline - loop.time() - CUT_WAIT
        grace = max(MIN_UPSTREAM_GRACE, min(UPSTREAM_STOP_GRACE, left))
        await self._shutdown_router(HURRY_GRACE if self._hurry.is_set() else grace)
        log.info("llmswap stopped")

    def _cut_in_flight(self) -> None:
        """End every request still in flight as llmswap's own cut: an error in the client's dialect (an
        error event and the stream's end, or an error body), recorded as cut by the shutdown."""
        why = ("a second signal" if self._hurry.is_set()
               else f"the end of the {self.options.shutdown_grace:g}s shutdown grace")
        cut = Cut(503, f"llmswap is shutting down: the answer was cut at {why}", "shutdown")
        count = self.services.inflight.cut_all(cut) if self.services is not None else 0
        if count:
            log.warning("shutdown: cut %d request%s still in flight at %s", count, "" if count == 1 else "s",
                        why)

    async def _shutdown_router(self, grace: float) -> None:
        router = self.state.router
        if not router.closing:
            await router.shutdown(grace)


def tls_context(options: ServeOptions) -> ssl.SSLContext | None:
    """The server side of HTTPS when a certificate and key are given; StartError names a bad file."""
    if options.tls_cert_file is None or options.tls_key_file is None:
        return None
    for flag, path in (("--tls-cert-file", options.tls_cert_file), ("--tls-key-file", options.tls_key_file)):
        if not path.is_file():
            raise StartError(f"cannot read {path}: no such file; check {flag}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(options.tls_cert_file, options.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise StartError(
            f"cannot use the certificate {options.tls_cert_file} with the key {options.tls_key_file}: "
            f"{getattr(exc, 'reason', None) or exc}; give a PEM certificate and its matching unencrypted "
            "PEM private key"
        ) from None
    return context


def _url(runner: web.AppRunner, host: str, scheme: str) -> str:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound_host = str(address[0])
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            return f"{scheme}://{shown}:{address[1]}"
    return f"{scheme}://{host}"


# The cyclic garbage collector while serving. With Python's default (a young collection every 700 net
# allocations of tracked objects) a busy server ran one every couple of requests and a full one over ~95k
# objects every few hundred: about 10% of the CPU at 3k req/s in bench.wrk_nginx. What lives as long as
# the server (config, app, routes, modules) is frozen out of every collection, and young objects are
# collected after 50,000 net allocations: reference cycles are still collected, later, holding a few MB
# meanwhile. Most of a request's objects are freed by reference counting and never wait for it.
SERVING_GC_THRESHOLDS = (50_000, 10, 10)


def settle_garbage_collector() -> None:
    """Once started: freeze the long-lived objects and use `SERVING_GC_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)


async def serve(options: ServeOptions, config: Config) -> int:
    """Run a server with signal handling until it stops; the exit status. Raises StartError."""
    server = Server(options, config)
    server.install_signal_handlers()  # before starting: a signal during startup still stops cleanly
    await server.start()
    settle_garbage_collector()
    watch = watch_from_environment()  # LLMSWAP_LOOP_WATCH_MS: log callbacks that hold the loop
    try:
        return await server.run()
    finally:
        if watch is not None:
            watch.uninstall()


def run(options: ServeOptions, config: Config, *, event_loop: str = "asyncio") -> int:
    """The blocking entry point the CLI calls. `event_loop`: "asyncio", "uvloop", or "auto" (uvloop when
    installed). asyncio's own loop is the default: in bench/proxy_overhead.py uvloop made no difference
    beyond the run-to-run noise, the request path being dominated by aiohttp's own work."""
    if event_loop not in ("auto", "asyncio", "uvloop"):
        raise ValueError(f"event_loop must be auto, asyncio or uvloop, got {event_loop!r}")
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise
        else:
            return int(uvloop.run(serve(options, config)))
    return asyncio.run(serve(options, config))
