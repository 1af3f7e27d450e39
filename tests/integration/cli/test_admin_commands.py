"""`llmswap ps`, `llmswap load`, `llmswap unload` as real processes against a real llmswap serving demo
models (with an API key, read from LLMSWAP_API_KEY), and their errors: unknown model, wrong or missing key,
nothing listening at --url."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.cli import WITHIN, alive, demo_model, running_llmswap, write_config
from tests.helpers.demo import HOST, free_port

KEY = "sk-admin-cli-0123"


@dataclass(frozen=True)
class Ran:
    status: int
    out: str
    err: str


async def llmswap(*args: str, key: str | None = KEY) -> Ran:
    env = {k: v for k, v in os.environ.items() if k != "LLMSWAP_API_KEY"}
    if key is not None:
        env["LLMSWAP_API_KEY"] = key
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmswap", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(WITHIN):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


def config(tmp_path: Path) -> Path:
    models = {"m": demo_model("m", "--startup-delay", "0.2", aliases=["mm"]), "other": demo_model("other"),
              "bad": demo_model("bad", "--exit-after", "0")}
    return write_config(tmp_path / "config.yaml", models, apiKeys=[KEY])


async def test_load_shows_in_ps_and_unload_stops_it(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path)) as server:
        url = ("--url", server.url)
        empty = await llmswap("ps", *url)
        assert empty.status == 0 and "no model is running" in empty.out

        loaded = await llmswap("load", "mm", *url)  # an alias is accepted
        assert loaded.status == 0, loaded.err
        assert loaded.out.startswith("m: ready")
        pid = server.upstreams()["m"]

        ps = await llmswap("ps", *url)
        assert ps.status == 0, ps.err
        header, row = ps.out.splitlines()
        assert header.split()[:3] == ["MODEL", "STATE", "FOOTPRINT"] and "IN FLIGHT" in header
        assert row.split()[:2] == ["m", "ready"] and str(pid) in row
        listed = json.loads((await llmswap("ps", "--all", "--json", *url)).out)
        assert {m["model"]: m["state"] for m in listed["models"]} == {
            "bad": "stopped", "m": "ready", "other": "stopped"}
        assert listed["models"][1] | {"last_start_seconds": None} == {
            "model": "m", "state": "ready", "footprint": None, "in_flight": 0, "queued": 0, "pid": pid,
            "last_start_seconds": None}

        unloaded = await llmswap("unload", "m", *url)
        assert unloaded.status == 0 and unloaded.out.strip() == "m: stopped"
        assert not alive(pid)
        assert "no model is running" in (await llmswap("ps", *url)).out

        assert (await llmswap("load", "other", *url)).status == 0
        everything = await llmswap("unload", *url)
        assert everything.status == 0 and everything.out.strip() == "every model stopped"
        assert server.upstreams() == {}


async def test_an_unknown_model_is_refused_with_the_servers_reason(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path)) as server:
        for command in ("load", "unload"):
            ran = await llmswap(command, "nope", "--url", server.url)
            assert ran.status == 1 and ran.out == ""
            assert ran.err.startswith(f"llmswap {command}: model not found: 'nope'")
            assert "(HTTP 404)" in ran.err
            assert "Traceback" not in ran.err


async def test_a_model_that_cannot_start_fails_the_load_with_the_reason(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path)) as server:
        ran = await llmswap("load", "bad", "--url", server.url)
        assert ran.status == 1 and ran.out == ""
        assert ran.err.startswith("llmswap load: ") and "exited" in ran.err and "(HTTP 5" in ran.err
        assert "Traceback" not in ran.err


async def test_a_missing_key_names_the_environment_variable(tmp_path: Path) -> None:
    async with running_llmswap(config(tmp_path)) as server:
        ran = await llmswap("ps", "--url", server.url, key=None)
        assert ran.status == 1 and "(HTTP 401)" in ran.err and "LLMSWAP_API_KEY" in ran.err
        assert "Traceback" not in ran.err


async def test_nothing_listening_at_the_url_is_a_clear_error() -> None:
    url = f"http://{HOST}:{free_port()}"
    for args in (("ps",), ("load", "m"), ("unload",)):
        ran = await llmswap(*args, "--url", url)
        assert ran.status == 1 and ran.out == ""
        assert f"cannot reach llmswap at {url} (connection refused)" in ran.err and "--url" in ran.err
        assert "Traceback" not in ran.err
    bad = await llmswap("ps", "--url", "ftp://localhost:8080")
    assert bad.status == 1 and "not an http:// or https:// address" in bad.err
    port = free_port()  # HOST:PORT, as --listen takes it
    ran = await llmswap("ps", "-url", f"{HOST}:{port}")
    assert ran.status == 1 and f"cannot reach llmswap at http://{HOST}:{port}" in ran.err
