"""API keys through real HTTP: precedence of the three ways to send one, open routes, CORS preflight without
a key, credentials never forwarded upstream and never written to the proxy log."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest

from llmswap.config.model import ApiKey
from llmswap.server.state import RingHandler
from tests.helpers.models import demo_config, exclusive_config

RIGHT = "sk-right-0123456789"
OTHER = "sk-other-9876543210"
WRONG = "sk-wrong-5555555555"


def keyed_config(*flags: str):
    return exclusive_config(demo_config("m", *flags), api_keys=(ApiKey(RIGHT), ApiKey(OTHER, priority=3)))


def basic(password: str, user: str = "anyone") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def proxy_ring_logging() -> Iterator[list[RingHandler]]:
    """Route llmswap's log records into each served state's proxy ring, as the CLI does."""
    handlers: list[RingHandler] = []
    logger = logging.getLogger("llmswap")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield handlers
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)


def attach(handlers: list[RingHandler], served) -> None:
    handler = RingHandler(served.state.proxy_log)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    logging.getLogger("llmswap").addHandler(handler)
    handlers.append(handler)


async def status_of(
    http, served, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> int:
    async with http.request(method, served.at(path), headers=headers or {}, allow_redirects=False) as resp:
        await resp.read()
        return resp.status


async def test_missing_key_is_401_with_a_basic_challenge(serve_config, http):
    served = await serve_config(keyed_config())
    async with http.get(served.at("/v1/models")) as resp:
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"] == 'Basic realm="llmswap"'
        error = (await resp.json())["error"]
    assert error == {"message": "unauthorized: invalid or missing API key", "type": "authentication_error",
                     "param": None, "code": "unauthorized"}


async def test_a_pages_own_fetch_gets_a_challenge_browsers_do_not_prompt_for(serve_config, http):
    served = await serve_config(keyed_config())
    for mode, expected in (("cors", 'Bearer realm="llmswap"'), ("same-origin", 'Bearer realm="llmswap"'),
                           ("navigate", 'Basic realm="llmswap"')):
        async with http.get(served.at("/api/events"), headers={"Sec-Fetch-Mode": mode}) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == expected


async def test_each_way_of_sending_the_key_is_accepted(serve_config, http):
    served = await serve_config(keyed_config())
    for headers in (
        {"Authorization": f"Bearer {RIGHT}"},
        {"Authorization": f"bearer {OTHER}"},
        {"x-api-key": RIGHT},
        {"Authorization": basic(RIGHT)},
        {"Authorization": basic(OTHER, user="")},
    ):
        assert await status_of(http, served, "/v1/models", headers) == 200, headers


async def test_only_the_highest_precedence_credential_counts(serve_config, http):
    served = await serve_config(keyed_config())
    refused = (
        {"Authorization": f"Bearer {WRONG}", "x-api-key": RIGHT},
        {"Authorization": basic(WRONG), "x-api-key": RIGHT},
        {"Authorization": "Basic %%%", "x-api-key": RIGHT},
        {"Authorization": basic("", user=RIGHT)},  # the key goes in the password, not the user
        {"x-api-key": WRONG},
        {"Authorization": "Bearer "},
    )
    for headers in refused:
        assert await status_of(http, served, "/v1/models", headers) == 401, headers
    basic_wins = {"Authorization": basic(RIGHT), "x-api-key": WRONG}
    assert await status_of(http, served, "/v1/models", basic_wins) == 200


async def test_open_routes_need_no_key(serve_config, http):
    served = await serve_config(keyed_config())
    assert await status_of(http, served, "/health") == 200
    assert await status_of(http, served, "/wol-health") == 200
    assert await status_of(http, served, "/") == 302
    assert await status_of(http, served, "/upstream") == 302
    assert await status_of(http, served, "/favicon.ico") != 401


async def test_every_other_route_needs_a_key(serve_config, http):
    served = await serve_config(keyed_config())
    for method, path in (
        ("GET", "/running"), ("GET", "/unload"),
        ("POST", "/api/models/unload"), ("POST", "/api/models/unload/m"),
        ("GET", "/logs"), ("GET", "/logs/stream"), ("GET", "/api/events"), ("GET", "/api/version"),
        ("GET", "/upstream/m/health"), ("POST", "/upstream"), ("POST", "/v1/chat/completions"),
        ("GET", "/no/such/route"),
    ):
        assert await status_of(http, served, path, method=method) == 401, (method, path)


async def test_cors_preflight_needs_no_key(serve_config, http):
    served = await serve_config(keyed_config())
    headers = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
    async with http.options(served.at("/v1/chat/completions"), headers=headers) as resp:
        assert resp.status == 204
        assert resp.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        assert resp.headers["Access-Control-Allow-Methods"] == "GET, POST, PUT, PATCH, DELETE, OPTIONS"
        assert resp.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert resp.headers["Access-Control-Max-Age"] == "86400"


async def test_credentials_do_not_reach_the_upstream(serve_config, http):
    served = await serve_config(keyed_config("--echo"))
    headers = {"Authorization": f"Bearer {RIGHT}", "x-api-key": RIGHT, "X-Custom": "kept"}
    async with http.get(served.at("/upstream/m/props"), headers=headers) as resp:
        assert resp.status == 200
        seen = {k.lower(): v for k, v in (await resp.json())["echo"]["headers"].items()}
    assert seen["x-custom"] == "kept"
    assert "authorization" not in seen and "x-api-key" not in seen


async def test_keys_never_reach_the_proxy_log(serve_config, http, proxy_ring_logging):
    served = await serve_config(keyed_config())
    attach(proxy_ring_logging, served)
    await status_of(http, served, "/v1/models", {"Authorization": f"Bearer {WRONG}"})
    await status_of(http, served, "/v1/models", {"x-api-key": WRONG})
    await status_of(http, served, "/v1/models", {"Authorization": basic(WRONG)})
    await status_of(http, served, "/running", {"Authorization": f"Bearer {RIGHT}"})
    await status_of(http, served, "/logs", {"Authorization": basic(OTHER)})

    history = "\n".join(served.state.proxy_log.history())
    # The log did record these requests (so the check below looks at real lines)...
    assert "auth: refused GET /v1/models" in history
    assert '"GET /running" 200' in history
    # ...and no key, nor its Basic encoding, is in it.
    for secret in (RIGHT, OTHER, WRONG):
        assert secret not in history
        assert basic(secret).split()[1] not in history
    async with http.get(served.at("/logs"), headers={"x-api-key": RIGHT}) as resp:
        body = await resp.text()
    assert "auth: refused" in body and RIGHT not in body and WRONG not in body


async def test_auth_is_off_without_api_keys(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    assert await status_of(http, served, "/v1/models") == 200
    assert await status_of(http, served, "/v1/models", {"Authorization": f"Bearer {WRONG}"}) == 200
