"""Token counts and speeds on `/metrics`, from each activity record as it is stored.

    llmswap_tokens_total{model,kind}                      kind: input, output, cached, drafted, accepted
    llmswap_prompt_tokens_per_second{model}               histogram of prompt processing speeds
    llmswap_generation_tokens_per_second{model}           histogram of generation speeds

Counts the answer did not report (-1) are left out, as are speeds of 0 or less (not reported).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

from llmswap.activity.record import ActivityRecord
from llmswap.server.activity_api import recorder_of
from llmswap.server.metrics import metrics_of
from llmswap.server.state import ServerState

KINDS = ("input", "output", "cached", "drafted", "accepted")
SPEED_BUCKETS = (1, 2.5, 5, 10, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000)


class TokenMetrics:
    def __init__(self, server_state: ServerState) -> None:
        registry = metrics_of(server_state).registry
        self.tokens = Counter("llmswap_tokens", "Tokens reported by upstream answers, by model and kind",
                              ("model", "kind"), registry=registry)
        self.prompt_speed = Histogram(
            "llmswap_prompt_tokens_per_second", "Prompt processing speed reported per request (tokens/s)",
            ("model",), buckets=SPEED_BUCKETS, registry=registry)
        self.generation_speed = Histogram(
            "llmswap_generation_tokens_per_second", "Generation speed reported per request (tokens/s)",
            ("model",), buckets=SPEED_BUCKETS, registry=registry)
        self._series: dict[str, tuple[list[Any], Any, Any]] = {}

    def on_record(self, record: ActivityRecord) -> None:
        t = record.tokens
        counts = (t.input_tokens, t.output_tokens, t.cache_tokens, t.draft_tokens, t.draft_acc_tokens)
        if not any(count > 0 for count in counts) and t.prompt_per_second <= 0 and t.tokens_per_second <= 0:
            return
        series = self._series.get(record.model)
        if series is None:  # looked up once per model: labels() costs more than the increment
            series = ([self.tokens.labels(record.model, kind) for kind in KINDS],
                      self.prompt_speed.labels(record.model), self.generation_speed.labels(record.model))
            self._series[record.model] = series
        counters, prompt_speed, generation_speed = series
        for counter, count in zip(counters, counts, strict=True):
            if count > 0:
                counter.inc(count)
        if t.prompt_per_second > 0:
            prompt_speed.observe(t.prompt_per_second)
        if t.tokens_per_second > 0:
            generation_speed.observe(t.tokens_per_second)


def setup(server_state: ServerState) -> TokenMetrics:
    token_metrics = TokenMetrics(server_state)
    recorder_of(server_state).listeners.append(token_metrics.on_record)
    return token_metrics
