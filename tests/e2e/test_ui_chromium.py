"""The status page in a real headless Chromium, driven over the DevTools protocol.

The test starts Debian's `chromium` itself (skipped when there is none), opens `/ui` on a server with an
API key (given in the URL fragment, as a user would), sends requests, and watches the page show a model
going from stopped to ready, the swap, and the log tail. It saves a screenshot and checks it is a PNG; with
`LLMSWAP_UI_SCREENSHOT=path` set it also writes it there (the README's docs/ui.png is made that way).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import ApiKey, Config, ModelConfig, RouterConfig, RoutingConfig, VramSettings
from llmswap.machine import FakeReader, GiB
from llmswap.process.logring import LogRing
from llmswap.process.state import ProcessState
from llmswap.router import build_router
from llmswap.server.observe.logsetup import ProxyFormatter
from llmswap.server.state import RingHandler
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import eventually
from tests.integration.server.conftest import Served, serving

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name)) is not None), None)
# Skipped where there is no Chromium, except in CI (LLMSWAP_REQUIRE_E2E=1), which must not pass by skipping.
_REQUIRED = os.environ.get("LLMSWAP_REQUIRE_E2E") == "1"
pytestmark = [
    pytest.mark.chromium,
    pytest.mark.skipif(CHROMIUM is None and not _REQUIRED,
                       reason="no chromium binary (Debian: apt-get install chromium)"),
]

KEY = "sk-ui-0123456789"
WITHIN = 30.0  # a cold Chromium on a busy two-core machine takes a while
WIDTH, HEIGHT = 1280, 820
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class DevTools:
    """A minimal DevTools-protocol client for one page: numbered calls, their answers matched by id."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            if message.type is not aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if "id" in data:
                waiters = [self._answers.pop(data["id"])] if data["id"] in self._answers else []
            else:  # an event, e.g. Page.loadEventFired
                waiters = self._events.pop(data.get("method", ""), [])
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(data)
        pending = [*self._answers.values(), *itertools.chain.from_iterable(self._events.values())]
        for waiter in pending:
            if not waiter.done():
                waiter.set_exception(ConnectionError("the DevTools connection closed"))

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._answers[call_id] = answer
        await self.socket.send_json({"id": call_id, "method": method, "params": params})
        async with asyncio.timeout(WITHIN):
            data = await answer
        if "error" in data:
            raise AssertionError(f"{method} failed: {data['error']}")
        return dict(data.get("result", {}))

    async def navigate(self, url: str) -> None:
        """Open ``url`` and return once its load event fired.

        Page.navigate answers as soon as the navigation is committed, before the new document has a body,
        so evaluating right after it can still see a half-parsed page.
        """
        loaded = asyncio.get_running_loop().create_future()
        self._events.setdefault("Page.loadEventFired", []).append(loaded)
        await self.call("Page.navigate", url=url)
        async with asyncio.timeout(WITHIN):
            await loaded

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, what: str, within: float = WITHIN) -> None:
        async def holds() -> bool:
            return bool(await self.evaluate(expression))

        await eventually(holds, within=within, interval=0.05, what=what)

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


@contextlib.asynccontextmanager
async def chromium(folder: Path, http: aiohttp.ClientSession, *args: str) -> AsyncIterator[DevTools]:
    """A headless Chromium on a free DevTools port (with extra command-line `args`), killed with its whole
    process group afterwards."""
    assert CHROMIUM is not None, "LLMSWAP_REQUIRE_E2E=1 but no chromium binary (apt-get install chromium)"
    profile = folder / "profile"
    profile.mkdir()
    log = (folder / "chromium.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",  # Chromium picks a free port and writes it to DevToolsActivePort
        f"--window-size={WIDTH},{HEIGHT}", *args, "about:blank",
        stdout=log, stderr=log, start_new_session=True,
    )
    devtools: DevTools | None = None
    try:
        port_file = profile / "DevToolsActivePort"

        async def listening() -> bool:
            if process.returncode is not None:
                raise AssertionError(f"chromium exited ({process.returncode}): see {folder / 'chromium.log'}")
            return port_file.exists() and port_file.read_text().count("\n") >= 1

        await eventually(listening, within=WITHIN, what="chromium's DevTools port")
        port = int(port_file.read_text().splitlines()[0])
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(target for target in targets if target["type"] == "page")
        socket = await http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        devtools = DevTools(socket)
        yield devtools
    finally:
        if devtools is not None:
            with contextlib.suppress(Exception):
                await devtools.call("Browser.close")
            await devtools.socket.close()
            await devtools.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # renderer, GPU and zygote children too
        await process.wait()
        log.close()


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE), "the screenshot is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def model_state(model: str) -> str:
    return f'document.querySelector(\'tr[data-model="{model}"]\')?.dataset.state'


