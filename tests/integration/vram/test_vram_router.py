"""The vram router over real demo upstreams whose GPU memory is faked (the one edge we cannot have here).

Each demo writes its footprint into a shared directory once healthy; a FakeReader reads it as NVML would
report per-process usage. With `--fake-gpu-total` a demo refuses to start (printing a CUDA out-of-memory
error) when the others already hold too much: an emulated OOM.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from llmswap.config.model import Config, ModelConfig, RouterConfig, RoutingConfig, VramSettings
from llmswap.machine import FakeReader, GiB
from llmswap.process.state import ProcessState
from llmswap.router import Router, build_router
from llmswap.router.vram import VramPolicy, looks_like_oom
from tests.helpers.models import demo_config
from tests.helpers.wait import eventually


def model(name: str, gpu_dir: Path, actual: str, declared: int | None, *flags: str) -> ModelConfig:
    return demo_config(name, "--fake-vram", actual, "--fake-gpu-dir", str(gpu_dir), *flags, vram=declared)


def vram_config(tmp_path: Path, *models: ModelConfig, costs: dict[str, float] | None = None) -> Config:
    settings = VramSettings(reserve=0, evict_costs=costs or {})
    routing = RoutingConfig(router=RouterConfig(use="vram", vram=settings))
    return Config(models={m.id: m for m in models}, routing=routing, state_dir=tmp_path / "state")


def vram_router(config: Config, reader: FakeReader) -> Router:
    router = build_router(config, reader=reader)
    vram_of(router).sample_interval = 0  # sample at ready only: deterministic
    router.start()
    return router


def vram_of(router: Router) -> VramPolicy:
    assert isinstance(router.policy, VramPolicy)
    return router.policy


async def use(router: Router, name: str) -> None:
    async with router.acquire(name) as process:
        assert process.state is ProcessState.READY


def running(router: Router) -> set[str]:
    return {m for m, p in router.processes.items() if p.state is ProcessState.READY}


async def test_models_beyond_the_budget_swap_least_recently_used_out(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    reader = FakeReader(totals=(10 * GiB,), gpu_dir=gpu)
    # Equal eviction costs (else each model's measured load time decides), so recency breaks the tie.
    models = [model(n, gpu, "4GiB", 4 * GiB) for n in ("a", "b", "c")]
    config = vram_config(tmp_path, *models, costs={"a": 1, "b": 1, "c": 1})
    router = vram_router(config, reader)
    try:
        await use(router, "a")
        await use(router, "b")
        assert running(router) == {"a", "b"}  # 8 GiB of 10: both fit
        await use(router, "c")
        assert running(router) == {"b", "c"}  # a was used least recently
        assert reader.devices()[0].used == 8 * GiB
        await use(router, "a")
        assert running(router) == {"a", "c"}
        assert router.stats.evictions == {"a": 1, "b": 1}
        extras = router.router_extras()["vram"]["devices"]["GPU 0"]
        assert extras["budget"] == 10 * GiB and extras["in_use"] == 8 * GiB
    finally:
        await router.shutdown()


async def test_learned_footprint_raises_declaration_and_survives_restart(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    reader = FakeReader(totals=(5 * GiB,), gpu_dir=gpu)
    # "d" declares 1 GiB but really takes 3 GiB: the declaration would have risked an OOM.
    config = vram_config(tmp_path, model("d", gpu, "3GiB", 1 * GiB), model("e", gpu, "2GiB", 2 * GiB))
    router = vram_router(config, reader)
    try:
        await use(router, "d")
        assert vram_of(router).book.footprint("d") == 3 * GiB
        assert router.model_extras("d")["vram"]["source"] == "learned"
    finally:
        await router.shutdown()
    assert (tmp_path / "state" / "footprints.json").exists()

    restarted = vram_router(config, FakeReader(totals=(5 * GiB,), gpu_dir=gpu))
    try:
        assert vram_of(restarted).book.footprint("d") == 3 * GiB  # remembered, not the declared 1 GiB
        await use(restarted, "e")
        await use(restarted, "d")  # 2 + 3 GiB fits 5 GiB exactly
        assert running(restarted) == {"d", "e"}
    finally:
        await restarted.shutdown()


async def test_out_of_memory_start_evicts_idle_models_and_retries_once(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    # The budget says 10 GiB, but the "device" really has 6: y (4) + x (4 real, 2 declared) does not fit.
    reader = FakeReader(totals=(10 * GiB,), gpu_dir=gpu)
    x = model("x", gpu, "4GiB", 2 * GiB, "--fake-gpu-total", "6GiB")
    y = model("y", gpu, "4GiB", 4 * GiB)
    router = vram_router(vram_config(tmp_path, x, y), reader)
    try:
        await use(router, "y")
        await use(router, "x")  # first start dies with CUDA OOM; y is idle, so it is evicted and x retried
        assert running(router) == {"x"}
        assert vram_of(router).oom_retries == 1
        assert router.stats.evictions == {"y": 1}
        assert any("out of memory" in line for line in router.processes["x"].logs.history())
    finally:
        await router.shutdown()


def test_oom_detection_recognises_common_upstream_messages() -> None:
    assert looks_like_oom("CUDA error: out of memory")
    assert looks_like_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert looks_like_oom("alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc failed")
    assert looks_like_oom("vk::Device::allocateMemory: ErrorOutOfDeviceMemory")
    assert not looks_like_oom("upstream command exited prematurely (exit code 1)")


async def test_without_per_process_readings_a_start_is_measured_by_the_devices_growth(tmp_path: Path) -> None:
    # As NVML inside a container: device totals are right, per-process usage is empty.
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    reader = FakeReader(totals=(10 * GiB,), gpu_dir=gpu, per_process=False)
    reader.set_extra_used(0, 1 * GiB)  # something else holds memory: only the growth is the model's
    config = vram_config(tmp_path, model("low", gpu, "3GiB", 1 * GiB), model("plain", gpu, "2GiB", None))
    router = vram_router(config, reader)
    try:
        await use(router, "low")
        # Above the 1 GiB declared: the declaration was low.
        assert vram_of(router).book.footprint("low") == 3 * GiB
        await use(router, "plain")
        assert vram_of(router).book.footprint("plain") == 2 * GiB
        assert router.model_extras("plain")["vram"]["source"] == "learned"
    finally:
        await router.shutdown()


async def test_device_growth_is_not_learned_while_another_model_starts_too(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    reader = FakeReader(totals=(10 * GiB,), gpu_dir=gpu, per_process=False)
    slow = model("slow", gpu, "3GiB", 1 * GiB, "--startup-delay", "3")  # still starting when quick is
    quick = model("quick", gpu, "2GiB", 1 * GiB, "--startup-delay", "0.2")
    router = vram_router(vram_config(tmp_path, slow, quick), reader)
    try:
        # Both fit (1 + 1 GiB declared of 10): they start in parallel, and the devices' growth over either
        # start includes part of the other's, so neither is learned from it.
        started = asyncio.create_task(use(router, "slow"))
        await eventually_starting(router, "slow")
        await use(router, "quick")
        await started
        assert vram_of(router).book.footprint("slow") == 1 * GiB
        assert vram_of(router).book.footprint("quick") == 1 * GiB
    finally:
        await router.shutdown()


async def eventually_starting(router: Router, name: str) -> None:
    async def starting() -> bool:
        return router.processes[name].state is ProcessState.STARTING

    await eventually(starting, within=10, what=f"{name} starting")


async def test_a_sleeping_model_holds_no_footprint_but_its_residue_counts(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    reader = FakeReader(totals=(10 * GiB,), gpu_dir=gpu)
    sleepy = ("--enable-sleep-mode", "--sleep-residue", "3GiB")
    calls = {"sleep_call": ("POST", "/sleep?level=1"), "wake_call": ("POST", "/wake_up")}
    a = demo_config("a", "--fake-vram", "6GiB", "--fake-gpu-dir", str(gpu), *sleepy, vram=6 * GiB, **calls)
    b = model("b", gpu, "6GiB", 6 * GiB)
    c = model("c", gpu, "2GiB", 2 * GiB)
    router = vram_router(vram_config(tmp_path, a, b, c), reader)
    try:
        await use(router, "a")
        await use(router, "b")  # a (6 GiB) sleeps for b, keeping 3 GiB: 3 + 6 fit in 10
        assert router.processes["a"].state is ProcessState.SLEEPING
        assert vram_of(router).residues == {"a": {0: 3 * GiB}}
        extras = router.router_extras()["vram"]["devices"]["GPU 0"]
        assert (extras["budget"], extras["in_use"], extras["asleep"]) == (10 * GiB, 9 * GiB, 3 * GiB)
        await use(router, "c")  # b + c = 8 would fit in 10, not beside a's 3: b goes
        assert running(router) == {"c"}
        await use(router, "a")  # a wakes: its residue is a footprint again
        assert vram_of(router).residues == {}
        assert running(router) == {"a", "c"}
    finally:
        await router.shutdown()
