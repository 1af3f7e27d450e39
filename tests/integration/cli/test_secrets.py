"""A secret given to an upstream through `${env.NAME}` (or typed into its command) reaches the upstream and
nothing else: not `/running`, `/logs`, `/api/events`, llmswap's own output, nor `llmswap check-config`."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.helpers.cli import WITHIN, demo_model, running_llmswap, write_config

SECRET = "sk-from-the-environment-7f3a"
LITERAL = "hf_typed_in_the_config_91c2"
REFERENCE = "${env.LLMSWAP_TEST_SECRET}"


def secret_config(tmp_path: Path) -> Path:
    model = demo_model("a")
    # sh passes the demo nothing of its own arguments: they are there for the process table to show.
    model["cmd"] = (f"sh -c {shlex.quote(model['cmd'] + ' & wait')} sh --api-key {REFERENCE} "
                    f"--hf-token {LITERAL}")
    model["env"] = [f"UPSTREAM_TOKEN={REFERENCE}"]
    return write_config(tmp_path / "config.yaml", {"a": model}, hooks={"on_startup": {"preload": ["a"]}})


async def first_events(http: aiohttp.ClientSession, url: str) -> str:
    """The opening of the event stream: at least its snapshot."""
    text = ""
    async with http.get(url + "/api/events") as response:
        assert response.status == 200
        async with asyncio.timeout(WITHIN):
            while "snapshot" not in text:
                text += (await response.content.readany()).decode()
    return text


async def test_a_secret_reaches_the_upstream_and_is_shown_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMSWAP_TEST_SECRET", SECRET)
    config = secret_config(tmp_path)
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        await server.wait_for_output("preload: a ready", within=WITHIN)
        async with http.get(server.url + "/running") as response:
            running = await response.json()
        async with http.get(server.url + "/logs") as response:
            logs = await response.text()
        events = await first_events(http, server.url)

        [entry] = running["running"]
        assert f"--api-key {REFERENCE} --hf-token ***" in entry["cmd"]
        assert "starting: sh -c" in logs and REFERENCE in logs
        shown = {"/running": str(running), "/logs": logs, "/api/events": events, "output": server.output()}
        for where, text in shown.items():
            assert SECRET not in text and LITERAL not in text, f"a secret shows in {where}"

        # What runs got every value.
        shell = psutil.Process(entry["pid"])
        assert shell.cmdline()[-4:] == ["--api-key", SECRET, "--hf-token", LITERAL]
        assert shell.environ()["UPSTREAM_TOKEN"] == SECRET


def test_check_config_shows_the_secret_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSWAP_TEST_SECRET", SECRET)
    config = secret_config(tmp_path)
    checked = subprocess.run([sys.executable, "-m", "llmswap", "check-config", str(config)],
                             capture_output=True, text=True, env=dict(os.environ), timeout=WITHIN, check=True)
    assert REFERENCE in checked.stdout and f"UPSTREAM_TOKEN={REFERENCE}" in checked.stdout
    assert SECRET not in checked.stdout + checked.stderr and LITERAL not in checked.stdout + checked.stderr


def test_check_config_shows_a_config_dir_secret_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMSWAP_TEST_SECRET", SECRET)
    config = secret_config(tmp_path)
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "b.yaml").write_text(
        "models:\n"
        "  b:\n"
        f"    cmd: sh -c 'sleep 1000' sh --token {REFERENCE}\n"
        "    proxy: http://127.0.0.1:9\n"
    )
    checked = subprocess.run(
        [sys.executable, "-m", "llmswap", "check-config", "--config", str(config),
         "--config-dir", str(conf_d)],
        capture_output=True, text=True, env=dict(os.environ), timeout=WITHIN, check=True,
    )
    assert f"--token {REFERENCE}" in checked.stdout and f"--api-key {REFERENCE}" in checked.stdout
    assert SECRET not in checked.stdout + checked.stderr
