"""What a demo answer reports about its own cost: OpenAI's `usage` and llama.cpp's `timings`, the latter
from the time the demo really spent (reading the request until generation began, then generating)."""

import time
from dataclasses import dataclass, field

from llmswap.demo.text import count_tokens


def usage(prompt: str, tokens: list[str]) -> dict[str, int]:
    return {
        "prompt_tokens": count_tokens(prompt),
        "completion_tokens": len(tokens),
        "total_tokens": count_tokens(prompt) + len(tokens),
    }


def _per_second(count: int, ms: float) -> float:
    return count / (ms / 1000) if ms > 0 else 0.0


@dataclass
class Stopwatch:
    """Started when the request arrived; `generating()` when the first token is about to be made."""

    arrived: float = field(default_factory=time.perf_counter)
    generation_started: float | None = None

    def generating(self) -> None:
        self.generation_started = time.perf_counter()

    def timings(self, prompt: str, tokens: list[str]) -> dict[str, float | int]:
        """llama.cpp's `timings` object (llama-server puts it on a whole answer and on a stream's last
        chunk)."""
        now = time.perf_counter()
        began = self.generation_started if self.generation_started is not None else now
        prompt_n, predicted_n = count_tokens(prompt), len(tokens)
        prompt_ms, predicted_ms = (began - self.arrived) * 1000, (now - began) * 1000
        return {
            "cache_n": 0,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": _per_second(prompt_n, prompt_ms),
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": _per_second(predicted_n, predicted_ms),
        }
