"""Token counts and speeds on `/metrics`, from each activity record as it is stored.

    llmswap_tokens_total{model,kind}                      kind: input, output, cached, drafted, accepted
    llmswap_prompt_tokens_per_second{model}               histogram of prompt processing speeds
    llmswap_generation_tokens_per_second{model}           histogram of generation speeds

Counts the answer did not report (-1) are left out, as are speeds of 0 or less (not reported). The
token counts are plain integers added to per record and read by a collector at scrape time: most answers
report counts, and five prometheus counter increments (a lock each) would cost more than the rest of
the record's bookkeeping.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from llmswap.activity.record import ActivityRecord
from llmswap.activity.recorder import ActivityRecorder

KINDS = ("input", "output", "cached", "drafted", "accepted")
HELP = "Tokens reported by upstream answers, by model and kind"
SPEED_BUCKETS = (1, 2.5, 5, 10, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000)


class TokenMetrics:
    def __init__(self, registry: CollectorRegistry, recorder: ActivityRecorder) -> None:
        self.recorder = recorder
        # model → [input, output, cached, drafted, accepted] (the order of KINDS), and when it was first seen
        self.counts: dict[str, list[int]] = {}
        self.created: dict[str, float] = {}
        registry.register(_TokenCounts(self))
        self.prompt_speed = Histogram(
            "llmswap_prompt_tokens_per_second", "Prompt processing speed reported per request (tokens/s)",
            ("model",), buckets=SPEED_BUCKETS, registry=registry)
        self.generation_speed = Histogram(
            "llmswap_generation_tokens_per_second", "Generation speed reported per request (tokens/s)",
            ("model",), buckets=SPEED_BUCKETS, registry=registry)
        self._speeds: dict[str, tuple[Any, Any]] = {}

    def on_record(self, record: ActivityRecord) -> None:
        t = record.tokens
        counted = t.input_tokens > 0 or t.output_tokens > 0 or t.cache_tokens > 0 or t.draft_tokens > 0 \
            or t.draft_acc_tokens > 0
        prompt_speed, generation_speed = t.prompt_per_second, t.tokens_per_second
        if not counted and prompt_speed <= 0 and generation_speed <= 0:
            return
        model = record.model
        counts = self.counts.get(model)
        if counts is None:  # a model's series appear together, the first time it reports anything
            counts = self.counts[model] = [0, 0, 0, 0, 0]
            self.created[model] = time.time()
            # looked up once per model: labels() costs more than the observation
            self._speeds[model] = (self.prompt_speed.labels(model), self.generation_speed.labels(model))
        if counted:
            for index, count in enumerate((t.input_tokens, t.output_tokens, t.cache_tokens, t.draft_tokens,
                                           t.draft_acc_tokens)):
                if count > 0:
                    counts[index] += count
        if prompt_speed > 0 or generation_speed > 0:
            series = self._speeds[model]
            if prompt_speed > 0:
                series[0].observe(prompt_speed)
            if generation_speed > 0:
                series[1].observe(generation_speed)


class _TokenCounts:
    """`llmswap_tokens_total`, read from `TokenMetrics.counts` at scrape time."""

    def __init__(self, metrics: TokenMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        # Registered before the speed histograms: settling here updates them too before they are read.
        self.metrics.recorder.settle()
        family = CounterMetricFamily("llmswap_tokens", HELP, labels=("model", "kind"))
        created = self.metrics.created
        for model, counts in list(self.metrics.counts.items()):
            for kind, count in zip(KINDS, tuple(counts), strict=True):
                family.add_metric((model, kind), count, created=created.get(model))
        yield family


def setup(registry: CollectorRegistry, recorder: ActivityRecorder) -> TokenMetrics:
    """Count the tokens of every row `recorder` keeps into `registry`."""
    token_metrics = TokenMetrics(registry, recorder)
    recorder.listeners.append(token_metrics.on_record)
    return token_metrics
