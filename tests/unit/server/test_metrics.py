"""ServerMetrics fed by router notifications and read at scrape time (no event loop, no processes)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from llmswap import __version__
from llmswap.config.model import Config, ModelConfig
from llmswap.machine import FakeReader, GiB
from llmswap.process import ProcessEvent
from llmswap.router import Router, SwapFinished, SwapStarted, build_router
from llmswap.scheduler.errors import SwapFailed
from llmswap.scheduler.types import SwapPlan
from llmswap.server.inference.websocket import OpenSockets
from llmswap.server.observe.metrics import ServerMetrics
from llmswap.server.state import ServerState
from tests.helpers.fake_process import FakeScript, fake_factory


def model(model_id: str) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("serve", model_id), proxy="http://127.0.0.1:1")


def router_for(*ids: str) -> Router:
    config = Config(models={mid: model(mid) for mid in ids})
    return build_router(config, process_factory=fake_factory(FakeScript()))


def served(*ids: str, reader: FakeReader | None = None) -> tuple[ServerState, ServerMetrics]:
    router = router_for(*ids)
    state = ServerState(config=router.config, router=router)
    metrics = ServerMetrics(state, OpenSockets(), reader=reader or FakeReader((8 * GiB,)))
    state.watch_router(metrics.watch)
    return state, metrics


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, parsed by prometheus-client's own parser, keyed by (name, labels)."""
    text = metrics.exposition().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: ServerMetrics, metric: str, **labels: str) -> float | None:
    return samples(metrics).get((metric, tuple(sorted(labels.items()))))


def tell(router: Router, *items: object) -> None:
    """Notify the router's observers, as its run loop and processes do."""
    for item in items:
        for observer in router.observers:
            observer(item)


def test_restarts_count_only_the_starts_after_a_models_first():
    state, metrics = served("a", "b")
    for kind in ("starting", "ready", "stopping", "stopped", "starting", "ready"):
        tell(state.router, ProcessEvent("a", kind, duration=1.5 if kind == "ready" else None))
    tell(state.router, ProcessEvent("b", "starting"))

    assert value(metrics, "llmswap_model_starts_total", model="a") == 2
    assert value(metrics, "llmswap_upstream_restarts_total", model="a") == 1
    assert value(metrics, "llmswap_model_starts_total", model="b") == 1
    assert value(metrics, "llmswap_upstream_restarts_total", model="b") is None


def test_ready_durations_fill_the_load_histogram_and_exits_and_failures_are_counted():
    state, metrics = served("a")
    tell(state.router, ProcessEvent("a", "ready", duration=0.3))
    tell(state.router, ProcessEvent("a", "ready", duration=7.0))
    tell(state.router, ProcessEvent("a", "exited", exit_code=-9, detail="killed"))
    tell(state.router, ProcessEvent("a", "start_failed", exit_code=1, detail="bad flag"))

    assert value(metrics, "llmswap_model_load_duration_seconds_count", model="a") == 2
    assert value(metrics, "llmswap_model_load_duration_seconds_sum", model="a") == 7.3
    assert value(metrics, "llmswap_model_load_duration_seconds_bucket", model="a", le="0.5") == 1
    assert value(metrics, "llmswap_upstream_unexpected_exits_total", model="a") == 1
    assert value(metrics, "llmswap_model_start_failures_total", model="a") == 1


def test_swap_durations_are_split_by_outcome():
    state, metrics = served("a", "b")
    plan = SwapPlan("b", ("a",), "fifo.head", request_seq=3)
    tell(state.router, SwapStarted(plan))
    tell(state.router, SwapFinished(plan, None, 2.0))
    tell(state.router, SwapFinished(plan, SwapFailed("b did not start"), 0.5))

    assert value(metrics, "llmswap_swap_duration_seconds_count", model="b", outcome="ok") == 1
    assert value(metrics, "llmswap_swap_duration_seconds_count", model="b", outcome="failed") == 1


def test_router_counters_are_read_at_scrape_time_and_survive_a_reload():
    state, metrics = served("a", "b")
    old = state.router
    old.stats.swaps_by_rule["fifo.head"] = 3
    old.stats.evictions["a"] = 2
    old.stats.swap_failures = 1
    old.scheduler.stats.count("queue_full_model")
    assert value(metrics, "llmswap_swaps_total", rule="fifo.head") == 3

    new = router_for("a", "b")
    state.install(new, new.config)  # what a config reload does
    new.stats.swaps_by_rule["fifo.head"] = 1
    new.stats.evictions["b"] = 1
    new.scheduler.stats.count("queue_full_model")

    assert value(metrics, "llmswap_swaps_total", rule="fifo.head") == 4
    assert value(metrics, "llmswap_evictions_total", model="a") == 2
    assert value(metrics, "llmswap_evictions_total", model="b") == 1
    assert value(metrics, "llmswap_swap_failures_total") == 1
    assert value(metrics, "llmswap_rejections_total", reason="queue_full_model") == 2


def test_a_reloaded_router_is_observed_too():
    state, metrics = served("a")
    replacement = router_for("a")
    state.install(replacement, replacement.config)
    tell(state.router, ProcessEvent("a", "starting"))
    assert value(metrics, "llmswap_model_starts_total", model="a") == 1


def test_every_model_has_its_state_queue_and_in_flight_series():
    _, metrics = served("a", "b")
    for model_id in ("a", "b"):
        assert value(metrics, "llmswap_queue_depth", model=model_id) == 0
        assert value(metrics, "llmswap_in_flight", model=model_id) == 0
        assert value(metrics, "llmswap_model_state", model=model_id, state="stopped") == 1
        assert value(metrics, "llmswap_model_state", model=model_id, state="ready") == 0
    assert value(metrics, "llmswap_running_models") == 0
    assert value(metrics, "llmswap_info", version=__version__, router="group") == 1


def test_memory_series_come_from_the_reader():
    reader = FakeReader((8 * GiB, 16 * GiB), names=("Card A", "Card B"))
    reader.set_extra_used(1, 3 * GiB)
    _, metrics = served("a", reader=reader)
    assert value(metrics, "llmswap_memory_total_bytes", device="0", name="Card A", reader="fake") == 8 * GiB
    assert value(metrics, "llmswap_memory_total_bytes", device="1", name="Card B", reader="fake") == 16 * GiB
    assert value(metrics, "llmswap_memory_used_bytes", device="1", name="Card B", reader="fake") == 3 * GiB


def test_each_app_has_its_own_registry():
    _, first = served("a")
    _, second = served("a")
    first.starts.labels("a").inc()
    assert value(first, "llmswap_model_starts_total", model="a") == 1
    assert value(second, "llmswap_model_starts_total", model="a") is None
