"""`GET /api/events` through real HTTP with demo upstreams: llama-swap's envelope and opening frames, model
states, in-flight requests, llmswap's own types, slow subscribers, keep-alives, and the stream's end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from llmswap.config.model import ApiKey
from llmswap.server.observe.event_feed import EventFeed
from llmswap.server.observe.eventbus import Event
from llmswap.server.reload import apply_config
from llmswap.server.services import Services, build_services
from llmswap.server.state import ServerState
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served, serving

WITHIN = 15.0
MESSAGES = [{"role": "user", "content": "hi"}]
OPENING = ["logData", "logData", "modelStatus", "uiConfig", "profileChanged", "inflight", "snapshot"]

Frame = tuple[str, Any]


class EventReader:
    """Reads one open /api/events response frame by frame, unwrapping llama-swap's envelope."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.seen: list[Frame] = []

    async def next(self, within: float = WITHIN) -> Frame:
        name, data = "", ""
        async with asyncio.timeout(within):
            while True:
                raw = await self.response.content.readline()
                if not raw:
                    raise EOFError("the event stream ended")
                line = raw.decode().rstrip("\n")
                if line.startswith("event:"):
                    name = line[len("event:"):]
                elif line.startswith("data:"):
                    data = line[len("data:"):]
                elif line == "" and data:
                    assert name == "message"  # llama-swap's one event name
                    envelope = json.loads(data)
                    assert set(envelope) == {"type", "data"} and isinstance(envelope["data"], str)
                    frame = (envelope["type"], json.loads(envelope["data"]))
                    self.seen.append(frame)
                    return frame

    async def until(self, kind: str, within: float = WITHIN, **fields: Any) -> Any:
        """Read on until a frame of type `kind` whose payload has these field values."""
        async with asyncio.timeout(within):
            while True:
                got, data = await self.next()
                if got == kind and all(data.get(k) == v for k, v in fields.items()):
                    return data

    async def opening(self) -> list[Frame]:
        return [await self.next() for _ in OPENING]


@contextlib.asynccontextmanager
async def events(
    http: aiohttp.ClientSession, served: Served, headers: dict[str, str] | None = None
) -> AsyncIterator[EventReader]:
    async with http.get(served.at("/api/events"), headers=headers or {}) as response:
        assert response.status == 200, await response.text()
        yield EventReader(response)


async def chat(http: aiohttp.ClientSession, served: Served, model: str, **headers: str) -> int:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 3}
    async with http.post(served.at("/v1/chat/completions"), json=body, headers=headers) as response:
        await response.read()
        return response.status


def upserted(seen: list[Frame]) -> list[dict[str, Any]]:
    """The entries of every `inflight` upsert seen, in order."""
    return [data["request"] for kind, data in seen if kind == "inflight" and data["operation"] == "upsert"]


def states(status: list[dict[str, Any]]) -> dict[str, str]:
    return {entry["id"]: entry["state"] for entry in status}


async def test_a_stream_opens_with_llama_swaps_frames_in_llama_swaps_order(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("b", aliases=("bb",)), demo_config("a")))
    served.state.proxy_log.append("an earlier proxy line")
    async with http.get(served.at("/api/events")) as response:
        for name, value in {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                            "X-Content-Type-Options": "nosniff", "X-Accel-Buffering": "no"}.items():
            assert response.headers[name] == value
        stream = EventReader(response)  # it checks every frame is `event:message` + the envelope
        frames = await stream.opening()
    assert [kind for kind, _ in frames] == OPENING
    assert frames[0][1] == {"source": "proxy", "data": "an earlier proxy line\n"}
    assert frames[1][1]["source"] == "upstream"
    assert frames[2][1] == [
        {"id": "a", "name": "", "description": "", "state": "stopped", "unlisted": False, "peerID": ""},
        {"id": "b", "name": "", "description": "", "state": "stopped", "unlisted": False, "peerID": "",
         "aliases": ["bb"]},
    ]
    assert frames[3][1] == {"activity": {"session_id": ["X-Session-ID", "X-Litellm-Session-Id"]}}
    assert frames[4][1] == {"active": None}
    assert frames[5][1] == {"operation": "snapshot"}  # nothing in flight: no `requests` key
    assert frames[6][1]["reason"] == "connect" and [m["id"] for m in frames[6][1]["models"]] == ["a", "b"]


