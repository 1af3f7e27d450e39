"""Who may talk to llmswap from a browser: the Host check, the Origin check, the cross-site refusal and the
CORS headers. `screen` runs (from the one middleware, `llmswap.server.http.middleware.gate`) before auth, so a
page that may not reach llmswap is refused whether or not it has a key.

A local llmswap must not be drivable by whatever web page its user happens to open:
- **Host.** On a loopback listener, a Host that is not loopback (or listed in `allowedHosts`) is refused:
  that is how a DNS-rebinding page (evil.example resolving to 127.0.0.1) shows itself. On another
  listener Host is free unless `allowedHosts` is set.
- **Origin.** Without `apiKeys`, a request carrying `Origin` is served only for loopback origins, the
  server's own origin (the Origin's host:port is the Host it was sent to) and `cors.allowedOrigins`; any
  other is refused with 403 before anything happens — "simple" requests (a text/plain POST) included,
  since a browser sends those without asking first. A preflight from such an origin gets no allow headers.
  With `apiKeys`, the key is the guard, as in llama-swap: any page may call (and be answered a preflight),
  its requests still needing a key, unless `cors.allowedOrigins` names the origins that may.
- **No Origin, cross-site.** `<img src=.../unload>` or a link sends no Origin but, from a current browser,
  `Sec-Fetch-Site: cross-site`; such a request may only open pages (`/`, `/ui`, `/health`), nothing else.
  SDKs and curl send neither header and pass untouched.
Allowed origins get their own origin back in `Access-Control-Allow-Origin` (with `Vary: Origin`), never `*`.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from llmswap.config.model import Config
from llmswap.config.origins import (
    DEFAULT_PORTS,
    HostPattern,
    host_matches,
    is_loopback_host,
    is_loopback_origin,
    parse_origin,
    split_host_port,
)
from llmswap.server.http.errors import error_response

log = logging.getLogger("llmswap.server")

ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
DEFAULT_ALLOW_HEADERS = "Content-Type, Authorization, Accept, X-Requested-With"
PREFLIGHT_MAX_AGE = "86400"
_HEADER_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

# What a page on another site may still open without an Origin (a link to the status page): nothing
# that loads, unloads or reads a model.
CROSS_SITE_PAGES = frozenset({"/", "/ui", "/favicon.ico", "/health", "/wol-health"})

# The origin a request was let in with, for the response hook to echo back.
ALLOWED_ORIGIN: web.RequestKey[str] = web.RequestKey("llmswap_allowed_origin", str)


@dataclass(frozen=True)
class Screening:
    """The guard's answer for one request: refused (with a 403 message) or let in (with the origin the
    response may be read by, if the request came from a page)."""

    refusal: str = ""
    allow_origin: str = ""

    @property
    def refused(self) -> bool:
        return bool(self.refusal)


LET_IN = Screening()


def judge(method: str, path: str, headers: Mapping[str, str], config: Config, *,
          loopback_listener: bool) -> Screening:
    """Whether a request may go on, from its method, path and headers alone (pure: no I/O)."""
    host_header = headers.get("Host", "")
    # HTTP/1.0 without Host cannot be a browser; a public listener is free unless allowedHosts is set.
    if host_header and (loopback_listener or config.allowed_hosts):
        refusal = _host_refusal(host_header, config.allowed_hosts, loopback_listener)
        if refusal:
            return Screening(refusal=refusal)
    origin_text = headers.get("Origin")
    if origin_text is None:
        fetch_site = headers.get("Sec-Fetch-Site")
        if fetch_site is None or fetch_site.strip().lower() != "cross-site":
            return LET_IN  # what SDKs and curl send: neither header, no CORS work
        safe_page = method in ("GET", "HEAD") and (path in CROSS_SITE_PAGES or path.startswith("/ui/"))
        if not safe_page and not any(pattern.any_origin for pattern in config.allowed_origins):
            return Screening(refusal=(
                f"refused {method} {path}: a page on another site may not drive llmswap (the browser says "
                "Sec-Fetch-Site: cross-site and sends no Origin); open llmswap's own page, or call it with "
                "fetch() from an origin listed in cors.allowedOrigins"))
        return LET_IN
    origin_text = origin_text.strip()
    if origin_allowed(origin_text, host_header, config):
        return Screening(allow_origin=origin_text)
    shown = origin_text if origin_text.isprintable() else repr(origin_text)
    return Screening(refusal=(
        f"requests from the origin {shown} are not allowed: llmswap answers pages on loopback origins and "
        "its own; to let this one in, add it to cors.allowedOrigins in the config (or set apiKeys: then "
        "any page holding a key may call)"))


def origin_allowed(origin_text: str, host_header: str, config: Config) -> bool:
    origin = parse_origin(origin_text)
    if is_loopback_origin(origin) or any(p.matches(origin) for p in config.allowed_origins):
        return True
    if origin is None:
        return False
    if config.api_keys and not config.allowed_origins:
        return True  # the key is the guard: a page without one is refused by auth
    return _same_origin(origin.scheme, origin.host, origin.port, host_header)


def _same_origin(scheme: str, host: str, port: int | None, host_header: str) -> bool:
    # The page was served by the server it talks to: its origin names the Host it sends to. (The scheme
    # is not visible here behind a TLS-terminating proxy, so it is not compared.)
    if scheme not in ("http", "https"):
        return False
    authority = split_host_port(host_header)
    if authority is None:
        return False
    sent_host, sent_port = authority
    return sent_host == host and (sent_port if sent_port is not None else DEFAULT_PORTS[scheme]) == port


# A listener sees a handful of Host values, so each one's verdict is worked out once; the bound keeps a
# client that invents a new Host per request from growing it.
@functools.lru_cache(maxsize=256)
def _host_refusal(host_header: str, allowed_hosts: tuple[HostPattern, ...], loopback_listener: bool) -> str:
    authority = split_host_port(host_header)
    host = authority[0] if authority is not None else ""
    if host and (is_loopback_host(host) or any(host_matches(p.host, host) for p in allowed_hosts)):
        return ""
    shown = host_header if host_header.isprintable() else repr(host_header)
    if loopback_listener:
        return (f"the Host {shown} is not allowed: llmswap listens on a loopback address and answers only "
                "to localhost, 127.0.0.1 and [::1] (this stops DNS-rebinding pages); add the name to "
                "allowedHosts in the config to allow it")
    return f"the Host {shown} is not allowed; add it to allowedHosts in the config to allow it"


def preflight_headers(request_headers: Mapping[str, str], allow_origin: str) -> dict[str, str]:
    """The answer to a CORS preflight from an allowed origin (`allow_origin`; "" when the OPTIONS request
    came from no page at all): the usual methods, the asked-for headers."""
    requested = sanitize_header_names(request_headers.get("Access-Control-Request-Headers", ""))
    headers = {
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": requested or DEFAULT_ALLOW_HEADERS,
        "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
    }
    if allow_origin:
        headers["Access-Control-Allow-Origin"] = allow_origin
        headers["Vary"] = "Origin"
        if request_headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
            # Chromium asks before a public page reaches a private address; the origin is allowed, so yes.
            headers["Access-Control-Allow-Private-Network"] = "true"
    return headers


def sanitize_header_names(value: str) -> str:
    """The comma-separated header names that are valid HTTP tokens (nothing else is echoed back)."""
    names = (part.strip() for part in value.split(","))
    return ", ".join(name for name in names if _HEADER_TOKEN.fullmatch(name))


def screen(request: web.BaseRequest, config: Config, *, loopback_listener: bool) -> web.Response | None:
    """The answer the guard gives in place of the route (a 403 refusal, or a CORS preflight's 204), or None
    to let the request go on. An allowed origin is noted on the request for the response hook."""
    verdict = judge(request.method, request.path, request.headers, config,
                    loopback_listener=loopback_listener)
    if verdict.refusal:
        log.warning("guard: refused %s %s from %s: %s", request.method, request.path, request.remote or "-",
                    verdict.refusal)
        return error_response(request, 403, verdict.refusal)
    if verdict.allow_origin:
        request[ALLOWED_ORIGIN] = verdict.allow_origin
    if request.method == "OPTIONS":
        return web.Response(status=204, headers=preflight_headers(request.headers, verdict.allow_origin))
    return None


async def _cors_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    allowed = request.get(ALLOWED_ORIGIN)
    if isinstance(allowed, str) and allowed:
        # Ours replaces an upstream's (often `*`): the decision who may read llmswap's answers is ours.
        response.headers["Access-Control-Allow-Origin"] = allowed
        if "Origin" not in response.headers.getall("Vary", []):
            response.headers.add("Vary", "Origin")
        return
    if "Access-Control-Allow-Origin" not in response.headers:
        return  # the usual answer to a request from no page: nothing to look at
    origins = response.headers.getall("Access-Control-Allow-Origin")
    if len(origins) > 1:
        response.headers["Access-Control-Allow-Origin"] = origins[0]  # clients reject a list


def setup(app: web.Application) -> None:
    """Install the hook that puts the CORS origin on every response, streamed ones too."""
    app.on_response_prepare.append(_cors_headers)


def is_loopback_listener(host: str) -> bool:
    """Whether `--listen host` opens loopback addresses only ("" = every interface: no). A name is
    resolved once, at start."""
    if not host:
        return False
    bare = host.strip("[]")
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        pass
    if is_loopback_host(bare):
        return True
    try:
        infos = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in infos}  # minus an IPv6 zone
    return bool(addresses) and all(ipaddress.ip_address(address).is_loopback for address in addresses)
