"""`peers:`: remote OpenAI-compatible servers, each model reachable as `<peer>/<model>`.

A fully qualified peer name is reserved: a local model id or alias spelled the same way would make
the name mean two things, so it is an error at load (as it is in llama-swap).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from llmswap.config import keys
from llmswap.config.common import is_http_url, read_filters, read_timeouts
from llmswap.config.fields import Fields
from llmswap.config.model import PeerConfig, Timeouts
from llmswap.config.yamltree import Map

PEER_KEYS = keys.PEER  # the keys the loader accepts here (llmswap.config.keys)
IGNORED_PEER_KEYS = keys.PEER.ignored  # the keys the loader accepts here (llmswap.config.keys)
PEER_TIMEOUTS = Timeouts(response_header=60.0)


def read_peers(root: Fields, model_ids: Collection[str], aliases: Mapping[str, str]) -> dict[str, PeerConfig]:
    section = root.mapping("peers", "a mapping of peer ids to peers")
    peers: dict[str, PeerConfig] = {}
    owner: dict[str, tuple[str, str]] = {}  # fully qualified name -> (peer, model)
    for peer_id in section.names():
        fields = section.mapping(peer_id, "a mapping with proxy:, models:, apiKey:, filters:, timeouts:")
        if not isinstance(section.map.get(peer_id), Map):
            continue
        fields.warn_unknown(keys.PEER, keys.PEER.ignored)
        proxy = fields.text("proxy").strip()
        if not proxy:
            fields.error(
                "proxy" if "proxy" in fields.map.entries else None,
                "proxy is required: the peer's base URL, e.g. https://openrouter.ai/api",
            )
        elif not is_http_url(proxy):
            fields.error("proxy", f"invalid peer proxy URL {proxy!r}; give an http:// or https:// base URL")
        models: list[str] = []
        for name, line, where in fields.texts("models", "a list of the model names the peer serves"):
            name = name.strip()
            if not name:
                fields.problems.error(line, where, "empty model name; remove the entry")
                continue
            if name in models:
                continue
            models.append(name)
            fqn = f"{peer_id}/{name}"
            if fqn in model_ids:
                fields.problems.error(
                    line,
                    where,
                    f'model ID "{fqn}" conflicts with fully qualified peer model name; rename one',
                )
            elif fqn in aliases:
                fields.problems.error(
                    line,
                    where,
                    f'model {aliases[fqn]} alias "{fqn}" conflicts with fully qualified peer model name; '
                    "rename one",
                )
            elif fqn in owner:
                other_peer, other_model = owner[fqn]
                fields.problems.error(
                    line,
                    where,
                    f'peer model name "{fqn}" is ambiguous between peers.{other_peer} model "{other_model}" '
                    f'and peers.{peer_id} model "{name}"',
                )
            owner.setdefault(fqn, (peer_id, name))
        discover = fields.flag("discover", False)
        if not models and not discover:
            fields.error(
                "models" if "models" in fields.map.entries else None,
                "peer models can not be empty; list the model names the peer serves",
            )
        peers[peer_id] = PeerConfig(
            id=peer_id,
            proxy=proxy,
            models=tuple(models),
            api_key=fields.text("apiKey").strip(),
            filters=read_filters(fields.mapping("filters", "a mapping of filter settings")),
            timeouts=read_timeouts(
                fields.mapping("timeouts", "a mapping of timeouts in seconds"), PEER_TIMEOUTS
            ),
            discover=discover,
        )
    return peers
