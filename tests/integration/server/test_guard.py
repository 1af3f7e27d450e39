"""Origins, Host names and cross-site requests through real HTTP: what a foreign page can no longer do
(read an answer, start or stop a model, rebind a name to 127.0.0.1), and what SDKs, loopback pages and
configured origins still can."""

from __future__ import annotations

import json

import aiohttp
import pytest

from llmswap.config.model import ApiKey
from llmswap.config.origins import parse_host_pattern, parse_origin_pattern
from llmswap.process.state import ProcessState
from tests.helpers.models import demo_config, exclusive_config

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
FOREIGN = "http://evil.test:8000"
KEY = "sk-guard-0123456789"


def config(*, origins: tuple[str, ...] = (), hosts: tuple[str, ...] = (), keys: tuple[str, ...] = ()):
    return exclusive_config(
        demo_config("m"),
        allowed_origins=tuple(parse_origin_pattern(origin) for origin in origins),
        allowed_hosts=tuple(parse_host_pattern(host) for host in hosts),
        api_keys=tuple(ApiKey(key) for key in keys),
    )


async def chat_as_text(http, served, **headers: str):
    """The request a page can send without a preflight: a POST with a text/plain body."""
    async with http.post(served.at("/v1/chat/completions"), data=json.dumps(CHAT),
                         headers={"Content-Type": "text/plain", **headers}) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def load_m(http, served) -> None:
    async with http.post(served.at("/v1/chat/completions"), json=CHAT) as resp:
        assert resp.status == 200


