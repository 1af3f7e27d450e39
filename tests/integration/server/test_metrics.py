"""`/metrics` through real HTTP with demo upstreams: it parses with prometheus-client's own parser, and the
series move as requests, swaps, crashes and rejections happen."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llmswap import __version__
from llmswap.config.model import ApiKey, Config, RouterConfig, RoutingConfig, VramSettings
from llmswap.machine import FakeReader, GiB
from llmswap.process.state import ProcessState
from llmswap.router import build_router
from llmswap.server.reload import apply_config
from tests.helpers.models import demo_config, exclusive_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(
    http: aiohttp.ClientSession, served: Served, headers: dict[str, str] | None = None
) -> Samples:
    async with http.get(served.at("/metrics"), headers=headers or {}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def get(samples: Samples, metric: str, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist yet (a counter nobody has touched)."""
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


async def chat(http: aiohttp.ClientSession, served: Served, model: str, *, stream: bool = False) -> int:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 3, "stream": stream}
    async with http.post(served.at(CHAT), json=body) as response:
        await response.read()
        return response.status


async def test_series_move_as_requests_and_swaps_happen(serve_config: ServeConfig, http):
    served = await serve_config(exclusive_config(demo_config("a"), demo_config("b")))
    before = await scrape(http, served)
    assert get(before, "llmswap_model_state", model="a", state="stopped") == 1
    assert get(before, "llmswap_running_models") == 0

    assert await chat(http, served, "a") == 200
    assert await chat(http, served, "b", stream=True) == 200  # evicts a
    after = await scrape(http, served)

    for model in ("a", "b"):
        assert get(after, "llmswap_requests_total", model=model, route=CHAT, status="200") == 1
        assert get(after, "llmswap_request_duration_seconds_count", model=model, route=CHAT) == 1
        assert get(after, "llmswap_time_to_first_byte_seconds_count", model=model, route=CHAT) == 1
        assert get(after, "llmswap_queue_wait_seconds_count", model=model) == 1
        assert get(after, "llmswap_model_load_duration_seconds_count", model=model) == 1
        assert get(after, "llmswap_model_starts_total", model=model) == 1
    # Waiting for the grant included a whole load, so it cannot be shorter than the load itself.
    assert (get(after, "llmswap_queue_wait_seconds_sum", model="a")
            >= get(after, "llmswap_model_load_duration_seconds_sum", model="a"))
    assert sum(v for (name, _), v in after.items() if name == "llmswap_swaps_total") == 2
    assert get(after, "llmswap_evictions_total", model="a") == 1
    assert get(after, "llmswap_swap_duration_seconds_count", model="b", outcome="ok") == 1
    assert get(after, "llmswap_model_state", model="b", state="ready") == 1
    assert get(after, "llmswap_model_state", model="a", state="stopped") == 1
    assert get(after, "llmswap_running_models") == 1
    assert get(after, "llmswap_info", version=__version__, router="group") == 1
    devices = [labels for (name, labels), _ in after.items() if name == "llmswap_memory_total_bytes"]
    assert devices, "no memory reading was exported"
    assert all(after[("llmswap_memory_total_bytes", labels)] > 0 for labels in devices)


async def test_queue_depth_and_in_flight_are_read_at_scrape_time(serve_config: ServeConfig, http):
    served = await serve_config(exclusive_config(demo_config("slow", "--startup-delay", "1")))
    request = asyncio.create_task(chat(http, served, "slow"))
    await until(lambda: served.router.snapshot().waiting.get("slow", 0) == 1, what="the request to queue")
    during = await scrape(http, served)
    assert get(during, "llmswap_queue_depth", model="slow") == 1
    assert get(during, "llmswap_model_loading", model="slow") == 1
    assert get(during, "llmswap_model_state", model="slow", state="starting") == 1
    assert await request == 200
    after = await scrape(http, served)
    assert get(after, "llmswap_queue_depth", model="slow") == 0
    assert get(after, "llmswap_in_flight", model="slow") == 0