async def chat(http: aiohttp.ClientSession, served: Served, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.post(served.at("/v1/chat/completions"), json=body, headers=headers) as response:
        await response.read()
        return response.status


@contextlib.contextmanager
def proxy_log_into(ring: LogRing) -> Iterator[None]:
    """llmswap's own log lines into the served state's proxy ring, as the CLI sets it up."""
    handler = RingHandler(ring)
    handler.setFormatter(ProxyFormatter())
    logger = logging.getLogger("llmswap")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def vram_config(gpu: Path, state_dir: Path) -> Config:
    """Three demo models on a fake 8 GiB GPU: coder and chat do not fit together, embed fits with either."""
    def model(model_id: str, size: int, *flags: str, **fields: Any) -> ModelConfig:
        return demo_config(model_id, "--fake-vram", f"{size}GiB", "--fake-gpu-dir", str(gpu), *flags,
                           vram=size * GiB, **fields)

    models = [
        model("coder", 5, "--startup-delay", "0.5", name="Coder 7B", aliases=("code",)),
        model("chat", 6, "--startup-delay", "1", name="Chat 8B"),
        model("embed", 1, name="Embeddings"),
    ]
    return Config(
        models={m.id: m for m in models}, aliases={"code": "coder"}, api_keys=(ApiKey(KEY),),
        state_dir=state_dir,
        routing=RoutingConfig(router=RouterConfig(use="vram", vram=VramSettings(reserve=0))),
    )


async def test_the_status_page_shows_a_model_going_from_stopped_to_ready(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    config = vram_config(gpu, tmp_path / "state")
    router = build_router(config, reader=FakeReader(totals=(8 * GiB,), gpu_dir=gpu, names=("Fake GPU",)))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(config, router=router) as served,
        chromium(tmp_path, http) as page,
    ):
        with proxy_log_into(served.state.proxy_log):
            await page.call("Page.enable")
            await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                            deviceScaleFactor=1, mobile=False)
            await page.navigate(served.at(f"/ui#key={KEY}"))
            await page.wait_for("document.body.dataset.connection === 'live'", what="the page to connect")
            await page.wait_for(f"{model_state('chat')} === 'stopped'", what="chat shown stopped")
            assert await page.evaluate("location.hash") == ""  # the key does not stay in the address bar

            assert await chat(http, served, "embed") == 200
            assert await chat(http, served, "coder") == 200
            await page.wait_for(f"{model_state('coder')} === 'ready'", what="coder shown ready")
            request = asyncio.create_task(chat(http, served, "chat"))  # evicts coder: both do not fit
            await page.wait_for(f"{model_state('chat')} === 'starting'", what="chat shown starting")
            assert await request == 200
            await page.wait_for(f"{model_state('chat')} === 'ready'", what="chat shown ready")
            await page.wait_for(f"{model_state('coder')} === 'stopped'", what="coder shown stopped")
            await page.wait_for("document.querySelectorAll('#swaps tr[data-outcome=\"ok\"]').length === 3",
                                what="every swap listed as done")
            await page.wait_for("document.getElementById('stat-flight').textContent === '0'",
                                what="the finished request to leave the in-flight count")
            await page.wait_for("document.getElementById('log').textContent.includes('swap: chat ready')",
                                what="the log tail to show chat's swap")
            row = await page.evaluate("document.querySelector('tr[data-model=\"chat\"]').innerText")
            assert "Chat 8B" in row and "ready" in row and "6.0 GiB" in row
            pid = served.router.processes["chat"].pid
            assert pid is not None and str(pid) in row
            assert await page.evaluate("document.getElementById('stat-vram').textContent") == "7.0 / 8.0 GiB"
            shot = await page.call("Page.captureScreenshot", format="png")
    save_screenshot(base64.b64decode(shot["data"]), tmp_path)