async def test_a_simple_post_from_a_foreign_origin_is_refused_before_the_model_starts(serve_config, http):
    served = await serve_config(config())
    status, headers, body = await chat_as_text(http, served, Origin=FOREIGN)
    assert status == 403
    assert "Access-Control-Allow-Origin" not in headers
    error = json.loads(body)["error"]
    assert error["code"] == "forbidden"
    assert error["message"].startswith(f"requests from the origin {FOREIGN} are not allowed")
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_a_foreign_preflight_gets_no_allow_headers(serve_config, http):
    served = await serve_config(config())
    headers = {"Origin": FOREIGN, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type"}
    async with http.options(served.at("/v1/chat/completions"), headers=headers) as resp:
        assert resp.status == 403
        assert not [name for name in resp.headers if name.lower().startswith("access-control-")]


async def test_an_unload_from_a_foreign_page_leaves_the_models_running(serve_config, http):
    served = await serve_config(config())
    await load_m(http, served)
    # <img src=http://127.0.0.1:PORT/unload> on another site: no Origin, but Sec-Fetch-Site says whence.
    image = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    async with http.get(served.at("/unload"), headers=image) as resp:
        assert resp.status == 403
        assert "a page on another site may not drive llmswap" in (await resp.json())["error"]["message"]
    async with http.post(served.at("/api/models/unload"), headers={"Origin": FOREIGN}) as resp:
        assert resp.status == 403
    assert served.router.processes["m"].state is ProcessState.READY


async def test_sdk_clients_without_origin_work_as_before(serve_config, http):
    served = await serve_config(config())
    status, headers, _ = await chat_as_text(http, served)
    assert status == 200
    assert "Access-Control-Allow-Origin" not in headers  # no page asked: nothing to allow
    async with http.get(served.at("/unload")) as resp:
        assert resp.status == 200
    assert served.router.processes["m"].state is ProcessState.STOPPED


async def test_a_loopback_page_reads_the_answer_streamed_or_not(serve_config, http):
    served = await serve_config(config())
    page = "http://localhost:5173"
    status, headers, _ = await chat_as_text(http, served, Origin=page)
    assert (status, headers["Access-Control-Allow-Origin"], headers["Vary"]) == (200, page, "Origin")
    async with http.post(served.at("/v1/chat/completions"), json={**CHAT, "stream": True},
                         headers={"Origin": page}) as resp:
        assert resp.status == 200
        assert resp.headers.getall("Access-Control-Allow-Origin") == [page]
        await resp.read()
    async with http.get(served.at("/no/such/route"), headers={"Origin": page}) as resp:
        assert resp.status == 404
        assert resp.headers.getall("Access-Control-Allow-Origin") == [page]


async def test_a_configured_origin_is_let_in_and_its_preflight_answered(serve_config, http):
    served = await serve_config(config(origins=("https://*.example.com",)))
    page = "https://chat.example.com"
    headers = {"Origin": page, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type"}
    async with http.options(served.at("/v1/chat/completions"), headers=headers) as resp:
        assert resp.status == 204
        assert resp.headers["Access-Control-Allow-Origin"] == page
        assert resp.headers["Access-Control-Allow-Headers"] == "content-type"
    status, answer_headers, _ = await chat_as_text(http, served, Origin=page)
    assert (status, answer_headers["Access-Control-Allow-Origin"]) == (200, page)
    status, _, _ = await chat_as_text(http, served, Origin="https://example.com")
    assert status == 403


async def test_a_rebound_host_name_is_refused_on_a_loopback_listener(serve_config, http):
    served = await serve_config(config())
    async with http.get(served.at("/v1/models"), headers={"Host": "evil.test:8080"}) as resp:
        assert resp.status == 403
        assert "the Host evil.test:8080 is not allowed" in (await resp.json())["error"]["message"]
    async with http.get(served.at("/v1/models"), headers={"Host": "localhost:8080"}) as resp:
        assert resp.status == 200


async def test_a_configured_host_is_answered(serve_config, http):
    served = await serve_config(config(hosts=("llm.lan",)))
    async with http.get(served.at("/v1/models"), headers={"Host": "llm.lan:8080"}) as resp:
        assert resp.status == 200
    async with http.get(served.at("/v1/models"), headers={"Host": "other.lan:8080"}) as resp:
        assert resp.status == 403


async def test_a_public_listener_answers_any_host_but_still_checks_origins(serve_config, http):
    served = await serve_config(config(), loopback_listener=False)
    async with http.get(served.at("/v1/models"), headers={"Host": "llm.lan:8080"}) as resp:
        assert resp.status == 200
    page = "http://llm.lan:8080"  # the status page served under that name calls its own origin
    async with http.get(served.at("/v1/models"), headers={"Host": "llm.lan:8080", "Origin": page}) as resp:
        assert (resp.status, resp.headers["Access-Control-Allow-Origin"]) == (200, page)
    async with http.get(served.at("/v1/models"), headers={"Host": "llm.lan:8080", "Origin": FOREIGN}) as resp:
        assert resp.status == 403


async def test_with_api_keys_any_page_may_call_and_the_key_guards_it(serve_config, http):
    served = await serve_config(config(keys=(KEY,)))
    bearer = {"Authorization": f"Bearer {KEY}"}
    status, headers, _ = await chat_as_text(http, served, Origin=FOREIGN)
    assert status == 401  # no key: refused by auth, and the page may read why
    assert headers["Access-Control-Allow-Origin"] == FOREIGN
    status, headers, _ = await chat_as_text(http, served, Origin=FOREIGN, **bearer)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == FOREIGN
    preflight = {"Origin": FOREIGN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    async with http.options(served.at("/v1/chat/completions"), headers=preflight) as resp:
        assert resp.status == 204 and resp.headers["Access-Control-Allow-Origin"] == FOREIGN


async def test_with_api_keys_and_allowed_origins_only_those_pages_may_call(serve_config, http):
    served = await serve_config(config(keys=(KEY,), origins=("https://app.example.com",)))
    bearer = {"Authorization": f"Bearer {KEY}"}
    status, _, _ = await chat_as_text(http, served, Origin=FOREIGN, **bearer)
    assert status == 403  # a key does not let a page in that the config leaves out
    status, _, _ = await chat_as_text(http, served, Origin="https://app.example.com", **bearer)
    assert status == 200


async def test_a_reload_applies_new_origins_to_the_next_request(serve_config, http):
    served = await serve_config(config())
    page = "https://chat.example.com"
    status, _, _ = await chat_as_text(http, served, Origin=page)
    assert status == 403
    served.state.config = config(origins=(page,))
    status, _, _ = await chat_as_text(http, served, Origin=page)
    assert status == 200


async def test_a_websocket_from_a_foreign_page_is_refused_before_the_model_starts(serve_config, http):
    # Websockets have no CORS: the Origin check is all that stands between a page and the model.
    served = await serve_config(config())
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with http.ws_connect(served.at("/v1/realtime?model=m"), origin=FOREIGN):
            pass
    assert refused.value.status == 403
    assert served.router.processes["m"].state is ProcessState.STOPPED
    async with http.ws_connect(served.at("/upstream/m/ws"), origin="http://localhost:3000") as socket:
        assert (await socket.receive_json(timeout=10))["event"] == "hello"