async def test_a_model_start_passes_modelstatus_through_starting_and_ready(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "0.3")))
    async with events(http, served) as stream:
        await stream.opening()
        assert await chat(http, served, "m") == 200
        await stream.until("swap", phase="finished", model="m")
    statuses = [states(data)["m"] for kind, data in stream.seen if kind == "modelStatus"]
    assert statuses[0] == "stopped" and "starting" in statuses
    assert statuses.index("starting") < statuses.index("ready")


async def test_a_request_in_flight_is_upserted_then_removed(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    async with events(http, served) as stream:
        await stream.opening()
        headers = {"Authorization": "Bearer secret-value", "X-Forwarded-For": "203.0.113.9, 10.0.0.1"}
        assert await chat(http, served, "m", **headers) == 200
        removed = await stream.until("inflight", operation="remove")
    upserts = upserted(stream.seen)
    assert upserts and all(entry["id"] == removed["id"] for entry in upserts)
    first, last = upserts[0], upserts[-1]
    assert first["model"] == "m" and first["method"] == "POST" and first["req_path"] == "/v1/chat/completions"
    assert first["req_headers"]["Authorization"] == "[REDACTED]"
    assert first["remote_ip"] == "203.0.113.9"
    assert first["resp_headers"] == {} and first["resp_bytes"] == 0
    assert last["resp_headers"]["Content-Type"].startswith("application/json")  # upserted as headers went out
    assert first["timestamp"].endswith("Z") and isinstance(first["elapsed_ms"], int)


async def test_upstream_paths_are_tracked_only_when_they_are_model_routes(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    async with events(http, served) as stream:
        await stream.opening()
        async with http.get(served.at("/upstream/m/health")) as response:
            assert response.status == 200
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 3}
        async with http.post(served.at("/upstream/m/v1/chat/completions"), json=body) as response:
            assert response.status == 200
        await stream.until("inflight", operation="remove")
    assert {(entry["method"], entry["req_path"]) for entry in upserted(stream.seen)} == {
        ("POST", "/v1/chat/completions")}


async def test_a_streaming_answer_reports_its_byte_progress_while_in_flight(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--tokens-per-second", "20")))
    async with events(http, served) as stream:
        await stream.opening()
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 20, "stream": True}
        async with http.post(served.at("/v1/chat/completions"), json=body) as response:
            sent = len(await response.read())
        removed = await stream.until("inflight", operation="remove")
    progress = [entry["resp_bytes"] for entry in upserted(stream.seen) if entry["id"] == removed["id"]]
    assert any(0 < count < sent for count in progress)  # seen part way through
    assert progress == sorted(progress)


async def test_a_stream_opened_during_a_request_gets_it_in_the_snapshot(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "1")))
    request = asyncio.create_task(chat(http, served, "m"))
    await until(lambda: served.router.snapshot().waiting.get("m", 0) == 1, what="the request to queue")
    async with events(http, served) as stream:
        frames = await stream.opening()
        [entry] = frames[5][1]["requests"]
        assert entry["model"] == "m" and entry["resp_bytes"] == 0
        assert await request == 200
        removed = await stream.until("inflight", operation="remove")
        assert removed == {"operation": "remove", "id": entry["id"]}


async def test_llmswaps_own_types_report_the_swap_its_reason_and_the_queue(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    slow_b = demo_config("b", "--startup-delay", "0.3")
    served = await serve_config(exclusive_config(demo_config("a"), slow_b))
    assert await chat(http, served, "a") == 200
    async with events(http, served) as stream:
        frames = await stream.opening()
        assert [s["model"] for s in frames[6][1]["swaps"]] == ["a"]  # the history so far
        assert await chat(http, served, "b") == 200
        finished = await stream.until("swap", phase="finished", model="b")
        await stream.until("queue", model="b", in_flight=0, waiting=0)
    started = next(data for kind, data in stream.seen if kind == "swap" and data["phase"] == "started")
    assert started["evict"] == ["a"] and started["rule"] and started["request_seq"] is not None
    assert finished["id"] == started["id"] and finished["outcome"] == "ok" and finished["duration"] > 0
    process = [(data["model"], data["event"]) for kind, data in stream.seen if kind == "processEvent"]
    assert ("a", "stopped") in process and process.index(("b", "starting")) < process.index(("b", "ready"))
    queued = [data for kind, data in stream.seen if kind == "queue" and data["model"] == "b"]
    assert any(data["waiting"] == 1 for data in queued)


async def test_a_failed_start_is_reported_with_its_reason(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("bad", "--exit-after", "0")))
    async with events(http, served) as stream:
        await stream.opening()
        assert await chat(http, served, "bad") >= 500
        failed = await stream.until("processEvent", model="bad", event="start_failed")
        assert failed["state"] == "stopped" and "exited" in failed["detail"]
        finished = await stream.until("swap", phase="finished", model="bad")
        assert finished["outcome"] == "failed" and finished["error"]


