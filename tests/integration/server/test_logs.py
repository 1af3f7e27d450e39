"""The log routes through real HTTP: `/logs` history, and `/logs/stream[/<id>]` history then live lines,
ending when the client leaves."""

from __future__ import annotations

import asyncio

import aiohttp

from llmswap.server.observe.logs import LIVE_TAILS
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import serving

WITHIN = 15.0


async def read_until(resp: aiohttp.ClientResponse, wanted: str, seen: list[str]) -> None:
    """Read lines into `seen` until one contains `wanted`."""
    while True:
        raw = await resp.content.readline()
        assert raw, f"the stream ended before {wanted!r}; got {seen}"
        line = raw.decode().rstrip("\n")
        seen.append(line)
        if wanted in line:
            return


async def test_logs_returns_proxy_and_upstream_history_as_text(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    served.state.proxy_log.append("proxy says hello")
    async with served.router.acquire("m"):
        pass  # the demo's start-up output lands in the upstream ring
    async with http.get(served.at("/logs")) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        text = await resp.text()
    lines = text.splitlines()
    assert lines[0] == "proxy says hello"
    assert any("llmswap-demo: listening on" in line for line in lines[1:])


async def test_logs_sends_browsers_to_the_ui(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    browser = {"Accept": "text/html,*/*"}
    async with http.get(served.at("/logs"), headers=browser, allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"] == "/ui/"


async def test_stream_sends_history_then_live_lines(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    served.state.proxy_log.append("before the client came")
    seen: list[str] = []
    async with http.get(served.at("/logs/stream/proxy")) as resp:
        assert resp.status == 200
        assert resp.headers["X-Accel-Buffering"] == "no"
        await read_until(resp, "before the client came", seen)
        served.state.proxy_log.append("while the client watches")
        await read_until(resp, "while the client watches", seen)
    assert seen == ["before the client came", "while the client watches"]


async def test_stream_without_history(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    served.state.proxy_log.append("old news")
    seen: list[str] = []
    async with http.get(served.at("/logs/stream/proxy?no-history")) as resp:
        await eventually(lambda: _subscribed(served), what="the stream subscribing")
        served.state.proxy_log.append("fresh")
        await read_until(resp, "fresh", seen)
    assert seen == ["fresh"]


async def test_combined_stream_carries_proxy_and_upstream_lines(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    seen: list[str] = []
    async with http.get(served.at("/logs/stream?no-history")) as resp:
        await eventually(lambda: _subscribed(served), what="the stream subscribing")
        served.state.proxy_log.append("from the proxy")
        await read_until(resp, "from the proxy", seen)
        served.state.upstream_log.append("from an upstream")
        await read_until(resp, "from an upstream", seen)


async def test_model_stream_shows_that_models_output_live(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m", aliases=("alias-m",)),
                                                 aliases={"alias-m": "m"}))
    seen: list[str] = []
    async with http.get(served.at("/logs/stream/alias-m")) as resp:
        assert resp.status == 200
        await eventually(lambda: _subscribed(served), what="the stream subscribing")
        async with served.router.acquire("m"):
            pass
        await read_until(resp, "llmswap-demo: listening on", seen)
    served.state.proxy_log.append("proxy lines are not in a model's stream")
    assert all("proxy lines" not in line for line in seen)


async def test_unknown_log_id_is_400(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/logs/stream/nope")) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["message"] == "invalid logger. Use 'proxy', 'upstream' or a model's ID"


async def test_stream_ends_when_the_client_leaves(serve_config, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    proxy_ring = served.state.proxy_log
    async with http.get(served.at("/logs/stream/proxy?no-history")) as resp:
        assert resp.status == 200
        await eventually(lambda: _subscribed(served), what="the stream subscribing")
        resp.close()

    async def unsubscribed() -> bool:
        return not served.app[LIVE_TAILS] and not proxy_ring._subscribers

    # Nothing is written to the proxy log meanwhile: the handler must notice the departure by itself.
    await eventually(unsubscribed, within=WITHIN, what="the stream noticing the client left")


async def _subscribed(served) -> bool:
    return bool(served.app[LIVE_TAILS])


async def test_shutdown_ends_open_streams_cleanly(http):
    async with serving(exclusive_config(demo_config("m"))) as served:
        resp = await http.get(served.at("/logs/stream/proxy?no-history"))
        await eventually(lambda: _subscribed(served), what="the stream subscribing")
    # The server is gone; the stream was finished properly (final chunk), not cut off.
    async with resp:
        assert await asyncio.wait_for(resp.content.read(), WITHIN) == b""
