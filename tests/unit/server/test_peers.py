"""Peer name resolution and the credentials a peer receives."""

from __future__ import annotations

from llmswap.config.model import Config, PeerConfig
from llmswap.server.inference.peers import peer_headers, peer_models, resolve_peer


def config(*peers: PeerConfig) -> Config:
    return Config(peers={peer.id: peer for peer in peers})


OPENROUTER = PeerConfig("openrouter", "https://openrouter.ai/api", ("qwen/qwen3", "llama"), api_key="sk-or")
LAN = PeerConfig("lan", "http://10.0.0.5:8080", ("llama", "mistral"))


def test_full_name_resolves_to_peer_and_bare_model() -> None:
    cfg = config(OPENROUTER, LAN)
    assert resolve_peer(cfg, "openrouter/qwen/qwen3") == (OPENROUTER, "qwen/qwen3")
    assert resolve_peer(cfg, "lan/llama") == (LAN, "llama")
    assert resolve_peer(cfg, "lan/qwen/qwen3") is None  # not a model of that peer


def test_bare_name_resolves_only_when_one_peer_lists_it() -> None:
    cfg = config(OPENROUTER, LAN)
    assert resolve_peer(cfg, "mistral") == (LAN, "mistral")
    assert resolve_peer(cfg, "qwen/qwen3") == (OPENROUTER, "qwen/qwen3")  # a slash, but "qwen" is no peer
    assert resolve_peer(cfg, "llama") is None  # listed by two peers: ambiguous
    assert resolve_peer(cfg, "nothing") is None


def test_full_name_wins_over_a_bare_name_that_looks_the_same() -> None:
    tricky = PeerConfig("other", "http://h", ("lan/mistral",))
    cfg = config(LAN, tricky)
    assert resolve_peer(cfg, "lan/mistral") == (LAN, "mistral")


def test_peer_models_are_listed_sorted_by_full_name() -> None:
    ids = [entry.id for entry in peer_models(config(OPENROUTER, LAN))]
    assert ids == ["lan/llama", "lan/mistral", "openrouter/llama", "openrouter/qwen/qwen3"]


def test_api_key_replaces_the_clients_credentials() -> None:
    headers, drop = peer_headers(OPENROUTER, {"Authorization": "Bearer mine"}, llmswap_has_keys=True)
    assert headers == {"Host": "openrouter.ai", "Authorization": "Bearer sk-or", "x-api-key": "sk-or"}
    assert drop == ()


def test_llmswap_keys_never_reach_a_peer_without_its_own_key() -> None:
    client = {"Authorization": "Bearer llmswap-key", "x-api-key": "llmswap-key"}
    headers, drop = peer_headers(LAN, client, llmswap_has_keys=True)
    assert headers == {"Host": "10.0.0.5:8080"}
    assert set(drop) == {"Authorization", "x-api-key"}
    # Without keys of its own llmswap passes the client's credentials through: they are meant for the peer.
    assert peer_headers(LAN, client, llmswap_has_keys=False) == ({"Host": "10.0.0.5:8080"}, ())
