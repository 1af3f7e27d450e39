"""`cors:` and `allowedHosts:`: which web pages (origins) and which Host names llmswap answers.

Both default to loopback only (plus, for origins, the server's own); an entry adds to that. The grammar
of an entry and the matching live in `llmswap.config.origins`; this module reads the YAML and reports each
bad entry with its line.
"""

from __future__ import annotations

from llmswap.config import keys
from llmswap.config.fields import Fields
from llmswap.config.origins import HostPattern, OriginPattern, parse_host_pattern, parse_origin_pattern

CORS_KEYS = keys.CORS  # the keys the loader accepts here (llmswap.config.keys)


def read_allowed_origins(root: Fields) -> tuple[OriginPattern, ...]:
    cors = root.mapping("cors", "a mapping with allowedOrigins:")
    cors.warn_unknown(keys.CORS)
    patterns: list[OriginPattern] = []
    for text, line, where in cors.texts("allowedOrigins", "a list of origins such as https://chat.example.com"):
        try:
            patterns.append(parse_origin_pattern(text))
        except ValueError as exc:
            root.problems.error(line, where, str(exc))
    if len(patterns) > 1 and any(pattern.any_origin for pattern in patterns):
        cors.warn("allowedOrigins", "* allows every origin; the other entries change nothing")
    return tuple(patterns)


def read_allowed_hosts(root: Fields) -> tuple[HostPattern, ...]:
    patterns: list[HostPattern] = []
    for text, line, where in root.texts("allowedHosts", "a list of host names such as llm.example.com"):
        try:
            patterns.append(parse_host_pattern(text))
        except ValueError as exc:
            root.problems.error(line, where, str(exc))
    return tuple(patterns)
