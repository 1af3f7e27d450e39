"""Following the `discover: true` peers (other llmswaps) on their `/api/events` streams, to know their state.

One task per such peer reads its stream (with its `apiKey`), keeps a `HostView` of it from the `snapshot`
(models, states, counts, the vram router's free memory), `modelStatus`, `processEvent` and `queue` frames,
and reconnects with a backoff (0.5 s doubling to 10 s) when the stream breaks. A peer is fresh while its
stream is open and something (a frame, or the `: keepalive` its feed sends after 15 s of silence) arrived
within `STALE_AFTER`. The set of peers followed follows the config across reloads (`reconcile`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from llmswap import calls
from llmswap.config.model import Config, PeerConfig
from llmswap.process.state import ProcessState
from llmswap.server.admin.tasks import TASKS
from llmswap.server.inference.peers import peer_headers
from llmswap.server.inference.placement import (
    FORWARDED_HEADER,
    HostView,
    ModelView,
    Placement,
    local_view,
    place,
    place_remote,
)
from llmswap.server.observe.eventbus import Event
from llmswap.server.observe.events import FEED
from llmswap.server.state import STATE

log = logging.getLogger("llmswap.peers")

STALE_AFTER = 30.0  # seconds without a frame or keep-alive: twice the feed's keep-alive interval


class PeerWatch:
    """The live views of the discovered peers, by peer id."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.views: dict[str, HostView] = {}
        self._heard: dict[str, float] = {}  # when its stream last said anything (a frame, a keep-alive)
        self._connected: dict[str, bool] = {}  # its stream is open and has sent its snapshot
        self._tasks: dict[str, tuple[PeerConfig, asyncio.Task[None]]] = {}
        self._clock = clock

    def fresh_views(self) -> list[HostView]:
        """Every followed peer's view, `fresh` set as of now."""
        now = self._clock()
        for name, view in self.views.items():
            view.fresh = self._connected.get(name, False) and now - self._heard.get(name, 0.0) < STALE_AFTER
        return list(self.views.values())

    def discovered(self) -> dict[str, list[str]]:
        """The listed models the fresh peers define, each with the peers that define it (sorted)."""
        found: dict[str, list[str]] = {}
        for view in self.fresh_views():
            if view.fresh:
                for model, seen in view.models.items():
                    if seen.listed:
                        found.setdefault(model, []).append(view.name)
        return {model: sorted(peers) for model, peers in sorted(found.items())}

    def down_for(self, name: str) -> list[str]:
        """The followed peers that defined `name` (or `<peer>/<model>`) when last heard, now down or stale."""
        peer, slash, model = name.partition("/")
        return sorted(view.name for view in self.fresh_views() if not view.fresh and (
            name in view.models or (slash and view.name == peer and model in view.models)))

    def reconcile(self, config: Config) -> None:
        """Follow exactly the config's discover peers (a changed peer is followed anew)."""
        wanted = {peer.id: peer for peer in config.peers.values() if peer.discover}
        for name, (peer, task) in list(self._tasks.items()):
            if wanted.get(name) != peer:
                task.cancel()
                del self._tasks[name]
                self.views.pop(name, None)
                self._connected.pop(name, None)
        for name, peer in wanted.items():
            if name not in self._tasks:
                self.views[name] = HostView(name, fresh=False)
                task = asyncio.get_running_loop().create_task(self._follow(peer), name=f"peer-watch-{name}")
                self._tasks[name] = (peer, task)

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _follow(self, peer: PeerConfig) -> None:
        backoff = 0.5
        headers, _ = peer_headers(peer, {}, llmswap_has_keys=False)  # as every request to the peer goes
        url = peer.proxy.rstrip("/") + "/api/events"
        told = ""  # the last problem logged: a peer that stays away is logged once, not every retry
        async with calls.session(None, sock_connect=5, sock_read=STALE_AFTER) as http:
            while True:
                try:
                    async with http.get(url, headers=headers) as response:
                        if response.status != 200:
                            raise ConnectionError(f"{url} answered {response.status}"
                                                  f"{_status_hint(response.status, peer.id)}")
                        backoff = 0.5
                        told = ""
                        await self._read(peer.id, response)
                except (aiohttp.ClientError, ConnectionError, TimeoutError, ValueError) as exc:
                    problem = str(exc) or type(exc).__name__
                    if problem != told and not self._connected.get(peer.id):
                        log.warning("peer %s: cannot follow its state at %s: %s; it is not a candidate until "
                                    "it answers (retrying every %.0fs at most)", peer.id, url, problem, 10.0)
                        told = problem
                    else:
                        log.debug("peer %s: events stream: %s", peer.id, problem)
                if self._connected.pop(peer.id, False):
                    log.warning("peer %s: its events stream closed; not a candidate until it is back",
                                peer.id)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _read(self, name: str, response: aiohttp.ClientResponse) -> None:
        def heard() -> None:
            self._heard[name] = self._clock()

        async for data in calls.events(response, heard):
            envelope = json.loads(data)
            payload = envelope.get("data")
            decoded = json.loads(payload) if isinstance(payload, str) else payload
            self._apply(name, envelope.get("type"), decoded)

    def _apply(self, name: str, kind: Any, data: Any) -> None:
        view = self.views.get(name)
        if view is None:
            return
        if kind == "snapshot" and isinstance(data, dict):
            view.models = {m["id"]: ModelView(str(m.get("state", "stopped")), int(m.get("in_flight") or 0),
                                              int(m.get("waiting") or 0), not m.get("unlisted"))
                           for m in data.get("models", []) if isinstance(m, dict) and "id" in m}
            view.free_memory = _free_memory(data.get("router_extras"))
            if not self._connected.get(name):
                log.info("peer %s: following its state (%d models)", name, len(view.models))
            self._connected[name] = True
        elif kind == "modelStatus" and isinstance(data, list):
            for status in data:
                model = status.get("id") if isinstance(status, dict) else None
                if model in view.models and not status.get("peerID"):
                    old = view.models[model]
                    view.models[model] = ModelView(str(status.get("state")), old.in_flight, old.waiting,
                                                   old.listed)
        elif kind in ("queue", "processEvent") and isinstance(data, dict) \
                and data.get("model") in view.models:
            model = data["model"]
            old = view.models[model]
            if kind == "queue":
                view.models[model] = ModelView(old.state, int(data.get("in_flight") or 0),
                                               int(data.get("waiting") or 0), old.listed)
            elif data.get("state"):
                view.models[model] = ModelView(str(data["state"]), old.in_flight, old.waiting, old.listed)


