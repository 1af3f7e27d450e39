"""The answers' prompt rates reach `kvCache.save: auto` while the config has a kvCache model, and cost a
config without one nothing (the recorder does not call the learner at all)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from llmswap.activity.record import ActivityRecord
from llmswap.activity.recorder import ActivityListener
from llmswap.config.model import KvCacheSettings
from llmswap.kvcache.rates import KvRates
from llmswap.server.admin.kvcache import PromptRates
from tests.helpers.models import demo_config, exclusive_config

FOLDER = Path("/saves")


def row(model: str, tokens: int, per_second: float) -> ActivityRecord:
    return SimpleNamespace(model=model, tokens=SimpleNamespace(  # type: ignore[return-value]
        input_tokens=tokens, prompt_per_second=per_second))


def test_rows_teach_the_rates_only_while_a_model_keeps_its_kv_cache() -> None:
    rates = KvRates()
    router = SimpleNamespace(kv=SimpleNamespace(rates=rates))
    learner = PromptRates(lambda: router)  # type: ignore[arg-type, return-value]
    listeners: list[ActivityListener] = []
    plain = exclusive_config(demo_config("a", port=1))
    kept = exclusive_config(demo_config("a", port=1, kv_cache=KvCacheSettings(dir=FOLDER)))

    learner.follow(plain, listeners)
    assert listeners == []  # no kvCache model: the rows are not even handed to it

    learner.follow(kept, listeners)
    learner.follow(kept, listeners)  # a reload to an equal config listens once, not twice
    assert listeners == [learner.learn]
    for listener in listeners:
        listener(row("a", 2000, 4000.0))
    assert rates.shown("a", FOLDER)["prompt_tokens_per_second"] == 4000.0

    learner.follow(plain, listeners)  # a reload drops the last kvCache model
    assert listeners == []
