"""`GET /api/events` through real HTTP with demo upstreams: the opening snapshot, a request's swap decision
and state changes, queue counts, slow subscribers, keep-alives, and the stream's end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from llmswap.config.model import ApiKey
from llmswap.server.events import EVENTS_KEY, Event, EventFeed
from llmswap.server.state import ServerState
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import ServeConfig, Served, serving, until

WITHIN = 15.0
MESSAGES = [{"role": "user", "content": "hi"}]


class EventReader:
    """Reads one open /api/events response event by event."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.comments: list[str] = []

    async def next(self, within: float = WITHIN) -> tuple[str, dict[str, Any]]:
        name, data = "message", ""
        async with asyncio.timeout(within):
            while True:
                raw = await self.response.content.readline()
                if not raw:
                    raise EOFError("the event stream ended")
                line = raw.decode().rstrip("\n")
                if line.startswith(":"):
                    self.comments.append(line)
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:].strip()
                elif line == "" and data:
                    event = (name, json.loads(data))
                    self.seen.append(event)
                    return event

    async def until(self, name: str, within: float = WITHIN, **fields: Any) -> dict[str, Any]:
        """Read on until an event named `name` whose data has these field values."""
        async with asyncio.timeout(within):
            while True:
                got, data = await self.next()
                if got == name and all(data.get(k) == v for k, v in fields.items()):
                    return data


@contextlib.asynccontextmanager
async def events(
    http: aiohttp.ClientSession, served: Served, headers: dict[str, str] | None = None
) -> AsyncIterator[EventReader]:
    async with http.get(served.at("/api/events"), headers=headers or {}) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        yield EventReader(response)


async def chat(http: aiohttp.ClientSession, served: Served, model: str) -> int:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 3}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        await response.read()
        return response.status


def indexes(seen: list[tuple[str, dict[str, Any]]], **wanted: tuple[str, dict[str, Any]]) -> dict[str, int]:
    """Where each wanted (name, fields) first occurs in `seen`."""
    found = {}
    for label, (name, fields) in wanted.items():
        found[label] = next(i for i, (got, data) in enumerate(seen)
                            if got == name and all(data.get(k) == v for k, v in fields.items()))
    return found


async def test_a_client_gets_a_snapshot_then_the_swap_and_state_changes_of_a_request(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "0.3", aliases=("mm",))))
    async with events(http, served) as stream:
        name, snapshot = await stream.next()
        assert name == "snapshot" and snapshot["reason"] == "connect"
        [model] = snapshot["models"]
        assert model | {"extras": None} == {
            "id": "m", "name": "", "description": "", "aliases": ["mm"], "unlisted": False,
            "state": "stopped", "in_flight": 0, "waiting": 0, "loading": False, "pid": None,
            "last_start_seconds": None, "ttl": 0, "extras": None,
        }
        assert snapshot["swaps"] == []

        assert await chat(http, served, "m") == 200
        await stream.until("swap", phase="finished", model="m")
        await stream.until("queue", model="m", in_flight=0, waiting=0)

    order = indexes(
        stream.seen,
        decided=("swap", {"phase": "started", "model": "m", "evict": [], "outcome": "pending"}),
        queued=("queue", {"model": "m", "waiting": 1, "loading": True}),
        starting=("model", {"model": "m", "event": "starting", "state": "starting"}),
        ready=("model", {"model": "m", "event": "ready", "state": "ready"}),
        finished=("swap", {"phase": "finished", "model": "m", "outcome": "ok", "error": None}),
        serving=("queue", {"model": "m", "waiting": 0, "in_flight": 1}),
    )
    assert order["decided"] < order["starting"] < order["ready"] < order["finished"]
    assert order["queued"] < order["serving"]
    decided = stream.seen[order["decided"]][1]
    assert decided["rule"] and decided["request_seq"] is not None
    ready = stream.seen[order["ready"]][1]
    assert ready["duration"] > 0
    finished = stream.seen[order["finished"]][1]
    assert finished["id"] == decided["id"] and finished["duration"] >= ready["duration"]


async def test_a_swap_decision_names_what_it_evicts(serve_config: ServeConfig, http: aiohttp.ClientSession):
    served = await serve_config(exclusive_config(demo_config("a"), demo_config("b")))
    assert await chat(http, served, "a") == 200
    async with events(http, served) as stream:
        _, snapshot = await stream.next()
        assert {m["id"]: m["state"] for m in snapshot["models"]} == {"a": "ready", "b": "stopped"}
        assert [s["model"] for s in snapshot["swaps"]] == ["a"]  # the history so far
        assert await chat(http, served, "b") == 200
        started = await stream.until("swap", phase="started", model="b")
        assert started["evict"] == ["a"]
        await stream.until("model", model="a", event="stopped", state="stopped")
        await stream.until("swap", phase="finished", model="b", outcome="ok")


