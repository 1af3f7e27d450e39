"""/health: 503 while the demo "loads", 200 once --startup-delay has passed, and the first-healthy line."""

import asyncio
import re
import time
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.demo import DemoProcess, free_port, running_demo

pytestmark = pytest.mark.asyncio(loop_scope="module")

FIRST_HEALTHY = re.compile(r"^llmswap-demo: first healthy response at monotonic=(\d+\.\d+)$")


async def health(http: aiohttp.ClientSession, demo: DemoProcess) -> tuple[int, dict[str, str]]:
    async with http.get(f"{demo.url}/health") as response:
        assert response.headers["X-Demo-Model"] == demo.model_name
        return response.status, await response.json()


async def test_health_flips_from_503_to_200_after_the_startup_delay(http: aiohttp.ClientSession) -> None:
    launched = time.monotonic()
    # The delay counts from process start and dwarfs the time to start listening, so the first polls
    # land well inside it.
    async with running_demo("loader", ["--startup-delay", "1.5"], wait_until="listening") as demo:
        answers: list[tuple[int, dict[str, str]]] = []
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            answers.append(await health(http, demo))
            if answers[-1][0] == 200:
                break
            assert asyncio.get_running_loop().time() < deadline, f"not healthy within 15 s\n{demo.output()}"
            await asyncio.sleep(0.01)
        statuses = [status for status, _ in answers]
        assert statuses[0] == 503
        assert statuses == [503] * (len(statuses) - 1) + [200]
        assert answers[0][1] == {"status": "loading"}
        assert answers[-1][1] == {"status": "ok"}
        healthy_seen = time.monotonic()

        line = await demo.wait_for_output("first healthy response")
        match = FIRST_HEALTHY.match(line)
        assert match, line
        # CLOCK_MONOTONIC is shared by every process on the machine, so the stamps order across processes.
        assert launched < float(match.group(1)) <= healthy_seen

        assert (await health(http, demo))[0] == 200
        await demo.wait_for_output("listening on")
        assert sum("first healthy" in line for line in demo.stdout_lines) == 1


async def test_without_a_delay_the_demo_is_healthy_at_once(http: aiohttp.ClientSession) -> None:
    async with running_demo("quick") as demo:
        assert await health(http, demo) == (200, {"status": "ok"})
        await demo.wait_for_output("first healthy response")


async def test_never_healthy_keeps_answering_503(http: aiohttp.ClientSession) -> None:
    async with running_demo("stuck", ["--never-healthy"], wait_until="listening") as demo:
        for _ in range(20):
            assert await health(http, demo) == (503, {"status": "loading"})
        async with http.get(f"{demo.url}/props") as response:
            assert (await response.json())["demo"]["healthy"] is False
        # Everything else is served meanwhile, as a loading llama-server answers its other routes.
        async with http.get(f"{demo.url}/v1/models") as response:
            assert response.status == 200
        assert not any("first healthy" in line for line in demo.stdout_lines)


async def test_healthy_when_waits_for_its_file(http: aiohttp.ClientSession, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    async with running_demo("gated", ["--healthy-when", str(gate)], wait_until="listening") as demo:
        for _ in range(10):
            assert await health(http, demo) == (503, {"status": "loading"})
            await asyncio.sleep(0.01)
        gate.touch()
        deadline = asyncio.get_running_loop().time() + 15
        while (await health(http, demo))[0] != 200:
            assert asyncio.get_running_loop().time() < deadline, f"not healthy within 15 s\n{demo.output()}"
            await asyncio.sleep(0.01)
        await demo.wait_for_output("first healthy response")


async def test_the_demo_listens_on_the_port_it_is_given(http: aiohttp.ClientSession) -> None:
    port = free_port()
    async with running_demo("fixed", port=port) as demo:
        assert demo.port == port
        assert (await health(http, demo))[0] == 200
