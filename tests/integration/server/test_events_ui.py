"""The status page's routes through real HTTP: served from the package, open without a key, never cached
stale. (What the page does in a browser is tests/e2e/test_ui_chromium.py.)"""

from __future__ import annotations

import aiohttp

from llmswap.config.model import ApiKey
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import ServeConfig


async def test_the_page_is_served_at_every_ui_path_even_with_keys_set(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=(ApiKey("sk-ui-1"),)))
    bodies = []
    for path in ("/ui", "/ui/", "/ui/models"):
        async with http.get(served.at(path)) as response:
            assert response.status == 200, path
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
            assert response.headers["Cache-Control"] == "no-cache"
            bodies.append(await response.text())
    assert bodies[0] == bodies[1] == bodies[2]
    page = bodies[0]
    assert page.startswith("<!doctype html>")
    # The page reads the one event stream through fetch with the key as a Bearer header (EventSource
    # cannot send one); its log tail comes from that stream's logData frames.
    assert 'fetch(path, { headers: authHeaders()' in page and 'follow("/api/events"' in page
    assert "/logs/stream" not in page


async def test_the_root_and_the_log_page_lead_to_the_ui(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")))
    async with http.get(served.at("/")) as response:
        assert response.status == 200 and str(response.url).endswith("/ui")
        assert "<title>llmswap</title>" in await response.text()
    async with http.get(served.at("/logs"), headers={"Accept": "text/html"}) as response:
        assert response.status == 200 and str(response.url).endswith("/ui/")
