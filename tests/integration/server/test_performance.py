"""`/api/performance`, `/api/hardware` and the machine's series on `/metrics`, over real HTTP, with a fake
GPU behind the memory reader interface."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import aiohttp

from llmswap.config.model import PerformanceConfig
from llmswap.machine.fake import FakeReader
from llmswap.machine.units import GiB
from llmswap.server.reload import apply_config
from llmswap.server.services import Services, build_services
from llmswap.server.state import ServerState
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served
from tests.integration.server.test_metrics import get, scrape


def with_fake_gpu(server_state: ServerState) -> Services:
    reader = FakeReader((24 * GiB,), names=("Fake RTX",))
    reader.set_extra_used(0, 3 * GiB)
    reader.set_gauges(0, util_pct=80.0, temp_c=70.0, power_w=300.0)
    return build_services(server_state, memory_reader=reader)


async def performance(http: aiohttp.ClientSession, served: Served, query: str = "") -> tuple[int, dict]:
    async with http.get(served.at(f"/api/performance{query}")) as response:
        return response.status, await response.json()


async def test_performance_hardware_and_metrics_show_the_gpu(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    served = await serve_config(exclusive_config(demo_config("m")), services=with_fake_gpu)

    async def sampled() -> bool:
        return (await performance(http, served))[1]["sys_stats"] is not None

    await until(sampled, what="the first sample")
    status, body = await performance(http, served)
    assert status == 200 and body["enabled"] is True
    [gpu] = body["gpu_stats"]
    assert (gpu["name"], gpu["gpu_util_pct"], gpu["temp_c"], gpu["mem_used_mb"]) == ("Fake RTX", 80.0, 70.0,
                                                                                      3 * 1024)
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    assert await performance(http, served, f"?after={now}") == (200, {"enabled": True, "sys_stats": [],
                                                                      "gpu_stats": []})
    status, error = await performance(http, served, "?after=yesterday")
    assert status == 400 and error["error"]["message"] == "invalid 'after' timestamp, use RFC3339 format"

    samples = await scrape(http, served)
    labels = {"id": "0", "name": "Fake RTX", "uuid": "GPU-fake-0"}
    assert get(samples, "llmswap_gpu_util_percent", **labels) == 80.0
    assert get(samples, "llmswap_gpu_power_draw_watts", **labels) == 300.0
    assert get(samples, "llmswap_host_memory_total_bytes") > 0

    async with http.get(served.at("/api/hardware")) as response:
        report = await response.json()
    assert report["schema_version"] == 1 and report["memory"]["capacity_bytes"] > 0
    assert [a["model"] for a in report["accelerators"]] == ["Fake RTX"]


async def test_performance_disabled_answers_503(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    config = dataclasses.replace(exclusive_config(demo_config("m")),
                                 performance=PerformanceConfig(disabled=True))
    served = await serve_config(config)
    assert await performance(http, served) == (503, {"enabled": False})
    samples = await scrape(http, served)
    assert get(samples, "llmswap_host_memory_total_bytes") == 0


async def test_a_reload_that_disables_sampling_stops_it_and_one_that_changes_every_restarts_it(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    config = exclusive_config(demo_config("m"))
    served = await serve_config(config)

    async def sampled() -> bool:
        return (await performance(http, served))[1]["sys_stats"] is not None

    await until(sampled, what="the first sample")
    slower = dataclasses.replace(config, performance=PerformanceConfig(every=60.0))
    assert apply_config(served.state, slower).applied
    await until(sampled, what="the first sample at the new pace")
    assert served.services.performance.monitor.every == 60.0  # type: ignore[union-attr]

    off = dataclasses.replace(config, performance=PerformanceConfig(disabled=True))
    assert apply_config(served.state, off).applied
    # Disabled by a reload: still 200 (as llama-swap), with no samples until sampling comes back.
    assert await performance(http, served) == (200, {"enabled": True, "sys_stats": None, "gpu_stats": None})
