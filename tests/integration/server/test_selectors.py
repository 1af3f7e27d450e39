"""Selectors over real demo upstreams on loopback: each strategy, a peer target, the listing, the refusal on
/upstream, and the queue counted by `warm` under the batch scheduler and the vram router."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmswap.config.model import (
    DEFAULT_GROUP_ID,
    AdmissionConfig,
    Config,
    GroupConfig,
    ModelConfig,
    PeerConfig,
    RouterConfig,
    RoutingConfig,
    SchedulerConfig,
    SelectorConfig,
    VramSettings,
)
from llmswap.machine import FakeReader, GiB
from llmswap.process.state import ProcessState
from llmswap.router import Router, build_router
from llmswap.server.inference.selectors import SelectorBook
from llmswap.server.reload import apply_config
from tests.helpers.demo import free_port, running_demo
from tests.helpers.models import demo_config
from tests.helpers.wait import until
from tests.integration.server.conftest import ServeConfig, Served

MESSAGES = [{"role": "user", "content": "hi"}]
SLOW = ("--tokens-per-second", "2")  # a streamed answer of 200 tokens stays open until the client leaves


def side_by_side(*models: ModelConfig, scheduler: SchedulerConfig | None = None, **overrides: Any) -> Config:
    """Every model in one group that does not swap: they all run at once."""
    ids = tuple(sorted(m.id for m in models))
    groups = {"pair": GroupConfig("pair", swap=False, exclusive=True, members=ids),
              DEFAULT_GROUP_ID: GroupConfig(DEFAULT_GROUP_ID)}
    routing = RoutingConfig(router=RouterConfig(use="group", groups=groups),
                            scheduler=scheduler or SchedulerConfig())
    return Config(models={m.id: m for m in models}, routing=routing, **overrides)


def selectors(*entries: SelectorConfig) -> dict[str, SelectorConfig]:
    return {entry.id: entry for entry in entries}


def book(served: Served) -> SelectorBook:
    found = served.services.selectors.book(served.config)
    assert isinstance(found, SelectorBook)
    return found


async def ask(http: aiohttp.ClientSession, served: Served, model: str) -> tuple[str, dict[str, Any]]:
    """A short chat: which demo answered, and its echo of what it received (when it echoes)."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 1}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        assert response.status == 200, await response.text()
        payload = await response.json()
        return response.headers["X-Demo-Model"], payload.get("echo", {})


