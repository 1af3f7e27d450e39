"""Relaying a websocket between a client and an upstream (ComfyUI's progress socket, a realtime API).

llmswap does not splice the raw TCP streams after a 101: it opens its own websocket to the upstream with the
client's headers and subprotocols, completes the client's handshake only once the upstream accepted (so a
refused or unreachable upstream is an ordinary HTTP error, not a socket that opens and dies), and then copies
messages both ways. Each hop answers its own pings. When either side closes, the other is closed with the
same code, or with 1001 (going away) when the side vanished without a close frame, as an upstream that was
stopped does.

At shutdown every relayed socket is closed with 1001 at once (`close_open_sockets`, an on_shutdown hook): a
socket has no natural end, so waiting for it would only use up the whole grace period.

Who may open one and whether it holds the model loaded is `upstream.py`'s decision, not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Mapping

import aiohttp
from aiohttp import hdrs, web
from yarl import URL

from llmswap.activity.recording import RequestRecord
from llmswap.server.http.errors import error_response
from llmswap.server.inference.proxy import outgoing_headers
from llmswap.upstream.forward import describe

log = logging.getLogger("llmswap.proxy")

# The handshake's own headers: aiohttp computes fresh ones for the upstream leg (key, version) and
# negotiates extensions per hop; subprotocols are passed as `protocols` instead.
_HANDSHAKE_HEADERS = (
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Extensions",
    "Sec-WebSocket-Protocol",
)
GOING_AWAY = 1001
CLOSE_TIMEOUT = 5.0  # seconds to wait for the other side's close frame before dropping the connection
# Seconds between pings on each leg. A peer that vanished without closing (a laptop lid, a cut link)
# answers none, and its socket is closed after half this more: an open socket holds its model loaded,
# so a dead one must not hold it for ever.
HEARTBEAT = 30.0


class OpenSockets(dict[web.WebSocketResponse, str]):
    """The client side of every socket being relayed, with the model (or `<peer>/<model>`) it talks to:
    for closing them all at shutdown, and for the open-sockets gauge."""

    def per_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for model in self.values():
            counts[model] = counts.get(model, 0) + 1
        return counts


SOCKETS: web.AppKey[OpenSockets] = web.AppKey("llmswap_websockets", OpenSockets)


async def close_open_sockets(app: web.Application) -> None:
    """`on_shutdown` hook: tell every client the server is going away; each relay then ends by itself."""
    open_now: OpenSockets = app[SOCKETS]
    sockets = list(open_now)
    await asyncio.gather(*(_close(socket, GOING_AWAY) for socket in sockets), return_exceptions=True)


def is_upgrade(request: web.BaseRequest) -> bool:
    """Whether this is a websocket opening handshake (RFC 6455 4.1: a GET with Upgrade and Connection)."""
    if request.method != "GET" or request.headers.get(hdrs.UPGRADE, "").strip().lower() != "websocket":
        return False
    tokens = {
        token.strip().lower()
        for value in request.headers.getall(hdrs.CONNECTION, ())
        for token in value.split(",")
    }
    return "upgrade" in tokens


def relayable_close_code(code: int | None) -> int:
    """The close code to pass on to the other side for one side's `code`.

    Codes that are only ever reported locally and must not appear in a close frame (1005 no status, 1006
    abnormal closure, 1015 TLS) and a missing code become 1001: the peer is going away."""
    if code is None:
        return GOING_AWAY
    if 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999:
        return code
    return GOING_AWAY


async def relay(
    request: web.Request,
    record: RequestRecord,
    url: URL,
    session: aiohttp.ClientSession,
    *,
    model: str,
    extra_headers: Mapping[str, str] | None = None,
    drop_headers: Collection[str] = (),
    error_prefix: str = "upstream proxy error",
) -> web.StreamResponse:
    """Open a websocket to `url` for this upgrade request and relay messages until either side closes;
    `model` names what it talks to (for the gauge).

    A refused upgrade (the upstream answered anything but 101) or an unreachable upstream is a 502 in the
    error envelope, before the client's handshake completes."""
    headers = outgoing_headers(request, extra_headers, (*drop_headers, *_HANDSHAKE_HEADERS))
    protocols = tuple(
        token.strip()
        for value in request.headers.getall(hdrs.SEC_WEBSOCKET_PROTOCOL, ())
        for token in value.split(",")
        if token.strip()
    )
    try:
        upstream = await session.ws_connect(
            url, headers=headers, protocols=protocols, max_msg_size=0, autoping=True, heartbeat=HEARTBEAT,
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT),
        )
    except aiohttp.WSServerHandshakeError as exc:
        why = f"the upstream refused the websocket upgrade ({exc.status} {exc.message})"
        log.warning("GET %s → %s: %s", request.path, url, why)
        return error_response(request, 502, f"{error_prefix}: {why}")
    except (aiohttp.ClientError, OSError) as exc:
        log.warning("GET %s → %s: %s", request.path, url, describe(exc))
        return error_response(request, 502, f"{error_prefix}: {describe(exc)}")
    try:
        client = web.WebSocketResponse(
            protocols=(upstream.protocol,) if upstream.protocol else (),
            max_msg_size=0, autoping=True, timeout=CLOSE_TIMEOUT, heartbeat=HEARTBEAT,
        )
        await client.prepare(request)
        record.relayed(0)  # the upgrade went out: its first byte
        sockets = request.app[SOCKETS]
        sockets[client] = model
        try:
            await _copy_until_closed(client, upstream)
        finally:
            sockets.pop(client, None)
        return client
    finally:
        await upstream.close()


Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


async def _copy_until_closed(client: Socket, upstream: Socket) -> None:
    """Copy both ways; when one direction ends, close the other side with the code its source closed with."""
    to_upstream = asyncio.ensure_future(_copy(client, upstream))
    to_client = asyncio.ensure_future(_copy(upstream, client))
    try:
        done, _ = await asyncio.wait({to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED)
        source, other = (client, upstream) if to_upstream in done else (upstream, client)
        # `source` stopped yielding messages: it closed (its code goes on), or, when sending to `other`
        # failed, it is still open and `other` is the one gone; then both just close.
        await _close(other, relayable_close_code(source.close_code))
        await _close(source, GOING_AWAY)
    finally:
        for task in (to_upstream, to_client):
            task.cancel()
        await asyncio.gather(to_upstream, to_client, return_exceptions=True)


async def _close(socket: Socket, code: int) -> None:
    if not socket.closed:
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            await socket.close(code=code)


async def _copy(source: Socket, destination: Socket) -> None:
    """Send every data message of `source` on to `destination` until `source` closes or fails."""
    async for message in source:  # ends at a close frame, a closed connection or an error
        try:
            if message.type is aiohttp.WSMsgType.TEXT:
                await destination.send_str(message.data)
            elif message.type is aiohttp.WSMsgType.BINARY:
                await destination.send_bytes(message.data)
        except (ConnectionError, aiohttp.ClientError):
            return  # the destination is gone
