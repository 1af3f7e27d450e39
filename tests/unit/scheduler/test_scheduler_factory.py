"""`routing.scheduler` → the scheduler Router gets: FIFO or batch, with admission and API-key limits."""

from __future__ import annotations

import pytest

from llmswap.config.model import (
    AdmissionConfig,
    ApiKey,
    BatchSettings,
    Config,
    ModelConfig,
    RoutingConfig,
    SchedulerConfig,
)
from llmswap.process.state import ProcessState
from llmswap.router.schedulers import scheduler_factory
from llmswap.scheduler.batch import BatchScheduler
from llmswap.scheduler.errors import ConcurrencyLimit, QueueFull
from llmswap.scheduler.fifo import FifoScheduler
from tests.unit.scheduler.fakes import FakeEffects, ManualClock, RequestFactory, ScriptedSwapper


def config(scheduler: SchedulerConfig) -> Config:
    models = {m: ModelConfig(id=m, cmd=("true",), concurrency_limit=3) for m in "ab"}
    return Config(models=models, routing=RoutingConfig(scheduler=scheduler),
                  api_keys=(ApiKey("sk-plain"), ApiKey("sk-limited", priority=-5, max_concurrent=1)))


def build(scheduler: SchedulerConfig):
    clock = ManualClock()
    effects = FakeEffects({"a": ProcessState.READY, "b": ProcessState.STOPPED})
    sched = scheduler_factory(config(scheduler), "group", ScriptedSwapper({"b": ["a"]}), clock)(effects)
    return sched, effects, RequestFactory(clock)


def test_fifo_is_the_default():
    sched, _, _ = build(SchedulerConfig())
    assert isinstance(sched, FifoScheduler)


def test_batch_gets_its_settings_and_priorities():
    settings = BatchSettings(max_wait=12.0, min_residency=3.0, priority={"b": 7})
    sched, _, _ = build(SchedulerConfig(use="batch", batch=settings))
    assert isinstance(sched, BatchScheduler)
    assert sched.batch == settings and sched.books.priority == {"b": 7}


@pytest.mark.parametrize("use", ["fifo", "batch"])
def test_both_get_admission_limits_and_key_limits(use):
    admission = AdmissionConfig(max_queue_per_model=1)
    sched, effects, requests = build(SchedulerConfig(use=use, admission=admission))
    served = requests.make("a", api_key="sk-limited")
    sched.on_request(served)
    assert effects.was_served(served)
    over_key = requests.make("a", api_key="sk-limited")
    sched.on_request(over_key)
    assert isinstance(effects.error_of(over_key), ConcurrencyLimit)
    waiting, rejected = requests.make("b"), requests.make("b")
    sched.on_request(waiting)
    sched.on_request(rejected)
    assert isinstance(effects.error_of(rejected), QueueFull)
    assert effects.is_pending(waiting)


def test_unknown_scheduler_names_the_key_and_the_choices():
    expected = r"routing.scheduler.use: unknown scheduler 'lifo'; use one of fifo, batch"
    with pytest.raises(ValueError, match=expected):
        build(SchedulerConfig(use="lifo"))