async def test_a_failed_start_is_reported(serve_config: ServeConfig, http: aiohttp.ClientSession):
    served = await serve_config(exclusive_config(demo_config("bad", "--exit-after", "0")))
    async with events(http, served) as stream:
        await stream.next()
        assert await chat(http, served, "bad") >= 500
        failed = await stream.until("model", model="bad", event="start_failed")
        assert failed["state"] == "stopped" and "exited" in failed["detail"]
        finished = await stream.until("swap", phase="finished", model="bad")
        assert finished["outcome"] == "failed" and finished["error"]


async def test_a_slow_subscriber_does_not_hold_up_the_others(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    def small_backlog(state: ServerState) -> None:
        state.extras[EVENTS_KEY] = EventFeed(state, max_pending=8)

    served = await serve_config(exclusive_config(demo_config("m")), prepare=small_backlog)
    feed: EventFeed = served.state.extras[EVENTS_KEY]
    host, port = served.url.removeprefix("http://").split(":")
    # The slow client asks for the stream and then reads nothing: its socket buffers fill up.
    slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(slow, (host, int(port)))
        await loop.sock_sendall(slow, f"GET /api/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await until(lambda: feed.bus.subscribers == 1, what="the slow client to subscribe")
        [slow_subscription] = feed.bus.subscriptions
        async with events(http, served) as fast:
            await fast.next()
            padding = "x" * 16384
            # Fill the slow client's socket buffers (their size depends on the kernel) until it falls
            # behind. The fast client is not reading meanwhile either, so it may fall behind too.
            for n in range(10_000):
                feed.bus.publish(Event("filler", {"n": n, "padding": padding}))
                await asyncio.sleep(0)
                if slow_subscription.behind:
                    break
            assert slow_subscription.behind
            # The fast client gets to the end. If it fell behind for a moment, the marker itself may have
            # been dropped for it (a resync stood in): say it again until it arrives.
            repeat = asyncio.create_task(_repeat(feed, Event("marker", {"after": "filler"})))
            try:
                await fast.until("marker", within=WITHIN)
            finally:
                repeat.cancel()
            # ...while the slow one still reads nothing: its handler is stuck writing, nobody else is.
            assert slow_subscription.behind
            received = await _read_all_available(slow)
            # Now it reads: it gets a resync, then events again (said until it has caught up to them).
            repeat = asyncio.create_task(_repeat(feed, Event("marker", {"after": "reading"})))
            try:
                received += await _read_until(slow, b'"after":"reading"')
            finally:
                repeat.cancel()
        text = received.decode(errors="replace")
        assert "event: resync" in text  # its backlog was replaced by a snapshot
        assert text.index("event: resync") < text.index('"after":"reading"')
    finally:
        slow.close()


async def _repeat(feed: EventFeed, event: Event, every: float = 0.1) -> None:
    while True:
        feed.bus.publish(event)
        await asyncio.sleep(every)


async def _read_all_available(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


async def _read_until(sock: socket.socket, marker: bytes, within: float = WITHIN) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(within):
        while marker not in data:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                break
            data += chunk
    return data


async def test_quiet_streams_get_keepalive_comments(serve_config: ServeConfig, http: aiohttp.ClientSession):
    def fast_keepalive(state: ServerState) -> None:
        state.extras[EVENTS_KEY] = EventFeed(state, keepalive=0.1)

    served = await serve_config(exclusive_config(demo_config("m")), prepare=fast_keepalive)
    async with http.get(served.at("/api/events")) as response:
        async with asyncio.timeout(WITHIN):
            while (line := await response.content.readline()) != b": keepalive\n":
                assert line, "the stream ended before a keep-alive"


async def test_a_client_that_leaves_is_unsubscribed(serve_config: ServeConfig, http: aiohttp.ClientSession):
    served = await serve_config(exclusive_config(demo_config("m")))
    feed: EventFeed = served.state.extras[EVENTS_KEY]
    async with events(http, served) as stream:
        await stream.next()
        assert feed.bus.subscribers == 1
        stream.response.close()
    await until(lambda: feed.bus.subscribers == 0, what="the subscription to end")


async def test_the_stream_ends_cleanly_when_the_server_shuts_down(http: aiohttp.ClientSession):
    ended = asyncio.Event()

    async def follow(served: Served) -> bytes:
        async with http.get(served.at("/api/events")) as response:
            body = b""
            async for chunk in response.content.iter_any():
                body += chunk
            ended.set()
            return body

    async with serving(exclusive_config(demo_config("m"))) as served:
        task = asyncio.create_task(follow(served))
        feed: EventFeed = served.state.extras[EVENTS_KEY]
        await until(lambda: feed.bus.subscribers == 1, what="the client to subscribe")
    # Leaving the block shut the server down: the stream must have ended by itself, not by a cut.
    async with asyncio.timeout(WITHIN):
        body = await task
    assert ended.is_set() and body.startswith(b"event: snapshot\n")


async def test_events_need_a_key_when_api_keys_are_set(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=(ApiKey("sk-events-1"),)))
    async with http.get(served.at("/api/events")) as response:
        assert response.status == 401
    async with events(http, served, {"Authorization": "Bearer sk-events-1"}) as stream:
        name, _ = await stream.next()
        assert name == "snapshot"
