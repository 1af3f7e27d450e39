"""What a web page on another origin can do to a local llmswap, in a real headless Chromium.

Chromium resolves `evil.test` and `good.test` to 127.0.0.1 (`--host-resolver-rules`), so a small page
server on loopback is, to the browser, two foreign sites. The evil page tries what any site its user opens
could: a text/plain POST (no preflight needed), an unload by fetch and by `<img>`, and, once the name is
rebound, reading llmswap under its own name. The good page's origin is in `cors.allowedOrigins`: it reads
llmswap's answers, with and without a preflight.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmswap.config.origins import parse_origin_pattern
from llmswap.process.state import ProcessState
from llmswap.server.http.middleware import REQUEST_OBSERVERS, Answered
from tests.e2e.test_ui_chromium import CHROMIUM, WITHIN, DevTools, chromium
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import Served, serving

pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(CHROMIUM is None and os.environ.get("LLMSWAP_REQUIRE_E2E") != "1",
                       reason="no chromium binary (Debian: apt-get install chromium)"),
]

RESOLVER = "--host-resolver-rules=MAP evil.test 127.0.0.1, MAP good.test 127.0.0.1"
PAGE = "<!doctype html><title>a site</title><p>some site the user opened</p>"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}

# Each attempt reports what the page could see: "read <status> <body>" or "blocked <error name>".
ATTEMPTS = """
async function attempt(url, init) {
  try {
    const response = await fetch(url, init);
    return "read " + response.status + " " + await response.text();
  } catch (error) {
    return "blocked " + error.name;
  }
}
function image(url) {
  return new Promise(resolve => {
    const img = new Image();
    img.onload = () => resolve("loaded");
    img.onerror = () => resolve("error");
    img.src = url;
  });
}
"""


@pytest.fixture
async def sites() -> AsyncIterator[int]:
    """The page server both foreign names resolve to; its port."""
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield next(a[1] for a in runner.addresses if isinstance(a, tuple))
    finally:
        await runner.cleanup()


def watch_statuses(served: Served) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request llmswap answered from now on."""
    seen: list[tuple[str, str, int]] = []

    def observe(answered: Answered) -> None:
        seen.append((answered.method, answered.path, answered.status))

    served.app[REQUEST_OBSERVERS].append(observe)
    return seen


async def run_in_page(page: DevTools, script: str) -> Any:
    result = await page.call("Runtime.evaluate", expression=f"(async () => {{ {ATTEMPTS} {script} }})()",
                             awaitPromise=True, returnByValue=True)
    if "exceptionDetails" in result:
        raise AssertionError(f"the page script raised: {result['exceptionDetails']}")
    return result["result"].get("value")


async def arrived(page: DevTools, url: str) -> None:
    """Wait until the page shows `url`, loaded (evaluating fails while the old document goes away)."""
    async def there() -> bool:
        try:
            return bool(await page.evaluate(
                f"location.href === {json.dumps(url)} && document.readyState === 'complete'"))
        except AssertionError:
            return False

    await eventually(there, within=WITHIN, interval=0.05, what=f"the page to open {url}")


def config() -> Any:
    return exclusive_config(demo_config("m"), demo_config("other"),
                            allowed_origins=(parse_origin_pattern("http://good.test:*"),))


async def test_a_foreign_page_can_neither_read_nor_unload_nor_rebind(tmp_path: Path, sites: int) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(config()) as served,
        chromium(tmp_path, http, RESOLVER) as page,
    ):
        async with http.post(served.at("/v1/chat/completions"), json={"model": "m", **CHAT}) as response:
            assert response.status == 200  # an SDK-like client, no Origin: loads m as ever
        statuses = watch_statuses(served)
        await page.call("Page.enable")
        await page.navigate(f"http://evil.test:{sites}/")
        api = served.url
        found = await run_in_page(page, f"""
            const text = {{method: "POST", headers: {{"Content-Type": "text/plain"}}}};
            return {{
              chat: await attempt("{api}/v1/chat/completions",
                                  {{...text, body: {json.dumps(json.dumps({"model": "other", **CHAT}))}}}),
              unload: await attempt("{api}/api/models/unload", text),
              img: await image("{api}/unload"),
            }};""")
        assert found == {"chat": "blocked TypeError", "unload": "blocked TypeError", "img": "error"}
        # Each reached llmswap and was refused there, before anything happened.
        assert ("POST", "/v1/chat/completions", 403) in statuses
        assert ("POST", "/api/models/unload", 403) in statuses
        assert ("GET", "/unload", 403) in statuses
        assert served.router.processes["m"].state is ProcessState.READY
        assert served.router.processes["other"].state is ProcessState.STOPPED

        # A link the page follows by itself: a cross-site navigation, no Origin either.
        await page.evaluate(f"(() => {{ const a = document.createElement('a'); a.href = '{api}/unload'; "
                            "document.body.append(a); a.click(); })()")
        await arrived(page, f"{api}/unload")
        shown = await page.evaluate("document.body.innerText")
        assert "a page on another site may not drive llmswap" in shown
        assert statuses.count(("GET", "/unload", 403)) == 2
        assert served.router.processes["m"].state is ProcessState.READY

        # DNS rebinding: evil.test now "is" llmswap, so its page talks to llmswap same-origin.
        await page.navigate(f"http://evil.test:{served.url.rsplit(':', 1)[1]}/ui")
        assert "is not allowed" in await page.evaluate("document.body.innerText")
        rebound = await run_in_page(page, 'return await attempt("/v1/models", {});')
        assert rebound.startswith("read 403 ") and '"code": "forbidden"' in rebound
        assert served.router.processes["m"].state is ProcessState.READY


async def test_a_page_on_an_allowed_origin_reads_the_answers(tmp_path: Path, sites: int) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(config()) as served,
        chromium(tmp_path, http, RESOLVER) as page,
    ):
        await page.call("Page.enable")
        await page.navigate(f"http://good.test:{sites}/")
        body = json.dumps(json.dumps({"model": "m", **CHAT}))
        found = await run_in_page(page, f"""
            return {{
              simple: await attempt("{served.url}/v1/chat/completions",
                                    {{method: "POST", headers: {{"Content-Type": "text/plain"}},
                                      body: {body}}}),
              preflighted: await attempt("{served.url}/v1/chat/completions",
                                         {{method: "POST", headers: {{"Content-Type": "application/json"}},
                                           body: {body}}}),
            }};""")
        for how in ("simple", "preflighted"):
            status, _, text = found[how].removeprefix("read ").partition(" ")
            assert status == "200", found
            assert "demo m says" in json.loads(text)["choices"][0]["message"]["content"]