def save_screenshot(data: bytes, folder: Path) -> None:
    assert png_size(data) == (WIDTH, HEIGHT)
    (folder / "ui.png").write_bytes(data)
    keep = os.environ.get("LLMSWAP_UI_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(data)


def button(model: str, action: str) -> str:
    return f'document.querySelector(\'tr[data-model="{model}"] button[data-action="{action}"]\')'


async def test_the_load_and_unload_buttons_start_and_stop_a_model(tmp_path: Path) -> None:
    config = exclusive_config(demo_config("m", "--startup-delay", "0.3"), demo_config("other"),
                              api_keys=(ApiKey(KEY),))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(config) as served,
        chromium(tmp_path, http) as page,
    ):
        await page.call("Page.enable")
        await page.navigate(served.at(f"/ui#key={KEY}"))
        await page.wait_for("document.body.dataset.connection === 'live'", what="the page to connect")
        await page.wait_for(f"{model_state('m')} === 'stopped'", what="m shown stopped")
        assert await page.evaluate(f"{button('m', 'unload')}.disabled") is True  # nothing to unload yet

        await page.evaluate(f"{button('m', 'load')}.click()")
        await page.wait_for(f"{model_state('m')} === 'ready'", what="m shown ready after Load")
        assert served.router.model_state("m") is ProcessState.READY
        assert served.router.model_state("other") is ProcessState.STOPPED  # no request was needed
        assert await page.evaluate(f"{button('m', 'load')}.disabled") is True

        await page.evaluate(f"{button('m', 'unload')}.click()")
        await page.wait_for(f"{model_state('m')} === 'stopped'", what="m shown stopped after Unload")
        assert served.router.model_state("m") is ProcessState.STOPPED

        await page.evaluate(f"{button('m', 'load')}.click()")
        await page.wait_for(f"{model_state('m')} === 'ready'", what="m ready again")
        await page.evaluate("document.getElementById('unload-all').click()")
        await page.wait_for(f"{model_state('m')} === 'stopped'", what="m stopped by Unload all")


async def test_a_loading_model_shows_its_progress_estimate(tmp_path: Path) -> None:
    # The first load is measured; the second shows `~NN% of ~3.0 s` under the model's state while it lasts.
    config = exclusive_config(demo_config("m", "--startup-delay", "3"), api_keys=(ApiKey(KEY),))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    auth = {"Authorization": f"Bearer {KEY}"}
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        serving(config) as served,
        chromium(tmp_path, http) as page,
    ):
        async with http.post(served.at("/api/models/load/m"), headers=auth) as response:
            assert response.status == 200
        async with http.post(served.at("/api/models/unload/m"), headers=auth) as response:
            assert response.status == 200
        await page.call("Page.enable")
        await page.navigate(served.at(f"/ui#key={KEY}"))
        await page.wait_for("document.body.dataset.connection === 'live'", what="the page to connect")
        await page.wait_for(f"{model_state('m')} === 'stopped'", what="m shown stopped")
        await page.evaluate(f"{button('m', 'load')}.click()")
        shown = 'document.querySelector(\'tr[data-model="m"] [data-progress]\')'
        await page.wait_for(f"{shown} && {shown}.dataset.progress !== ''", what="the load's estimate shown")
        text = await page.evaluate(f"{shown}.textContent")
        assert text.startswith("~") and "% of ~" in text, text
        fraction = float(await page.evaluate(f"{shown}.dataset.progress"))
        assert 0 <= fraction < 1
        await page.wait_for(f"{model_state('m')} === 'ready'", what="m ready")
        assert await page.evaluate(shown) is None  # the estimate goes with the load
