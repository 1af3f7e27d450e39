"""Which web origins and Host names may reach llmswap: the grammar of `cors.allowedOrigins` and
`allowedHosts`, and the matching of a request's `Origin` and `Host` headers against them.

Pure functions on strings, no I/O: the config loader parses the patterns (a `ValueError` names the fix),
the server's guard (`llmswap.server.http.guard`) matches headers against them on every request.

    origin pattern   *  |  scheme://host[:port]     host: a name, *.suffix (one or more labels), or an
                                                    IP ([::1] for IPv6); port: digits or *; no port means
                                                    the scheme's default (80, 443)
    host pattern     *  |  host  |  *.suffix        matched against the Host header without its port

Loopback is always allowed: `localhost`, `*.localhost` (RFC 6761 keeps the whole name space on the
machine), 127.0.0.0/8 and ::1.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
ANY_PORT = -1

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
_PORT = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True)
class Origin:
    """A request's `Origin` header, parsed: scheme and host lowercased, the default port made explicit."""

    scheme: str
    host: str  # a name, an IPv4 address, or an IPv6 address without brackets
    port: int | None  # None for schemes without a default port and none given


@dataclass(frozen=True)
class OriginPattern:
    """One `cors.allowedOrigins` entry."""

    text: str  # as written, for messages
    scheme: str = ""  # "" with host "*": any origin at all
    host: str = "*"  # "*" (any), "*.example.com" (subdomains), or a literal host
    port: int | None = None  # ANY_PORT, a number, or None (the scheme has no default and none given)

    @property
    def any_origin(self) -> bool:
        return not self.scheme and self.host == "*"

    def matches(self, origin: Origin | None) -> bool:
        """Whether this pattern lets in `origin` (None: an opaque `Origin: null`, only `*` allows it)."""
        if self.any_origin:
            return True
        if origin is None or origin.scheme != self.scheme:
            return False
        if self.port != ANY_PORT and origin.port != self.port:
            return False
        return host_matches(self.host, origin.host)


@dataclass(frozen=True)
class HostPattern:
    """One `allowedHosts` entry."""

    text: str
    host: str  # "*", "*.example.com", or a literal name or address


def host_matches(pattern: str, host: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        suffix = pattern[1:]  # ".example.com": at least one label before it
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def split_host_port(authority: str) -> tuple[str, int | None] | None:
    """`host[:port]` or `[v6][:port]` → (host lowercased without brackets, port); None if malformed."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[1:end], authority[end + 1:]
        if not _is_ip(host, version=6):
            return None
    else:
        host, colon, port_text = authority.partition(":")
        rest = colon + port_text
        if host.endswith(".") and host != ".":
            host = host[:-1]  # the fully qualified form of the same name
        if not host or not (_NAME.fullmatch(host) or _is_ip(host, version=4)):
            return None
    if not rest:
        return host, None
    if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]) or int(rest[1:]) > 65535:
        return None
    return host, int(rest[1:])


def parse_origin(value: str) -> Origin | None:
    """A request's `Origin` header; None for `null` or anything that is not scheme://host[:port]."""
    scheme, sep, authority = value.strip().lower().partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return None
    parsed = split_host_port(authority)
    if parsed is None:
        return None
    host, port = parsed
    return Origin(scheme, host, port if port is not None else DEFAULT_PORTS.get(scheme))


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address (no port, no brackets) always means this machine."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback_origin(origin: Origin | None) -> bool:
    return origin is not None and origin.scheme in ("http", "https") and is_loopback_host(origin.host)


def parse_origin_pattern(text: str) -> OriginPattern:
    """A `cors.allowedOrigins` entry. Raises ValueError saying what to write instead."""
    written = text.strip()
    if written == "*":
        return OriginPattern(text=written)
    if written.lower() == "null":
        raise ValueError("null (sandboxed pages, file:// URLs) cannot be allowed on its own; use * to allow "
                         "every origin")
    example = ("write scheme://host[:port], e.g. https://chat.example.com, https://*.example.com or "
               "http://localhost:*")
    scheme, sep, authority = written.lower().partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        raise ValueError(f"{written!r} is not an origin; {example}")
    bare = re.split(r"[/?#]", authority, maxsplit=1)[0]
    if bare != authority:
        raise ValueError(f"{written!r}: an origin has no path; write {scheme}://{bare}")
    if "@" in authority:
        raise ValueError(f"{written!r}: an origin has no user name; write {scheme}://{authority.split('@')[-1]}")
    port: int | None = DEFAULT_PORTS.get(scheme)
    if authority.endswith(":*"):
        authority, port = authority[:-2], ANY_PORT
    if authority == "*":
        return OriginPattern(text=written, scheme=scheme, host="*", port=port)
    wildcard = authority.startswith("*.")
    # A stand-in first label lets the wildcard's suffix be checked like any host name.
    parsed = split_host_port("x" + authority[1:] if wildcard else authority)
    if parsed is None:
        if "*" in authority:
            raise ValueError(f"{written!r}: a * may stand only for the whole host, its leading labels "
                             "(*.example.com) or the port (:*)")
        raise ValueError(f"{written!r} is not an origin; {example}")
    host, given_port = parsed
    return OriginPattern(text=written, scheme=scheme, host="*" + host[1:] if wildcard else host,
                         port=given_port if given_port is not None else port)


def parse_host_pattern(text: str) -> HostPattern:
    """An `allowedHosts` entry. Raises ValueError saying what to write instead."""
    written = text.strip()
    if written == "*":
        return HostPattern(text=written, host="*")
    if "://" in written or "/" in written:
        bare = written.split("://")[-1].split("/")[0]
        raise ValueError(f"{written!r}: give the host name alone, without scheme or path, e.g. {bare}")
    wildcard = written.startswith("*.")
    parsed = split_host_port("x" + written[1:] if wildcard else written)
    if parsed is None:
        raise ValueError(f"{written!r} is not a host name; write a name (llm.example.com), *.example.com, "
                         "an address, or * for any")
    host, port = parsed
    if port is not None:
        shown = f"[{host}]" if ":" in host else host
        raise ValueError(f"{written!r}: leave the port out (any port is allowed); write {shown}")
    return HostPattern(text=written, host="*" + host[1:] if wildcard else host)


def _is_ip(text: str, *, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False
