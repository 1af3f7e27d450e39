"""The README's API table and the auth middleware agree on which routes need a key (`/api/version` does,
as in llama-swap)."""

from __future__ import annotations

import re
from pathlib import Path

from llmswap import __version__
from llmswap.config.model import ApiKey
from tests.helpers.models import demo_config, exclusive_config

README = Path(__file__).resolve().parents[3] / "README.md"
KEY = "sk-readme-0123456789"


def routes_the_readme_calls_open() -> list[str]:
    rows = [line for line in README.read_text().splitlines()
            if line.startswith("| `GET ") and "no API key needed" in line]
    return [path for row in rows for path in re.findall(r"`(?:GET )?(/[^`]*)`", row.split(" | ")[0])]


async def test_the_routes_the_readme_calls_open_answer_without_a_key(serve_config, http):
    open_routes = routes_the_readme_calls_open()
    assert open_routes == ["/health", "/wol-health"]
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=(ApiKey(KEY),)))
    for path in open_routes:
        async with http.get(served.at(path)) as resp:
            assert resp.status == 200, path


async def test_api_version_needs_a_key_as_the_readme_says(serve_config, http):
    row = next(line for line in README.read_text().splitlines() if line.startswith("| `GET /api/version`"))
    assert "behind the API key" in row
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=(ApiKey(KEY),)))
    async with http.get(served.at("/api/version")) as resp:
        assert resp.status == 401
    async with http.get(served.at("/api/version"), headers={"Authorization": f"Bearer {KEY}"}) as resp:
        assert (resp.status, await resp.json()) == (200, {"version": __version__})