def _status_hint(status: int, peer: str) -> str:
    if status in (401, 403):
        return f" (check peers.{peer}.apiKey: it must be one of that host's apiKeys)"
    if status == 404:
        return " (is it an llmswap? discover: true follows another llmswap's /api/events)"
    return ""


def _free_memory(extras: Any) -> int | None:
    devices = extras.get("vram", {}).get("devices") if isinstance(extras, dict) else None
    if not isinstance(devices, dict):
        return None
    return sum(max(0, int(d.get("budget", 0)) - int(d.get("in_use", 0))) for d in devices.values()
               if isinstance(d, dict))


def this_host(app: web.Application, *also: str) -> HostView:
    """This host's view: its running models (and `also`, whatever their state), with their counts."""
    router = app[STATE].router
    counts = router.snapshot()
    states = {m: state.value for m, state in router.running_models().items()}
    for model in also:
        states.setdefault(model, (router.model_state(model) or ProcessState.STOPPED).value)
    return local_view(states, counts.in_flight, counts.waiting, _free_memory(router.router_extras()))


async def hosts(request: web.Request) -> web.Response:
    """`GET /api/hosts`: this host and every discover peer, as placement sees them; and `queue`, the hosts
    of a shared task queue (empty without one)."""
    config = request.app[STATE].config
    here = this_host(request.app, *config.models)
    views = [here, *request.app[PEER_WATCH].fresh_views()]
    service = request.app[TASKS].enabled()
    queue = service.hosts_json() if service is not None else []
    return web.json_response({"queue": queue, "hosts": [{
        "name": view.name or "this host",
        "url": config.peers[view.name].proxy if view.name in config.peers else None,
        "fresh": view.fresh, "free_memory": view.free_memory,
        "models": [{"id": m, "state": v.state, "in_flight": v.in_flight, "waiting": v.waiting}
                   for m, v in sorted(view.models.items())],
    } for view in views]})


PEER_WATCH: web.AppKey[PeerWatch] = web.AppKey("llmswap_peer_watch", PeerWatch)


def setup(app: web.Application) -> None:
    """`/api/hosts`, and the peers' followers closed at cleanup (the app follows each config's peers)."""

    async def stop(app: web.Application) -> None:
        with contextlib.suppress(Exception):
            await app[PEER_WATCH].close()

    app.router.add_get("/api/hosts", hosts)
    app.on_cleanup.append(stop)


def discovered_for(request: web.Request, name: str) -> tuple[Placement, str] | None:
    """Where a request for `name`, which no model, alias or listed peer model here answers, goes when a fresh
    discover peer defines it: (placement, the peer's own model name); None when none does, or when the request
    was forwarded here already (one hop at most). `<peer>/<model>` names one discover peer outright."""
    watch = request.app[PEER_WATCH]
    if not watch.views or FORWARDED_HEADER in request.headers:
        return None
    views = watch.fresh_views()
    peer, slash, model = name.partition("/")
    for view in views:
        if slash and view.fresh and view.name == peer and model in view.models:
            return Placement(peer, f"defined on {peer}"), model
    placed = place_remote(name, views)
    if placed is None:
        return None
    event = {"model": name, "host": placed.host, "reason": placed.reason}
    request.app[FEED].publish(Event("placement", event))
    return placed, name


def placement_for(request: web.Request, model: str) -> Placement | None:
    """Where a request for `model` (a local model id) goes when discover peers serve it too; None when no
    such peer is followed or the request was forwarded here already (one hop at most)."""
    watch = request.app[PEER_WATCH]
    if not watch.views or FORWARDED_HEADER in request.headers:
        return None
    peers = [view for view in watch.fresh_views() if model in view.models or not view.fresh]
    if not peers:
        return None
    placed = place(model, this_host(request.app, model), peers)
    request.app[FEED].publish(Event("placement", {"model": model, "host": placed.host or "local",
                                                  "reason": placed.reason}))
    return placed
