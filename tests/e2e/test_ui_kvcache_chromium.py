"""The status page's KV cache panel in a real headless Chromium: a kvCache model's saves on disk are listed
(slot, tokens, size) and its Clear button deletes them. The saves are written as llama-server leaves them
(the life that makes them, with a real llama-server, is tests/e2e/llamaserver/test_kvcache_llamaserver.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aiohttp

from llmswap.config.model import ApiKey, KvCacheSettings
from llmswap.kvcache import SaveFolder
from tests.e2e import test_ui_chromium as ui
from tests.e2e.test_ui_chromium import KEY, WITHIN, chromium
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import serving

pytestmark = ui.pytestmark


async def test_the_kv_cache_panel_lists_a_models_saves_and_clears_them(tmp_path: Path) -> None:
    settings = KvCacheSettings(dir=tmp_path / "kv")
    chat = dataclasses.replace(demo_config("chat"), kv_dir=settings.dir / "chat", kv_cache=settings)
    folder = SaveFolder(settings.dir / "chat")
    folder.prepare("fingerprint")
    for slot, tokens in ((0, 3223), (1, 120)):
        (folder.path / f"slot{slot}.bin.partial").write_bytes(b"k" * (2 << 20))
        folder.saved(slot, tokens, 0.01)
    config = exclusive_config(chat, demo_config("plain"), api_keys=(ApiKey(KEY),), kv_cache=settings)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=WITHIN)
    async with aiohttp.ClientSession(timeout=timeout) as http, serving(config) as served, \
            chromium(tmp_path, http) as page:
        await page.call("Page.enable")
        await page.navigate(served.at(f"/ui#key={KEY}"))
        await page.wait_for("document.querySelectorAll('#kvcache tr[data-model=\"chat\"]').length === 2",
                            what="chat's two saves listed")
        assert not await page.evaluate("document.getElementById('kv-section').hidden")
        cells = await page.evaluate("[...document.querySelectorAll('#kvcache tr')].map("
                                    "row => [...row.cells].slice(0, 4).map(cell => cell.textContent))")
        assert cells == [["chat", "0", "3,223", "2.0 MiB"], ["chat", "1", "120", "2.0 MiB"]]
        plain = "document.querySelectorAll('#kvcache tr[data-model=\"plain\"]').length"
        assert await page.evaluate(plain) == 0  # no kvCache, nothing saved: not listed

        await page.evaluate("document.querySelector('#kvcache button.kv-clear').click()")
        await page.wait_for("document.querySelector('#kvcache tr[data-model=\"chat\"] td.sub') !== null",
                            what="chat shown with nothing saved")
    assert folder.saves() == []