@contextlib.asynccontextmanager
async def held(http: aiohttp.ClientSession, served: Served, model: str) -> AsyncIterator[str]:
    """A streamed chat held open (its first event read) until the block ends; yields who answers it."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 200, "stream": True}
    async with http.post(served.at("/v1/chat/completions"), json=body) as response:
        assert response.status == 200, await response.text()
        await response.content.readline()
        yield response.headers["X-Demo-Model"]


async def test_pin_always_goes_to_the_first_target_under_its_own_name(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    config = side_by_side(demo_config("a", "--echo"), demo_config("b"), selectors=selectors(
        SelectorConfig("fixed", "pin", ("a", "b"), name="Fixed", metadata={"tier": 1, "type": "mine"})))
    served = await serve_config(config)
    await ask(http, served, "b")
    async with http.get(served.at("/v1/models")) as response:
        listed = {record["id"]: record for record in (await response.json())["data"]}
    assert listed["fixed"]["name"] == "Fixed"
    assert listed["fixed"]["meta"]["llamaswap"] == {"tier": 1, "type": "selector", "strategy": "pin",
                                                    "targets": ["a", "b"]}
    assert listed["fixed"]["status"] == {"value": "unloaded"}  # pin looks at its first target only
    answered, echo = await ask(http, served, "fixed")
    assert answered == "a"
    assert echo["body"]["model"] == "a"  # the upstream never sees the selector id
    assert book(served).outstanding("fixed") == {}
    async with http.get(served.at("/v1/audio/voices"), params={"model": "fixed", "x": "y"}) as response:
        assert response.headers["X-Demo-Model"] == "a"
        assert (await response.json())["echo"]["query"] == {"model": "a", "x": "y"}
    async with http.post(served.at("/api/models/unload/fixed")) as response:
        assert response.status == 404  # a selector runs nothing of its own


async def test_warm_prefers_a_ready_target_and_cold_starts_the_first_otherwise(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    config = side_by_side(demo_config("a"), demo_config("b"), selectors=selectors(
        SelectorConfig("any", "warm", ("a", "b"))))
    served = await serve_config(config)
    await ask(http, served, "b")
    assert (await ask(http, served, "any"))[0] == "b"  # b is ready: no cold start of a
    assert served.router.model_state("a") is ProcessState.STOPPED
    await served.router.unload()
    assert (await ask(http, served, "any"))[0] == "a"  # nothing running: the first target


async def test_spillover_fills_the_first_target_then_spills_to_a_peer(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    async with running_demo("remote", SLOW) as remote:
        peer = PeerConfig("lan", remote.url, ("m",))
        config = side_by_side(demo_config("a", *SLOW), peers={"lan": peer}, selectors=selectors(
            SelectorConfig("spill", "spillover", ("a", "lan/m"), spillover=1)))
        served = await serve_config(config)
        async with held(http, served, "spill") as first:
            assert first == "a"
            assert book(served).outstanding("spill") == {"a": 1}  # counted while it streams
            async with held(http, served, "spill") as second:
                assert second == "remote"  # a holds its one request: the next target, a peer
                assert book(served).outstanding("spill") == {"a": 1, "lan/m": 1}
            await until(lambda: book(served).outstanding("spill") == {"a": 1},
                        what="the peer's count to drop when its stream ended")
        await until(lambda: book(served).outstanding("spill") == {}, what="a's count to drop")
        assert (await ask(http, served, "spill"))[0] == "a"  # room again on the first target


async def test_a_selector_is_not_an_upstream_name(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    config = side_by_side(demo_config("a"), selectors=selectors(SelectorConfig("fixed", "pin", ("a",))))
    served = await serve_config(config)
    url = served.at("/upstream/fixed/v1/chat/completions")
    async with http.post(url, json={"messages": MESSAGES}) as reply:
        assert reply.status == 404
        assert (await reply.json())["error"]["message"].startswith("model not found")


def queue_bound_world(kind: str, tmp_path: Path) -> tuple[Config, Router | None]:
    """a and b able to run side by side, b never healthy while the test runs, two waiters per model at most:
    under the batch scheduler (group router), or under the vram router (fifo scheduler, a fake GPU)."""
    admission = AdmissionConfig(max_queue_per_model=2)
    chosen = selectors(SelectorConfig("any", "warm", ("a", "b")))
    if kind == "batch":
        slow_b = demo_config("b", "--startup-delay", "60", health_check_timeout=90.0)
        scheduler = SchedulerConfig(use="batch", admission=admission)
        return side_by_side(demo_config("a"), slow_b, scheduler=scheduler, selectors=chosen), None
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    on_gpu = ("--fake-vram", "1GiB", "--fake-gpu-dir", str(gpu))
    models = (demo_config("a", *on_gpu, vram=GiB),
              demo_config("b", *on_gpu, "--startup-delay", "60", vram=GiB, health_check_timeout=90.0))
    routing = RoutingConfig(router=RouterConfig(use="vram", vram=VramSettings(reserve=0)),
                            scheduler=SchedulerConfig(admission=admission))
    config = Config(models={m.id: m for m in models}, routing=routing, selectors=chosen,
                    state_dir=tmp_path / "state")
    return config, build_router(config, reader=FakeReader(totals=(8 * GiB,), gpu_dir=gpu))


@pytest.mark.parametrize("kind", ["batch", "vram"])
async def test_warm_counts_queued_requests_against_the_bound(
    serve_config: ServeConfig, http: aiohttp.ClientSession, tmp_path: Path, kind: str
) -> None:
    # Requests for b queue behind its load. warm joins b while b can take the request within its queue
    # bound, and starts a only once b cannot (llama-swap would pick the starting b and answer 429).
    config, router = queue_bound_world(kind, tmp_path)
    served = await serve_config(config, router=router)
    waiting: list[asyncio.Task[Any]] = []

    def queue_for(model: str) -> None:
        body = {"model": model, "messages": MESSAGES, "max_tokens": 1}
        waiting.append(asyncio.create_task(http.post(served.at("/v1/chat/completions"), json=body)))

    def load_of(model: str) -> Any:
        return served.router.load_of(model)

    try:
        queue_for("b")
        await until(lambda: load_of("b").waiting == 1 and load_of("b").loading, what="b loading, one waiting")
        queue_for("any")
        await until(lambda: load_of("b").waiting == 2, what="the selector's request to join b's queue")
        assert book(served).outstanding("any") == {"b": 1}
        assert load_of("a").state is ProcessState.STOPPED  # b could take it: a was not cold-started
        assert not load_of("b").accepts
        assert (await ask(http, served, "any"))[0] == "a"  # b's queue is full: a starts and answers
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_reload_starts_the_selector_counts_again(
    serve_config: ServeConfig, http: aiohttp.ClientSession
) -> None:
    def config() -> Config:
        return side_by_side(demo_config("a", *SLOW, port=port), selectors=selectors(
            SelectorConfig("spill", "spillover", ("a",), spillover=1)))

    port = free_port()
    served = await serve_config(config())
    async with held(http, served, "spill"):
        before = book(served)
        assert before.outstanding("spill") == {"a": 1}
        apply_config(served.state, config())  # an equal config: a keeps running, the counts start over
        assert (await ask(http, served, "spill"))[0] == "a"
        assert book(served) is not before and book(served).outstanding("spill") == {}
    await until(lambda: before.outstanding("spill") == {}, what="the old book's request to end")
