"""The status page's activity, cancel, machine and playground panels in a real headless Chromium, used as
a person would: click Load, send a chat from the playground, watch its activity row appear with the
upstream's token counts, open its capture, cancel a slow request from its in-flight row.

With `LLMSWAP_UI_ACTIVITY_SCREENSHOT=path` the activity view is saved there, and with
`LLMSWAP_UI_CAPTURE_SCREENSHOT=path` the open capture (the README's docs/ui-activity.png and
docs/ui-capture.png are made that way).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import aiohttp

from llmswap.config.model import ApiKey
from tests.e2e import test_ui_chromium as ui
from tests.e2e.test_ui_chromium import (
    HEIGHT,
    KEY,
    WIDTH,
    WITHIN,
    DevTools,
    button,
    chromium,
    model_state,
    png_size,
)
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import Served, serving

pytestmark = ui.pytestmark  # skipped without Chromium, as the status page's other tests
AUTH = {"Authorization": f"Bearer {KEY}"}


async def screenshot(page: DevTools, folder: Path, name: str, variable: str) -> None:
    shot = base64.b64decode((await page.call("Page.captureScreenshot", format="png"))["data"])
    assert png_size(shot) == (WIDTH, HEIGHT)
    (folder / name).write_bytes(shot)
    if keep := os.environ.get(variable):
        Path(keep).write_bytes(shot)  # noqa: ASYNC240


async def activity_rows(http: aiohttp.ClientSession, served: Served) -> list[dict]:
    async with http.get(served.at("/api/metrics/activity"), headers=AUTH) as response:
        return (await response.json())["data"]


async def test_playground_activity_capture_and_cancel_as_a_person_uses_them(tmp_path: Path) -> None:
    config = exclusive_config(demo_config("m", "--tokens-per-second", "40", aliases=("chat",)),
                              aliases={"chat": "m"}, api_keys=(ApiKey(KEY),))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(config) as served,
        chromium(tmp_path, http) as page,
    ):
        await page.call("Page.enable")
        await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                        mobile=False)
        await page.navigate(served.at(f"/ui#key={KEY}"))
        await page.wait_for("document.body.dataset.connection === 'live'", what="the page to connect")
        await page.wait_for(f"{model_state('m')} === 'stopped'", what="m shown stopped")
        await page.evaluate(f"{button('m', 'load')}.click()")
        await page.wait_for(f"{model_state('m')} === 'ready'", what="m shown ready after Load")

        # The playground streams a chat; its activity row appears with what the upstream reported.
        await page.wait_for("document.getElementById('pg-model').value === 'm'", what="m in the playground")
        await page.evaluate("document.getElementById('pg-send').click()")
        await page.wait_for("document.getElementById('playground').dataset.state === 'done'",
                            what="the playground's answer to finish")
        assert (await page.evaluate("document.getElementById('pg-output').textContent")).strip()
        await page.wait_for("document.querySelectorAll('#activity tr[data-activity]').length === 1",
                            what="the chat's activity row")
        [row] = await activity_rows(http, served)
        cell = "document.querySelector('#activity tr[data-activity] td[data-field=\"{}\"]').textContent"
        assert await page.evaluate(cell.format("output")) == str(row["tokens"]["output_tokens"])
        assert await page.evaluate(cell.format("input")) == str(row["tokens"]["input_tokens"])
        assert row["tokens"]["tokens_per_second"] > 0
        await page.wait_for("document.querySelector('#machine [data-gauge=\"cpu\"]') !== null",
                            what="the CPU gauge")

        await page.evaluate("document.querySelector('#activity tr[data-activity] button').click()")
        await page.wait_for("document.getElementById('capture').open", what="the capture to open")
        request_body = await page.evaluate("document.querySelector('[data-part=\"req-body\"]').textContent")
        assert json.loads(request_body)["messages"][0]["content"] == "Say hello in five words."
        assert "[REDACTED]" not in request_body and KEY not in await page.evaluate("document.body.innerText")
        await screenshot(page, tmp_path, "capture.png", "LLMSWAP_UI_CAPTURE_SCREENSHOT")
        await page.evaluate("document.getElementById('capture-close').click()")

        # A slow stream shows in flight; its Cancel button ends it cleanly for the client.
        slow = {"model": "m", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 5000,
                "stream": True}
        async with http.post(served.at("/v1/chat/completions"), json=slow, headers=AUTH) as streaming:
            await streaming.content.readline()
            await page.wait_for("document.querySelector('#inflight button[data-action=\"cancel\"]') !== null",
                                what="the slow request in flight with a Cancel button")
            await page.evaluate("document.getElementById('inflight').closest('section').scrollIntoView()")
            await screenshot(page, tmp_path, "activity.png", "LLMSWAP_UI_ACTIVITY_SCREENSHOT")
            await page.evaluate("document.querySelector('#inflight button[data-action=\"cancel\"]').click()")
            rest = (await asyncio.wait_for(streaming.content.read(), WITHIN)).decode()
        assert "cancelled" in rest and rest.rstrip().endswith("data: [DONE]")
        await page.wait_for("document.querySelectorAll('#inflight tr[data-inflight]').length === 0",
                            what="the cancelled request to leave the in-flight list")
        await page.wait_for("document.querySelector('#activity tr[data-status=\"502\"]') !== null",
                            what="the cancelled request's activity row")
        assert served.router.snapshot().in_flight.get("m", 0) == 0
