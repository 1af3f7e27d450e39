"""`--listen` decides whether Host is checked: a loopback listener answers loopback names only (and
`allowedHosts`), a listener on every interface answers any Host unless `allowedHosts` says otherwise."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp

from tests.helpers.cli import demo_model, running_llmswap, write_config
from tests.helpers.demo import free_port


async def status_for_host(http: aiohttp.ClientSession, url: str, host: str) -> int:
    async with http.get(f"{url}/v1/models", headers={"Host": host}) as response:
        await response.read()
        return response.status


async def test_the_default_loopback_listener_refuses_a_foreign_host(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"m": demo_model("m")}, allowedHosts=["llm.lan"])
    async with running_llmswap(config) as server, aiohttp.ClientSession() as http:
        assert await status_for_host(http, server.url, "evil.test:8080") == 403
        assert await status_for_host(http, server.url, f"localhost:{server.port}") == 200
        assert await status_for_host(http, server.url, "llm.lan:8080") == 200


async def test_a_listener_on_every_interface_answers_any_host_unless_configured(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"m": demo_model("m")})
    port = free_port()
    async with running_llmswap(config, "--listen", f":{port}", port=port) as server, \
            aiohttp.ClientSession() as http:
        assert await status_for_host(http, server.url, "llm.lan:8080") == 200
        write_config(tmp_path / "config.yaml", {"m": demo_model("m")}, allowedHosts=["llm.lan"])
        server.send_signal(signal.SIGHUP)
        await server.wait_for_output("config reload: applied")
        assert await status_for_host(http, server.url, "other.lan:8080") == 403
        assert await status_for_host(http, server.url, "llm.lan:8080") == 200
        assert await status_for_host(http, server.url, f"127.0.0.1:{port}") == 200