async def test_routes_are_labelled_by_pattern_and_unknown_paths_as_unmatched(serve_config: ServeConfig, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    for path in ("/logs/stream/nope", "/no/such/page", "/running"):
        async with http.get(served.at(path)) as response:
            await response.read()
    samples = await scrape(http, served)
    assert get(samples, "llmswap_requests_total", model="", route="/logs/stream/{log_id}", status="400") == 1
    assert get(samples, "llmswap_requests_total", model="", route="unmatched", status="404") == 1
    assert get(samples, "llmswap_requests_total", model="", route="/running", status="200") == 1


async def test_an_unexpected_exit_and_the_restart_after_it_are_counted(serve_config: ServeConfig, http):
    served = await serve_config(exclusive_config(demo_config("m")))
    assert await chat(http, served, "m") == 200
    pid = served.router.processes["m"].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await until(lambda: served.router.model_state("m") is ProcessState.STOPPED, what="the crash to be seen")
    assert await chat(http, served, "m") == 200
    samples = await scrape(http, served)
    assert get(samples, "llmswap_upstream_unexpected_exits_total", model="m") == 1
    assert get(samples, "llmswap_model_starts_total", model="m") == 2
    assert get(samples, "llmswap_upstream_restarts_total", model="m") == 1


async def test_rejections_are_counted_by_reason(serve_config: ServeConfig, http):
    model = demo_config("one", "--startup-delay", "1", concurrency_limit=1)
    served = await serve_config(exclusive_config(model))
    first = asyncio.create_task(chat(http, served, "one"))
    await until(lambda: served.router.snapshot().waiting.get("one", 0) == 1,
                what="the first request to queue")
    assert await chat(http, served, "one") == 429
    assert await first == 200
    samples = await scrape(http, served)
    assert get(samples, "llmswap_rejections_total", reason="concurrency_limit") == 1
    assert get(samples, "llmswap_requests_total", model="one", route=CHAT, status="429") == 1


async def test_metrics_need_a_key_when_api_keys_are_set(serve_config: ServeConfig, http):
    served = await serve_config(exclusive_config(demo_config("m"), api_keys=(ApiKey("sk-metrics-123"),)))
    async with http.get(served.at("/metrics")) as response:
        assert response.status == 401
    samples = await scrape(http, served, {"Authorization": "Bearer sk-metrics-123"})
    assert get(samples, "llmswap_requests_total", model="", route="/metrics", status="401") == 1


async def test_a_reload_keeps_the_counters_and_follows_the_new_router(serve_config: ServeConfig, http):
    a, b = demo_config("a"), demo_config("b")
    served = await serve_config(exclusive_config(a, b))
    assert await chat(http, served, "a") == 200
    assert await chat(http, served, "b") == 200
    # A reload that changes model a: a successor router takes over, b's process is adopted.
    changed = exclusive_config(dataclasses.replace(a, ttl=30.0), b)
    assert apply_config(served.state, changed).applied
    assert await chat(http, served, "a") == 200  # on the new router: evicts b
    samples = await scrape(http, served)
    assert sum(v for (name, _), v in samples.items() if name == "llmswap_swaps_total") == 3
    assert get(samples, "llmswap_evictions_total", model="b") == 1
    assert get(samples, "llmswap_model_starts_total", model="a") == 2
    assert get(samples, "llmswap_model_state", model="a", state="ready") == 1


async def test_the_vram_routers_reader_footprints_and_budget_are_exported(
    tmp_path: Path, serve_config: ServeConfig, http
) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    model = demo_config("big", "--fake-vram", "3GiB", "--fake-gpu-dir", str(gpu), vram=3 * GiB)
    config = Config(models={"big": model}, state_dir=tmp_path / "state",
                    routing=RoutingConfig(router=RouterConfig(use="vram", vram=VramSettings(reserve=0))))
    reader = FakeReader(totals=(8 * GiB,), gpu_dir=gpu, names=("Fake GPU",))
    served = await serve_config(config, router=build_router(config, reader=reader))
    assert await chat(http, served, "big") == 200
    await until(lambda: reader.devices()[0].used == 3 * GiB, what="the demo to claim its fake memory")
    samples = await scrape(http, served)
    device = {"device": "0", "name": "Fake GPU", "reader": "fake"}
    assert get(samples, "llmswap_memory_total_bytes", **device) == 8 * GiB
    assert get(samples, "llmswap_memory_used_bytes", **device) == 3 * GiB
    assert get(samples, "llmswap_model_footprint_bytes", model="big") == 3 * GiB
    assert get(samples, "llmswap_vram_budget_bytes", device="GPU 0") == 8 * GiB
    assert get(samples, "llmswap_vram_in_use_bytes", device="GPU 0") == 3 * GiB
