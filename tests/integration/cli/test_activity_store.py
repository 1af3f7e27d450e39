"""`store.path` with the real `llmswap` process: activity survives a restart; a corrupt store is reported
and requests are still served (and recorded in memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers.cli import demo_model, running_llmswap, stop_with, write_config
from tests.helpers.wait import eventually

CHAT = {"model": "m", "messages": [{"role": "user", "content": "remember me"}], "max_tokens": 3}


async def activity(http: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with http.get(f"{url}/api/metrics/activity") as response:
        assert response.status == 200, await response.text()
        return (await response.json())["data"]


async def chat(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.post(f"{url}/v1/chat/completions", json=CHAT) as response:
        assert response.status == 200, await response.text()
        return dict(await response.json())


async def test_activity_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "activity.db"
    config = write_config(tmp_path / "llmswap.yaml", {"m": demo_model("m")}, store={"path": str(db)})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        answer = await chat(http, server.url)

        async def recorded() -> bool:
            return len(await activity(http, server.url)) == 1

        await eventually(recorded, what="the row stored")
        assert await stop_with(server) == 0
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        [row] = await activity(http, server.url)
        assert row["id"] == 1 and row["model"] == "m"
        assert row["tokens"]["output_tokens"] == answer["timings"]["predicted_n"]
        await chat(http, server.url)

        async def two() -> bool:
            return [r["id"] for r in await activity(http, server.url)] == [2, 1]

        await eventually(two, what="the second row numbered after the first")


async def test_a_corrupt_store_is_reported_and_requests_are_still_served(tmp_path: Path) -> None:
    db = tmp_path / "activity.db"
    db.write_bytes(b"not a database, just bytes\n" * 200)
    config = write_config(tmp_path / "llmswap.yaml", {"m": demo_model("m")}, store={"path": str(db)})
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        line = await server.wait_for_output("cannot be used")
        assert str(db) in line
        await chat(http, server.url)

        async def in_memory() -> bool:
            return len(await activity(http, server.url)) == 1

        await eventually(in_memory, what="the request recorded in memory")
    assert db.read_bytes().startswith(b"not a database")  # left alone for the user to look at