async def test_log_lines_arrive_as_logdata(serve_config: ServeConfig, http: aiohttp.ClientSession):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with events(http, served) as stream:
        await stream.opening()
        served.state.proxy_log.append("a live proxy line")
        line = await stream.until("logData", source="proxy")
        assert line == {"source": "proxy", "data": "a live proxy line\n"}


async def test_a_slow_subscriber_loses_frames_not_memory_and_gets_the_state_again(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    def small_backlog(state: ServerState) -> Services:
        return build_services(state, feed_options={"max_pending": 8})

    served = await serve_config(exclusive_config(demo_config("m")), services=small_backlog)
    feed = served.services.events
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
            await fast.opening()
            padding = "x" * 16384
            # Fill the slow client's socket buffers (their size depends on the kernel) until it falls
            # behind. The fast client is not reading meanwhile either, so it may fall behind too.
            for n in range(10_000):
                feed.bus.publish(Event("filler", {"n": n, "padding": padding}))
                await asyncio.sleep(0)
                assert slow_subscription.pending <= 8  # bounded, however far behind it is
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
            assert slow_subscription.behind  # its handler is stuck writing, nobody else is
            received = await _read_all_available(slow)
            repeat = asyncio.create_task(_repeat(feed, Event("marker", {"after": "reading"})))
            try:
                received += await _read_until(slow, b'after\\":\\"reading')
            finally:
                repeat.cancel()
        text = received.decode(errors="replace")
        # Its dropped frames were replaced by the state, then frames flow again.
        assert '"type":"snapshot"' in text and 'reason\\":\\"resync' in text
        assert text.index('reason\\":\\"resync') < text.index('after\\":\\"reading')
        assert slow_subscription.dropped > 0
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
    def fast_keepalive(state: ServerState) -> Services:
        return build_services(state, feed_options={"keepalive": 0.1})

    served = await serve_config(exclusive_config(demo_config("m")), services=fast_keepalive)
    async with http.get(served.at("/api/events")) as response:
        async with asyncio.timeout(WITHIN):
            while (line := await response.content.readline()) != b": keepalive\n":
                assert line, "the stream ended before a keep-alive"


async def test_a_client_that_leaves_is_unsubscribed(serve_config: ServeConfig, http: aiohttp.ClientSession):
    served = await serve_config(exclusive_config(demo_config("m")))
    feed = served.services.events
    async with events(http, served) as stream:
        await stream.next()
        assert feed.bus.subscribers == 1
        stream.response.close()
    await until(lambda: feed.bus.subscribers == 0, what="the subscription to end")


async def _read_to_end(response: aiohttp.ClientResponse) -> bytes:
    body = b""
    async with asyncio.timeout(WITHIN):
        async for chunk in response.content.iter_any():
            body += chunk
    return body


async def test_the_stream_ends_cleanly_when_the_server_shuts_down(http: aiohttp.ClientSession):
    async def follow(served: Served) -> bytes:
        async with http.get(served.at("/api/events")) as response:
            return await _read_to_end(response)

    async with serving(exclusive_config(demo_config("m"))) as served:
        task = asyncio.create_task(follow(served))
        feed = served.services.events
        await until(lambda: feed.bus.subscribers == 1, what="the client to subscribe")
    # Leaving the block shut the server down: the stream must have ended by itself, not by a cut.
    body = await task
    assert body.startswith(b"event:message\ndata:")


async def test_the_stream_ends_on_a_config_reload_and_a_new_one_shows_the_new_models(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/api/events")) as response:
        stream = EventReader(response)
        await stream.opening()
        outcome = apply_config(served.state, exclusive_config(demo_config("m"), demo_config("n")))
        assert outcome.applied
        await _read_to_end(response)  # returns: the server ended the stream
    async with events(http, served) as again:
        frames = await again.opening()
        assert states(frames[2][1]) == {"m": "stopped", "n": "stopped"}


async def test_events_need_a_key_when_api_keys_are_set(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=(ApiKey("sk-events-1"),)))
    async with http.get(served.at("/api/events")) as response:
        assert response.status == 401
    async with events(http, served, {"Authorization": "Bearer sk-events-1"}) as stream:
        kind, _ = await stream.next()
        assert kind == "logData"
