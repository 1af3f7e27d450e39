"""`hooks.on_startup.profile`: a real llmswap starts with that profile active, and a reload (SIGHUP) makes it
active again, whatever a client chose meanwhile."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp

from tests.helpers.cli import WITHIN, demo_model, running_llmswap, write_config


async def active(http: aiohttp.ClientSession, url: str) -> str | None:
    async with http.get(f"{url}/api/profiles") as response:
        assert response.status == 200
        return (await response.json())["active"]


async def test_the_startup_profile_is_active_at_start_and_after_each_reload(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "config.yaml", {"small": demo_model("small"), "big": demo_model("big")},
        profiles={"cheap": {"pins": {"chat": "small"}}, "best": {"pins": {"chat": "big"}}},
        hooks={"on_startup": {"profile": "cheap"}},
    )
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        assert await active(http, server.url) == "cheap"
        chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with http.post(f"{server.url}/v1/chat/completions", json=chat) as response:
            assert response.status == 200 and response.headers["X-Demo-Model"] == "small"  # the pin
        async with http.put(f"{server.url}/api/profiles/active", json={"name": "best"}) as response:
            assert response.status == 200
        assert await active(http, server.url) == "best"
        server.send_signal(signal.SIGHUP)
        await server.wait_for_output("config reload: applied", within=WITHIN)
        assert await active(http, server.url) == "cheap"
