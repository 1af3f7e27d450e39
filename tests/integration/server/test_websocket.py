"""Websockets through `/upstream/<model>/<path>` and `/v1/realtime?model=` against demo upstreams' echo
socket: relayed both ways, close codes passed on, held in flight like a request (llama-swap's default), or
not counted at all with `compat.ignoreWebsockets`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from types import MappingProxyType

import aiohttp
import pytest

from llmswap.config.model import PeerConfig, ProfileConfig, SelectorConfig
from llmswap.process.state import ProcessState
from llmswap.server.inference import websocket
from tests.helpers.demo import running_demo
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until

pytestmark = pytest.mark.timeout(60)


def in_flight(served, model: str) -> int:
    return served.router.snapshot().in_flight.get(model, 0)


async def hello(socket: aiohttp.ClientWebSocketResponse) -> dict:
    message = await socket.receive_json(timeout=10)
    assert message["event"] == "hello"
    return message


async def test_socket_starts_the_model_and_relays_text_and_binary(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    assert served.router.processes["m"].state is ProcessState.STOPPED
    async with http.ws_connect(served.at("/upstream/m/ws?room=7"), protocols=("demo.v1",),
                               headers={"X-Trace": "abc"}) as socket:
        greeting = await hello(socket)
        assert greeting["model"] == "m" and greeting["query"] == {"room": "7"}
        assert greeting["protocol"] == "demo.v1" and socket.protocol == "demo.v1"
        assert greeting["headers"]["X-Trace"] == "abc"
        assert served.router.processes["m"].state is ProcessState.READY
        async with http.get(served.at("/metrics")) as response:
            assert 'llmswap_websockets_open{model="m"} 1.0' in await response.text()
        await socket.send_str("ping one")
        assert await socket.receive_str(timeout=10) == "m: ping one"
        await socket.send_bytes(b"\x00\x01\x02")
        assert await socket.receive_bytes(timeout=10) == b"\x02\x01\x00"
        assert in_flight(served, "m") == 1  # an open socket holds the model like a request
    await until_zero(served, "m")
    async with http.get(served.at("/metrics")) as response:
        assert "llmswap_websockets_open{" not in await response.text()


async def until_zero(served, model: str) -> None:
    await until(lambda: in_flight(served, model) == 0, what=f"{model} no longer in flight")


async def test_an_open_socket_keeps_its_model_loaded_until_it_closes(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("a"), demo_config("b")))
    async with http.ws_connect(served.at("/upstream/a/ws")) as socket:
        await hello(socket)
        request = asyncio.create_task(http.get(served.at("/upstream/b/health")))
        await until(lambda: served.router.snapshot().waiting.get("b", 0) == 1, what="b waiting")
        # b must wait: evicting a would cut the socket (never evict a busy model).
        await socket.send_str("still here")
        assert await socket.receive_str(timeout=10) == "a: still here"
        assert not request.done()
    async with await request as response:
        assert response.status == 200 and response.headers["X-Demo-Model"] == "b"
    assert served.router.processes["a"].state is ProcessState.STOPPED


async def test_close_codes_pass_through_both_ways(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.ws_connect(served.at("/upstream/m/ws")) as socket:
        await hello(socket)
        await socket.send_str("close 4001")  # the demo closes with 4001
        message = await socket.receive(timeout=10)
        assert message.type is aiohttp.WSMsgType.CLOSE and message.data == 4001
    await until_zero(served, "m")

    async with http.ws_connect(served.at("/upstream/m/ws")) as socket:
        await hello(socket)
        await socket.close(code=4002)
    await until_zero(served, "m")
    async with http.get(served.at("/upstream/m/props")) as response:
        # The demo records the codes its clients closed with: the proxy passed the client's on.
        assert (await response.json())["demo"]["socket_close_codes"] == [4002]


async def test_a_stopped_upstream_closes_the_socket_as_going_away(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.ws_connect(served.at("/upstream/m/ws")) as socket:
        await hello(socket)
        unload = asyncio.create_task(http.post(served.at("/api/models/unload/m")))
        message = await socket.receive(timeout=10)
        assert message.type is aiohttp.WSMsgType.CLOSE and message.data == 1001
    async with await unload as response:
        assert response.status == 200
    await until_zero(served, "m")


async def test_ignored_websockets_cannot_start_the_model_nor_hold_it(serve_config, http):
    comfy = dataclasses.replace(demo_config("comfy"), ignore_websockets=True)
    served = await serve_config(exclusive_config(comfy, demo_config("llm")))
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(served.at("/upstream/comfy/ws"))
    assert refused.value.status == 409
    async with http.get(served.at("/upstream/comfy/ws"), headers={"Upgrade": "websocket",
                                                                  "Connection": "Upgrade"}) as response:
        error = (await response.json())["error"]
    assert error["message"] == "model comfy is not loaded; ignored websocket requests cannot start it"
    assert served.router.processes["comfy"].state is ProcessState.STOPPED

    async with http.get(served.at("/upstream/comfy/health")) as response:
        assert response.status == 200  # an ordinary request starts it
    async with http.ws_connect(served.at("/upstream/comfy/ws")) as socket:
        await hello(socket)
        assert in_flight(served, "comfy") == 0  # not counted: the idle tab must not pin the GPU
        # So another model may evict it at once, and the socket closes with its upstream.
        async with http.get(served.at("/upstream/llm/health")) as response:
            assert response.status == 200
        message = await socket.receive(timeout=10)
        assert message.type is aiohttp.WSMsgType.CLOSE and message.data == 1001
    assert served.router.processes["comfy"].state is ProcessState.STOPPED


async def test_a_path_that_is_not_a_socket_upstream_is_a_502(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(served.at("/upstream/m/props"))
    assert refused.value.status == 502
    handshake = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    async with http.get(served.at("/upstream/m/props"), headers=handshake) as response:
        message = (await response.json())["error"]["message"]
    assert message.startswith("upstream proxy error: the upstream refused the websocket upgrade (")
    await until_zero(served, "m")


async def test_peer_sockets_carry_the_peer_key(serve_config, http):
    async with running_demo("remote", []) as peer:
        config = exclusive_config(
            demo_config("m"), peers={"far": PeerConfig("far", peer.url, models=("big",), api_key="peer-key")},
        )
        served = await serve_config(config)
        async with http.ws_connect(served.at("/upstream/far/big/ws")) as socket:
            greeting = await hello(socket)
            await socket.send_str("over there")
            assert await socket.receive_str(timeout=10) == "remote: over there"
    assert greeting["model"] == "remote"
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_realtime_is_routed_by_its_model_query_parameter(serve_config, http):
    voice = dataclasses.replace(demo_config("voice"), use_model_name="whisper-large", aliases=("talk",))
    config = exclusive_config(voice, demo_config("chat"), aliases={"talk": "voice"})
    served = await serve_config(config)
    async with http.ws_connect(served.at("/v1/realtime?model=talk&intent=transcription")) as socket:
        greeting = await hello(socket)
        # The alias resolved to `voice`, which knows itself as whisper-large; the rest of the query went on.
        assert greeting["model"] == "voice"
        assert greeting["query"] == {"model": "whisper-large", "intent": "transcription"}
        assert in_flight(served, "voice") == 1
        await socket.send_str("hello")
        assert await socket.receive_str(timeout=10) == "voice: hello"
    await until_zero(served, "voice")


@pytest.mark.parametrize(
    ("query", "upgrade", "status", "message"),
    [
        ("?model=chat", False, 400, "/v1/realtime is a websocket: connect with a websocket client"),
        ("", True, 400, "/v1/realtime needs the model as a query parameter"),
        ("?model=ghost", True, 404, "no router for requested model"),
    ],
)
async def test_realtime_refusals(serve_config, http, query, upgrade, status, message):
    served = await serve_config(exclusive_config(demo_config("chat")))
    headers = {"Upgrade": "websocket", "Connection": "Upgrade"} if upgrade else {}
    async with http.get(served.at(f"/v1/realtime{query}"), headers=headers) as response:
        assert response.status == status
        assert (await response.json())["error"]["message"].startswith(message)
    assert served.router.processes["chat"].state is ProcessState.STOPPED


async def test_a_client_that_vanished_without_closing_stops_holding_its_model(
    serve_config, monkeypatch: pytest.MonkeyPatch
):
    # A raw connection that completes the handshake and then answers nothing, not even pings: a peer
    # gone without a FIN. The heartbeat closes the socket, which frees the model.
    monkeypatch.setattr(websocket, "HEARTBEAT", 0.3)
    served = await serve_config(exclusive_config(demo_config("m")))
    host, port = served.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"GET /upstream/m/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode()
    )
    await writer.drain()
    try:
        assert (await reader.readline()).startswith(b"HTTP/1.1 101")
        await until(lambda: in_flight(served, "m") == 1, what="the silent socket in flight")
        await until_zero(served, "m")  # its pings went unanswered
    finally:
        writer.close()


async def test_realtime_follows_profile_pins_and_selectors(serve_config, http):
    selectors = {"listen": SelectorConfig("listen", "spillover", ("voice",))}
    profiles = {"p": ProfileConfig("p", pins=MappingProxyType({"ears": "listen", "chat": ""}))}
    config = dataclasses.replace(exclusive_config(demo_config("voice"), demo_config("chat")),
                                 selectors=selectors, profiles=profiles)
    served = await serve_config(config)
    async with http.put(served.at("/api/profiles/active"), json={"name": "p"}) as response:
        assert response.status == 200
    async with http.ws_connect(served.at("/v1/realtime?model=ears")) as socket:
        greeting = await hello(socket)
        assert (greeting["model"], greeting["query"]) == ("voice", {"model": "voice"})
        book = served.services.selectors.book(served.config)
        assert book.outstanding("listen") == {"voice": 1}  # held while open
    await until(lambda: book.outstanding("listen") == {}, what="the release")
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade"}
    async with http.get(served.at("/v1/realtime?model=chat"), headers=upgrade) as response:
        assert response.status == 404  # disabled by the active profile


async def test_a_socket_whose_client_leaves_while_the_model_loads_leaves_the_queue(serve_config):
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "30")))

    def waiting() -> int:
        return served.router.snapshot().waiting.get("m", 0)

    async with aiohttp.ClientSession() as client:
        upgrade = asyncio.create_task(client.ws_connect(served.at("/upstream/m/ws")))
        await until(lambda: waiting() == 1, what="the upgrade waiting for the load")
        upgrade.cancel()  # the client hangs up before its socket is relayed
        with contextlib.suppress(asyncio.CancelledError):
            await upgrade
    await until(lambda: waiting() == 0, what="the abandoned upgrade leaving the queue")
    assert in_flight(served, "m") == 0
