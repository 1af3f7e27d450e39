"""The `filters:` and `timeouts:` blocks, which models and peers share."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.model import Filters, Timeouts
from llmswap.config.yamltree import Map, describe, to_python

FILTER_KEYS = keys.FILTERS  # the keys the loader accepts here (llmswap.config.keys)
TIMEOUT_KEYS = {
    "connect": "connect",
    "keepalive": "keepalive",
    "responseHeader": "response_header",
    "tlsHandshake": "tls_handshake",
    "expectContinue": "expect_continue",
    "idleConn": "idle_conn",
    "wall": "wall",  # llmswap: the watchdog (llmswap.upstream.forward)
    "idle": "idle",
}
PROTECTED_PARAM = "model"  # routing depends on it: filters may never remove or set it


def is_http_url(text: str) -> bool:
    """Whether `text` is an http(s) URL with a host (what an upstream or peer `proxy` must be)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def strip_param_names(text: str) -> tuple[str, ...]:
    """`"temperature, top_p,,model"` -> `("temperature", "top_p")`: trimmed, unique, sorted."""
    names = {name.strip() for name in text.split(",")}
    names.discard("")
    names.discard(PROTECTED_PARAM)
    return tuple(sorted(names))


def _params(value: Any) -> dict[str, Any]:
    return {key: item for key, item in value.items() if key != PROTECTED_PARAM}


def read_filters(fields: Fields) -> Filters:
    fields.warn_unknown(keys.FILTERS)
    strip = fields.text("stripParams")
    if not strip.strip():
        strip = fields.text("strip_params")  # llama-swap's original spelling, still accepted

    set_params = fields.mapping("setParams", "a mapping of request fields to values")
    by_id: dict[str, dict[str, Any]] = {}
    for name, entry in fields.mapping(
        "setParamsByID", "a mapping of model names to parameters"
    ).map.entries.items():
        if not isinstance(entry.node, Map):
            fields.problems.error(
                entry.key_line,
                f"{fields.path_of('setParamsByID')}.{name}",
                f"must be a mapping of request fields to values, got {describe(entry.node)}",
            )
            continue
        by_id[name] = _params(to_python(entry.node))
    return Filters(
        strip_params=strip_param_names(strip),
        set_params=_params(to_python(set_params.map)),
        set_params_by_id=by_id,
    )


def read_timeouts(fields: Fields, defaults: Timeouts) -> Timeouts:
    fields.warn_unknown(keys.TIMEOUTS)
    changes = {
        attribute: fields.number(
            key, getattr(defaults, attribute), minimum=0, accepted="0 (no limit) or seconds"
        )
        for key, attribute in TIMEOUT_KEYS.items()
        if fields.has(key)
    }
    return replace(defaults, **changes)
