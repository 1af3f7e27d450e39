"""API-key authentication: which credential a request carries, whether it matches `apiKeys`, which routes
stay open.

Active only when the config lists `apiKeys`. A request may carry its key as `Authorization: Basic`
(the password part), `Authorization: Bearer` or `x-api-key`; like llama-swap, only the highest-precedence
credential present is compared, so a wrong Bearer next to a right `x-api-key` is refused. Every key is
compared in constant time, and keys are never logged. Once a request is let in, its credentials are
removed so they never travel on to an upstream.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from multidict import CIMultiDict

from llmswap.config.model import ApiKey
from llmswap.server.http.errors import error_response
from llmswap.server.state import API_KEY

log = logging.getLogger("llmswap.auth")

UNAUTHORIZED = "unauthorized: invalid or missing API key"
CHALLENGE = 'Basic realm="llmswap"'
PAGE_CHALLENGE = 'Bearer realm="llmswap"'

# Reachable without a key: health probes, the redirect to the UI and the UI page itself (which then
# calls the API with a key), CORS preflights.
OPEN_PATHS = frozenset({"/health", "/wol-health", "/", "/favicon.ico"})
OPEN_GET_PATHS = frozenset({"/upstream"})
OPEN_PREFIX = "/ui"

Source = Literal["basic", "bearer", "x-api-key"]


@dataclass(frozen=True)
class Credential:
    """The key a request presents, and where it was found (for log lines: the value is never logged)."""

    source: Source
    value: str


def credential(headers: Mapping[str, str]) -> Credential | None:
    """The highest-precedence credential in these headers: Basic password > Bearer > x-api-key.

    A Basic header that does not decode still counts as the credential presented (and so fails):
    a broken header must not let a lower-precedence one decide.
    """
    authorization = headers.get("Authorization", "").strip()
    scheme, _, rest = authorization.partition(" ")
    scheme = scheme.lower()
    if scheme == "basic":
        return Credential("basic", _basic_password(rest.strip()))
    if scheme == "bearer":
        return Credential("bearer", rest.strip())
    api_key = headers.get("x-api-key")
    if api_key is not None:
        return Credential("x-api-key", api_key.strip())
    return None


def _basic_password(encoded: str) -> str:
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return ""
    _user, colon, password = decoded.partition(":")
    return password if colon else ""


def find_key(candidate: str, keys: Sequence[ApiKey]) -> ApiKey | None:
    """The configured key equal to `candidate`. Every key is compared, each in constant time, so the
    time taken says nothing about which key (or how much of one) matched."""
    presented = candidate.encode("utf-8")
    match: ApiKey | None = None
    for key in keys:
        if hmac.compare_digest(key.key.encode("utf-8"), presented) and match is None:
            match = key
    return match if candidate else None


def is_open(method: str, path: str) -> bool:
    """Whether a route answers without a key."""
    if method == "OPTIONS" or path in OPEN_PATHS:
        return True
    if method in ("GET", "HEAD") and path in OPEN_GET_PATHS:
        return True
    return path == OPEN_PREFIX or path.startswith(OPEN_PREFIX + "/")


def without_credentials(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The request headers minus the proxy's own credentials."""
    kept = CIMultiDict(headers)
    kept.popall("Authorization", None)
    kept.popall("x-api-key", None)
    return kept


def challenge(request: web.BaseRequest) -> str:
    """llama-swap's Basic challenge, except for a page's own fetch calls (`Sec-Fetch-Mode` other than
    navigate): a browser answers Basic with its login prompt, which would come before the status page's key
    form (and blocks a headless one). Bearer names the scheme the key goes in and prompts nothing."""
    mode = request.headers.get("Sec-Fetch-Mode")
    return CHALLENGE if mode in (None, "navigate") else PAGE_CHALLENGE


def presented_key(
    headers: Mapping[str, str], keys: Sequence[ApiKey]
) -> tuple[Credential | None, ApiKey | None]:
    """The credential the request presents (None: none) and the configured key it matches (None: none)."""
    presented = credential(headers)
    return presented, find_key(presented.value, keys) if presented is not None else None


def admit(request: web.Request, keys: Sequence[ApiKey]) -> web.Request | web.Response:
    """The request to serve, or the 401 answer in its place. With `keys` configured and a closed route,
    the request served is a clone without its credentials (so they never reach an upstream), carrying
    the matching key under `API_KEY`; otherwise it is `request` itself."""
    if not keys or is_open(request.method, request.path):
        return request
    presented, key = presented_key(request.headers, keys)
    if key is None:
        why = "no API key" if presented is None else f"the {presented.source} key matches no apiKeys entry"
        log.warning("auth: refused %s %s from %s: %s",
                    request.method, request.path, request.remote or "-", why)
        return error_response(request, 401, UNAUTHORIZED, headers={"WWW-Authenticate": challenge(request)})
    admitted = request.clone(headers=without_credentials(request.headers))
    admitted[API_KEY] = key
    return admitted
