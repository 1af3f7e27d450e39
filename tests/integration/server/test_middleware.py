"""The middlewares through real HTTP: one access-log line per request, and errors (413, a bug in a route,
a failure mid-stream) shaped or cut, never a traceback. Origins and CORS: test_guard.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from llmswap.config.model import ApiKey, Config
from llmswap.process.state import ProcessState
from llmswap.router import build_router
from llmswap.server.http import guard, middleware
from llmswap.server.state import STATE, ServerState
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually

HOST = "127.0.0.1"


async def test_one_access_line_per_request_naming_the_model(serve_config, http, caplog):
    served = await serve_config(exclusive_config(demo_config("m")))
    with caplog.at_level(logging.INFO, logger="llmswap.access"):
        async with http.get(served.at("/v1/models?secret=hide-me")) as resp:
            assert resp.status == 200
        async with http.get(served.at("/upstream/m/health")) as resp:
            assert resp.status == 200
        async with http.get(served.at("/nope")) as resp:
            assert resp.status == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "llmswap.access"]
    assert len(lines) == 3
    assert '"GET /v1/models" 200 ' in lines[0] and "hide-me" not in lines[0]
    # Through /upstream as through the inference routes: where its time went, the model's start first.
    assert '"GET /upstream/m/health" 200 ' in lines[1] and " model=m queue=" in lines[1]
    load = float(lines[1].split(" load=")[1].split("ms")[0])
    queue = float(lines[1].split(" queue=")[1].split("ms")[0])
    assert load > queue and " ttfb=" in lines[1]
    assert '"GET /nope" 404 ' in lines[2]


async def test_the_status_pages_own_polling_is_logged_at_debug_unless_it_fails(serve_config, http, caplog):
    served = await serve_config(exclusive_config(demo_config("m")))
    page = {"Referer": served.at("/ui")}
    with caplog.at_level(logging.DEBUG, logger="llmswap.access"):
        async with http.get(served.at("/running"), headers=page) as resp:
            assert resp.status == 200
        async with http.get(served.at("/api/nope"), headers=page) as resp:
            assert resp.status == 404
        async with http.get(served.at("/running")) as resp:  # asked by someone else: a line as always
            assert resp.status == 200
    levels = [(r.levelno, r.getMessage().split('"')[1]) for r in caplog.records if r.name == "llmswap.access"]
    assert levels == [(logging.DEBUG, "GET /running"), (logging.INFO, "GET /api/nope"),
                      (logging.INFO, "GET /running")]


async def test_an_inference_access_line_says_where_its_time_went(serve_config, http, caplog):
    served = await serve_config(exclusive_config(demo_config("m", "--startup-delay", "0.3")))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with caplog.at_level(logging.INFO, logger="llmswap.access"):
        async with http.post(served.at("/v1/chat/completions"), json=body) as resp:
            assert resp.status == 200
            await resp.read()
    line = next(r.getMessage() for r in caplog.records if r.name == "llmswap.access")
    fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
    assert set(fields) == {"model", "queue", "load", "phases", "ttfb", "decode", "cached"}
    assert fields["cached"] == "0"  # the demo reports llama.cpp timings: none of its prompt was cached
    assert fields["phases"].startswith("start:")  # nothing to stop, nothing in flight: its start alone
    load = float(fields["load"].removesuffix("ms"))
    assert load >= 300.0, "the wait was mostly the model's load (its /health answers 503 for 0.3 s)"
    assert float(fields["ttfb"].removesuffix("ms")) >= load
    assert served.router.processes["m"].state is ProcessState.READY


async def test_body_over_the_limit_is_413_in_the_envelope(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m"), max_request_body=1024))
    body = b'{"model": "m", "padding": "' + b"x" * 4096 + b'"}'
    async with http.post(served.at("/upstream/m/v1/chat/completions"), data=body,
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 413
        error = (await resp.json())["error"]
    assert error["message"] == ("the request body is larger than the 1024 bytes llmswap accepts; "
                                "raise maxRequestBodySize in the config to allow it")
    assert error["code"] == "request_too_large"
    # Refused before it queued: the model was never started for it.
    assert served.router.processes["m"].state is ProcessState.STOPPED


# A bare application with the same middleware, for routes the real app does not have: one that fails.


async def broken(request: web.Request) -> web.Response:
    raise RuntimeError("a bug in a route")


async def broken_mid_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"first part\n")
    raise RuntimeError("a bug after the answer started")


async def drip(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(500):
        await response.write(b"tick\n")
        await asyncio.sleep(0.02)
    return response


async def reads_the_body(request: web.Request) -> web.Response:
    return web.Response(text=f"{len(await request.read())} bytes")


async def refuses(request: web.Request) -> web.Response:
    raise web.HTTPBadRequest(text="the widget field must be a number")


async def moves(request: web.Request) -> web.Response:
    raise web.HTTPFound("/elsewhere")


async def doubled_cors(request: web.Request) -> web.Response:
    headers = CIMultiDict([("Access-Control-Allow-Origin", "https://a.example"),
                           ("Access-Control-Allow-Origin", "*")])
    return web.Response(text="ok", headers=headers)


@pytest.fixture
async def bare_app() -> AsyncIterator[str]:
    app = web.Application(middlewares=[middleware.gate], client_max_size=2048)
    app[STATE] = ServerState(config=Config(), router=build_router(Config()))
    middleware.setup(app)
    guard.setup(app)
    app.router.add_get("/broken", broken)
    app.router.add_get("/doubled-cors", doubled_cors)
    app.router.add_get("/broken-mid-stream", broken_mid_stream)
    app.router.add_get("/refuses", refuses)
    app.router.add_get("/drip", drip)
    app.router.add_post("/reads-the-body", reads_the_body)
    app.router.add_get("/moves", moves)
    runner = web.AppRunner(app, shutdown_timeout=1.0, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    try:
        yield f"http://{HOST}:{port}"
    finally:
        await runner.cleanup()


async def test_a_bug_in_a_route_is_a_500_envelope_and_a_logged_traceback(bare_app, http, caplog):
    with caplog.at_level(logging.ERROR, logger="llmswap.server"):
        async with http.get(f"{bare_app}/broken", headers={"Accept": "text/html"}) as resp:
            assert resp.status == 500
            text = await resp.text()
    assert "Traceback" not in text and "a bug in a route" not in text
    assert "internal error while handling GET /broken" in text
    [record] = [r for r in caplog.records if r.name == "llmswap.server"]
    assert record.exc_info is not None and "a bug in a route" in str(record.exc_info[1])


async def test_a_failure_after_the_answer_started_cuts_the_connection(bare_app, http, caplog):
    with caplog.at_level(logging.ERROR, logger="llmswap.server"):
        async with http.get(f"{bare_app}/broken-mid-stream") as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
    assert any("a bug after the answer started" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


async def test_aiohttp_body_limit_is_a_413_envelope(bare_app, http):
    async with http.post(f"{bare_app}/reads-the-body", data=b"x" * 1000) as resp:
        assert await resp.text() == "1000 bytes"
    async with http.post(f"{bare_app}/reads-the-body", data=b"x" * 5000) as resp:
        assert resp.status == 413
        error = (await resp.json())["error"]
    assert error["message"] == ("the request body is larger than the 2048 bytes llmswap accepts; "
                                "raise maxRequestBodySize in the config to allow it")


async def test_http_errors_keep_their_message_and_redirects_pass(bare_app, http):
    async with http.get(f"{bare_app}/refuses") as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["message"] == "the widget field must be a number" and error["code"] == "bad_request"
    async with http.get(f"{bare_app}/moves", allow_redirects=False) as resp:
        assert resp.status == 302 and resp.headers["Location"] == "/elsewhere"


async def test_a_client_leaving_mid_stream_is_not_an_error(bare_app, caplog):
    with caplog.at_level(logging.DEBUG, logger="llmswap"):
        async with aiohttp.ClientSession() as session, session.get(f"{bare_app}/drip") as resp:
            assert await resp.content.readline() == b"tick\n"

        async def logged() -> bool:
            return any(r.name == "llmswap.access" for r in caplog.records)

        await eventually(logged, what="the access line of the abandoned request")
    [line] = [r.getMessage() for r in caplog.records if r.name == "llmswap.access"]
    assert '"GET /drip" client gone' in line
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_observers_see_each_answer_by_route_pattern_model_and_status(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=(ApiKey("sk-right"),)))
    seen: list[middleware.Answered] = []
    served.app[middleware.REQUEST_OBSERVERS].append(seen.append)
    right = {"Authorization": "Bearer sk-right"}
    async with http.get(served.at("/upstream/m/health"), headers=right) as resp:
        assert resp.status == 200
    async with http.get(served.at("/upstream/m/health")) as resp:
        assert resp.status == 401  # refused by auth, inside the same middleware: still reported
    async with http.get(served.at("/nope"), headers={**right, "Host": "evil.example"}) as resp:
        assert resp.status == 403  # refused by the guard before auth looked
    async with http.get(served.at("/nope"), headers=right) as resp:
        assert resp.status == 404

    # Reported before the answer goes out: nothing to wait for.
    assert [(a.method, a.path, a.route, a.model, a.status) for a in seen] == [
        ("GET", "/upstream/m/health", "/upstream/{tail}", "m", 200),
        ("GET", "/upstream/m/health", "/upstream/{tail}", "", 401),
        ("GET", "/nope", "unmatched", "", 403),
        ("GET", "/nope", "unmatched", "", 404),
    ]
    assert all(a.remote == HOST and a.seconds >= 0 for a in seen)


async def test_a_route_listing_two_allowed_origins_sends_one_and_an_allowed_page_its_own(bare_app, http):
    async with http.get(f"{bare_app}/doubled-cors") as resp:
        # Clients reject a list: the first stays.
        assert resp.headers.getall("Access-Control-Allow-Origin") == ["https://a.example"]
    page = "http://localhost:5173"
    async with http.get(f"{bare_app}/doubled-cors", headers={"Origin": page}) as resp:
        assert resp.headers.getall("Access-Control-Allow-Origin") == [page]
        assert resp.headers["Vary"] == "Origin"
