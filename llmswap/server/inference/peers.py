"""Peers: remote OpenAI-compatible backends named in `peers.<id>`, addressed as `<peer>/<model>` or by the
bare model name when exactly one peer lists it (reference 2.10).

Resolution is pure (`resolve_peer`, `peer_models`); `forward_to_peer` sends a request there with the body's
`model` rewritten to the peer's own name, the peer's filters applied, the peer's `apiKey` in place of the
client's credentials, and `Host` set to the peer's host. Local models and aliases always win over peers:
callers try `config.real_model_name` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from yarl import URL

from llmswap.activity.recording import Recording, RequestRecord
from llmswap.config.model import Config, PeerConfig
from llmswap.server.inference.placement import FORWARDED_HEADER
from llmswap.server.inference.proxy import UPSTREAMS, Body, SseErrorFormatter, forward, openai_sse_error
from llmswap.server.state import state
from llmswap.upstream.forward import Destination

CREDENTIAL_HEADERS = ("Authorization", "x-api-key")


@dataclass(frozen=True)
class PeerModel:
    """One model a peer serves, under the name llmswap lists it."""

    id: str  # `<peer>/<model>`
    peer: PeerConfig
    model: str  # the name the peer knows it by


def peer_models(config: Config) -> list[PeerModel]:
    """Every peer model, sorted by its `<peer>/<model>` id (for listings)."""
    found = [
        PeerModel(f"{peer.id}/{model}", peer, model)
        for peer in config.peers.values()
        for model in peer.models
    ]
    return sorted(found, key=lambda entry: entry.id)


def resolve_peer(config: Config, name: str) -> tuple[PeerConfig, str] | None:
    """The peer serving `name` and the model name to send it, or None.

    `<peer>/<model>` first (a peer model's full name); then the bare `<model>` when exactly one peer lists
    it. Names with slashes work both ways: `a/b/c` is model `b/c` of peer `a`, or bare `a/b/c` of a peer
    listing that name."""
    peer_id, slash, model = name.partition("/")
    if slash:
        peer = config.peers.get(peer_id)
        if peer is not None and model in peer.models:
            return peer, model
    owners = [peer for peer in config.peers.values() if name in peer.models]
    if len(owners) == 1:
        return owners[0], name
    return None


def peer_host(peer: PeerConfig) -> str:
    url = URL(peer.proxy)
    return url.host_port_subcomponent or url.host or ""


def peer_headers(
    peer: PeerConfig, client_headers: Mapping[str, str], *, llmswap_has_keys: bool
) -> tuple[dict[str, str], tuple[str, ...]]:
    """(headers to set, client headers to drop) for a request to `peer`.

    With an `apiKey`, the peer gets it as both `Authorization: Bearer` and `x-api-key`. Without one, the
    client's credentials go along only when llmswap itself has no `apiKeys`: otherwise they are llmswap's
    own keys, which another backend has no business seeing."""
    headers = {"Host": peer_host(peer)}
    if peer.api_key:
        headers["Authorization"] = f"Bearer {peer.api_key}"
        headers["x-api-key"] = peer.api_key
        return headers, ()
    drop = tuple(name for name in CREDENTIAL_HEADERS if llmswap_has_keys and name in client_headers)
    return headers, drop


async def forward_to_peer(
    request: web.Request,
    peer: PeerConfig,
    *,
    path: str,
    body: Body | None,
    query: str | None = None,
    sse_error: SseErrorFormatter = openai_sse_error,
    recording: Recording | None = None,
    record: RequestRecord | None = None,
    forwarded: bool = False,
) -> web.StreamResponse:
    """Send the (already rewritten) request to `peer`; transport failures → 502 `peer proxy error: ...`.
    `forwarded`: placed there by state (`placement.py`), marked so that the peer never forwards it again."""
    server = state(request)
    upstream = request.app[UPSTREAMS].upstream(f"peer:{peer.id}", peer.timeouts)
    destination = Destination(peer.proxy, upstream, peer.timeouts, f"peers.{peer.id}.timeouts")
    extra, drop = peer_headers(peer, request.headers, llmswap_has_keys=bool(server.config.api_keys))
    if forwarded:
        extra[FORWARDED_HEADER] = "1"
    return await forward(
        request,
        destination,
        path=path,
        body=body,
        extra_headers=extra,
        drop_headers=drop,
        query=query,
        error_prefix="peer proxy error",
        sse_error=sse_error,
        recording=recording,
        record=record,
    )
