"""The status page's views in a real headless Chromium, with real data behind them: the API key asked in
the page, the activity filters and stats, the log chooser and filter, the performance charts (their points
and the swap timeline), the hardware report and a multi-turn playground chat.

With `LLMSWAP_UI_VIEWS_SCREENSHOT=path` the performance view is saved there (docs/ui-performance.png is
made that way).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path

import aiohttp

from llmswap.config.model import ApiKey, PeerConfig
from tests.e2e import test_ui_chromium as ui
from tests.e2e.test_ui_chromium import HEIGHT, KEY, WIDTH, WITHIN, DevTools, chromium
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import Served, serving

pytestmark = ui.pytestmark
AUTH = {"Authorization": f"Bearer {KEY}"}


async def chat(http: aiohttp.ClientSession, served: Served, model: str, **extra: object) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}
    async with http.post(served.at("/v1/chat/completions"), json=body, headers=AUTH) as response:
        await response.read()
        return response.status


def n(selector: str) -> str:
    """The page expression counting what `selector` finds."""
    return f"document.querySelectorAll({selector!r}).length"


async def count(page: DevTools, selector: str) -> int:
    return int(await page.evaluate(n(selector)))


async def choose(page: DevTools, select: str, value: str) -> None:
    await page.evaluate(f"(() => {{ const s = document.getElementById({select!r}); s.value = {value!r}; "
                        "s.dispatchEvent(new Event('change')); })()")


async def test_every_view_draws_what_the_api_holds(tmp_path: Path) -> None:
    config = exclusive_config(demo_config("alpha", "--log-requests"), demo_config("beta", "--log-requests"),
                              api_keys=(ApiKey(KEY),))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    async with aiohttp.ClientSession(timeout=timeout) as http, serving(config) as served, \
            chromium(tmp_path, http) as page:
        # Real data first: two swaps, a stream, and a request the model refuses.
        assert await chat(http, served, "alpha") == 200
        assert await chat(http, served, "beta") == 200
        assert await chat(http, served, "alpha", stream=True) == 200
        assert await chat(http, served, "alpha", max_tokens="many") == 400

        await page.call("Page.enable")
        await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                        mobile=False)
        await page.navigate(served.at("/ui"))  # no key in the URL: the page asks in a form, not a prompt()
        await page.wait_for("document.getElementById('key-dialog').open", what="the key form")
        await page.evaluate(f"document.getElementById('key-input').value = {KEY!r}")
        await page.evaluate("document.getElementById('key-use').click()")
        await page.wait_for("document.body.dataset.connection === 'live'", what="the page to connect")
        assert await page.evaluate("sessionStorage.getItem('llmswap.apiKey')") == KEY
        # A request sent without the key and refused only after it was given (a slow answer, as in a loaded
        # CI run, where the one-shot hardware panel then waited on a second form forever): retried with the
        # key, not asked for again.
        await page.evaluate("window.lateRefusal = 'pending'; "
                            "needKey('').then(() => { window.lateRefusal = 'retried'; })")
        await page.wait_for("window.lateRefusal === 'retried'", what="a late 401 to be retried with the key")
        assert not await page.evaluate("document.getElementById('key-dialog').open")

        # Activity: the filters narrow the rows, the stats follow them.
        await page.wait_for("document.querySelectorAll('#activity tr[data-activity]').length === 4",
                            what="four activity rows")
        await choose(page, "act-model", "beta")
        await page.wait_for("document.querySelectorAll('#activity tr[data-activity]').length === 1",
                            what="beta's one row")
        await choose(page, "act-model", "")
        await choose(page, "act-status", "client")
        await page.wait_for(n("#activity tr[data-activity]") + " === 1 && "
                            + n("#activity tr[data-status='400']") + " === 1",
                            what="the refused request alone")
        assert await page.evaluate("document.querySelector('#act-stats b').textContent") == "1"
        await choose(page, "act-status", "")

        # Logs: one model's own output, then filtered.
        await page.wait_for(n("#log-source option[value='alpha']") + " === 1",
                            what="alpha among the log sources")
        await choose(page, "log-source", "alpha")
        log_text = "document.getElementById('log').textContent"
        await page.wait_for(f"{log_text}.includes('as model alpha') && {log_text}.includes('request POST') "
                            f"&& !{log_text}.includes('as model beta')", what="alpha's own log, alone")
        await page.evaluate("(() => { const f = document.getElementById('log-filter'); "
                            "f.value = 'listening'; f.dispatchEvent(new Event('input')); })()")
        shown = await page.evaluate("[...document.querySelectorAll('#log span')].map(s => s.textContent)")
        assert shown and all("listening" in line for line in shown)

        # Performance: points for both models, the swap timeline, memory.
        await page.wait_for(n("#chart-requests circle[data-model='alpha']") + " > 0 && "
                            + n("#chart-requests circle[data-model='beta']") + " > 0",
                            what="request points for both models")
        values = await page.evaluate("[...document.querySelectorAll('#chart-requests circle')]"
                                     ".map(c => Number(c.dataset.value))")
        assert all(value > 0 for value in values)
        assert await count(page, "#chart-tokens circle") > 0
        await page.wait_for(n("#chart-swaps rect[data-model='alpha']") + " === 2",
                            what="alpha loaded twice on the timeline")
        assert await count(page, "#chart-swaps rect[data-model='beta']") == 1
        # Each swap is also drawn as its phases: three starts, and the two stops that made room.
        assert await count(page, "#chart-swaps rect.phase[data-phase='start']") == 3
        assert await count(page, "#chart-swaps rect.phase[data-phase='stop']") == 2
        await page.wait_for(n("#chart-memory circle") + " > 0", what="memory points")

        # Hardware: in words, not a dump of the report's keys.
        await page.wait_for(n("#hardware tr[data-key]") + " > 0", what="the hardware rows")
        labels = await page.evaluate("[...document.querySelectorAll('#hardware tr td:first-child')]"
                                     ".map(td => td.textContent)")
        assert labels[:5] == ["CPU", "Memory", "System", "Architecture", "Runs in"]

        # Playground: it offers the model that is loaded (asking it swaps nothing), not the first by name;
        # then two turns of one conversation.
        assert await chat(http, served, "beta") == 200
        await page.wait_for("document.getElementById('pg-model').value === 'beta'", what="the loaded model")
        for message in ("first question", "second question"):
            await page.evaluate(f"document.getElementById('pg-prompt').value = {message!r}")
            await page.evaluate("document.getElementById('pg-send').click()")
            await page.wait_for("document.getElementById('playground').dataset.state === 'done'",
                                what="the answer")
            await page.evaluate("document.getElementById('playground').dataset.state = ''")
        assert await count(page, "#pg-transcript .turn") == 4
        async with http.get(served.at("/api/metrics/activity?limit=1"), headers=AUTH) as response:
            newest = (await response.json())["data"][0]
        async with http.get(served.at(f"/api/captures/{newest['id']}"), headers=AUTH) as response:
            sent = json.loads(base64.b64decode((await response.json())["req_body"]))
        assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]  # the history went too
        assert sent["messages"][2]["content"] == "second question"

        # At 1024 px the activity table fits (no sideways scroll), the playground's placeholders show whole.
        await page.call("Emulation.setDeviceMetricsOverride", width=1024, height=HEIGHT, deviceScaleFactor=1,
                        mobile=False)
        await page.wait_for("(() => { const s = document.querySelector('#activity').closest('.scroll'); "
                            "return s.scrollWidth <= s.clientWidth; })()", what="the activity table to fit")
        room = await page.evaluate(
            "['pg-temp', 'pg-max'].map(id => { const input = document.getElementById(id); "
            "const style = getComputedStyle(input); "
            "const pen = document.createElement('canvas').getContext('2d'); "
            "pen.font = style.font; return input.clientWidth - parseFloat(style.paddingLeft) "
            "- parseFloat(style.paddingRight) - pen.measureText(input.placeholder).width; })")
        assert all(left >= 0 for left in room), room
        await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                        mobile=False)

        await page.evaluate("document.querySelector('.charts').closest('section').scrollIntoView()")
        shot = base64.b64decode((await page.call("Page.captureScreenshot", format="png"))["data"])
        (tmp_path / "performance.png").write_bytes(shot)
        if keep := os.environ.get("LLMSWAP_UI_VIEWS_SCREENSHOT"):
            Path(keep).write_bytes(shot)  # noqa: ASYNC240


async def test_the_hosts_view_lists_this_host_and_its_discovered_peer(tmp_path: Path) -> None:
    from tests.helpers.cli import demo_model, running_llmswap, write_config

    preload = {"on_startup": {"preload": ["m"]}}
    async with running_llmswap(write_config(tmp_path / "b.yaml", {"m": demo_model("m")}, hooks=preload)) as b:
        await b.wait_for_output("preload: m ready")
        config = dataclasses.replace(exclusive_config(demo_config("m")),
                                     peers={"b": PeerConfig(id="b", proxy=b.url, models=(), discover=True)})
        timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
        async with aiohttp.ClientSession(timeout=timeout) as http, serving(config) as served, \
                chromium(tmp_path, http) as page:
            await page.call("Page.enable")
            await page.navigate(served.at("/ui"))
            await page.wait_for(n("#hosts tr[data-host='b'][data-fresh='true']") + " === 1",
                                what="the peer b, live, in the hosts view")
            assert not await page.evaluate("document.getElementById('hosts-section').hidden")
            cells = await page.evaluate("[...document.querySelectorAll('#hosts tr[data-host=\"b\"] td')]"
                                        ".map(td => td.textContent)")
            assert cells[0].startswith("b") and cells[1] == "live" and cells[2] == "m"


async def test_the_hosts_view_lists_the_hosts_of_a_shared_task_queue(tmp_path: Path) -> None:
    from llmswap.config.model import TasksConfig, TaskTypeConfig
    from llmswap.tasks.queue import shared
    from llmswap.tasks.queue.sql import PostgresDb
    from tests.helpers.postgres import require_postgres, running_cluster

    with running_cluster(require_postgres()) as cluster:
        url = cluster.fresh_database()
        database = PostgresDb(url)
        tasks = TasksConfig(db=url, host="box1", lease_seconds=3,
                            types={"letters": TaskTypeConfig(name="letters", model="m")})
        config = exclusive_config(demo_config("m"), tasks=tasks)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http, serving(config) as served, \
                    chromium(tmp_path, http) as page:
                # A second host, gone quiet: registered, its heartbeat older than the lease by now.
                shared.register(database, name="box0", instance="old", types=["research"], models={},
                                lease_seconds=3)
                await page.call("Page.enable")
                await page.navigate(served.at("/ui"))
                await page.wait_for(n("#queue-hosts-list tr[data-queue-host='box1'][data-live='true']")
                                    + " === 1", what="this host, live, among the task queue's hosts")
                await page.wait_for(n("#queue-hosts-list tr[data-queue-host='box0'][data-live='false']")
                                    + " === 1", what="the quiet host shown gone", within=20)
                assert not await page.evaluate("document.getElementById('hosts-section').hidden")
                cells = await page.evaluate(
                    "[...document.querySelectorAll('#queue-hosts-list tr[data-queue-host=\"box1\"] td')]"
                    ".map(td => td.textContent)")
                assert cells[0] == "box1 (this host)" and cells[1] == "live" and "letters" in cells[3]
        finally:
            database.close()
