"""Whether saving a slot pays for itself (`kvCache.save: auto`), from rates measured on this machine.

A slot saved before a stop is written to disk during the swap and read back during the next start; not
saved, its tokens are processed again by the next request that needs them. Both are time a user waits, so a
slot is saved when writing and reading it back is expected to take less than processing its tokens again:

    tokens * bytes_per_token * (1 / write_rate + 1 / read_rate)  <  tokens / prompt_rate

- `prompt_rate`: the model's prompt processing, tokens per second, from llama-server's own `timings`
  (`prompt_n`, `prompt_per_second`) of its recent answers, weighted by their tokens (a 12-token prompt's
  rate says little);
- `bytes_per_token`: from the model's own past saves (llama-server's `n_saved` tokens and the file's size);
- `write_rate` and `read_rate`: bytes per second of llmswap's own past saves and restores in the folder.

Until all four are measured, a slot is saved (nothing says it would not pay). `always` saves every slot.
Pure and synchronous: the keeper feeds it and asks it; the server feeds it the answers' timings.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WINDOW = 20  # recent observations each rate is read from


class _Rate:
    """Amounts over seconds, summed over the last `WINDOW` observations."""

    def __init__(self) -> None:
        self._seen: deque[tuple[float, float]] = deque(maxlen=WINDOW)

    def add(self, amount: float, seconds: float) -> None:
        if amount > 0 and seconds > 0:
            self._seen.append((amount, seconds))

    @property
    def value(self) -> float | None:
        seconds = sum(s for _, s in self._seen)
        return sum(a for a, _ in self._seen) / seconds if seconds > 0 else None


@dataclass(frozen=True)
class SaveChoice:
    """Whether to save a slot of `tokens` tokens, and why (for the log and the skipped count)."""

    save: bool
    reason: str
    save_seconds: float | None = None  # expected write + read back
    redo_seconds: float | None = None  # expected processing again


class KvRates:
    """The rates `kvCache.save: auto` decides from, per model and per save folder (see the module doc)."""

    def __init__(self) -> None:
        self._prompt: dict[str, _Rate] = {}
        self._size: dict[str, _Rate] = {}  # bytes over tokens, per model
        self._write: dict[Path, _Rate] = {}
        self._read: dict[Path, _Rate] = {}
        self.skipped: dict[str, int] = {}  # saves skipped, per model

    # -- what is measured

    def learn_prompt(self, model: str, tokens: int, per_second: float) -> None:
        """A model's answer said it processed `tokens` prompt tokens at `per_second`."""
        if tokens > 0 and per_second > 0:
            self._prompt.setdefault(model, _Rate()).add(tokens, tokens / per_second)

    def learn_save(self, model: str, folder: Path, tokens: int, size: int, seconds: float) -> None:
        self._size.setdefault(model, _Rate()).add(size, tokens)
        self._write.setdefault(folder, _Rate()).add(size, seconds)

    def learn_restore(self, folder: Path, size: int, seconds: float) -> None:
        self._read.setdefault(folder, _Rate()).add(size, seconds)

    # -- what is decided

    def choose(self, model: str, folder: Path, tokens: int, mode: str) -> SaveChoice:
        if mode == "always":
            return SaveChoice(True, "kvCache.save is always")
        prompt, size = self._value(self._prompt, model), self._value(self._size, model)
        write, read = self._value(self._write, folder), self._value(self._read, folder)
        unknown = [name for name, rate in (("prompt processing", prompt), ("bytes per token", size),
                                           ("save", write), ("restore", read)) if rate is None]
        if unknown or prompt is None or size is None or write is None or read is None:
            return SaveChoice(True, f"not measured yet: {', '.join(unknown)} rate")
        cost = tokens * size * (1 / write + 1 / read)
        redo = tokens / prompt
        if cost < redo:
            return SaveChoice(True, f"saving and restoring {tokens} tokens ({cost:.2f}s) beats processing "
                                    f"them again ({redo:.2f}s)", cost, redo)
        return SaveChoice(False, f"processing {tokens} tokens again ({redo:.2f}s at {prompt:.0f} tokens/s) "
                                 f"is cheaper than saving and restoring them ({cost:.2f}s)", cost, redo)

    def skip(self, model: str) -> None:
        self.skipped[model] = self.skipped.get(model, 0) + 1

    def shown(self, model: str, folder: Path) -> dict[str, Any]:
        """The rates `model`'s choices are made from (None: not measured yet), for `/api/kvcache`."""
        def rounded(value: float | None, digits: int = 1) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "prompt_tokens_per_second": rounded(self._value(self._prompt, model)),
            "bytes_per_token": rounded(self._value(self._size, model)),
            "save_bytes_per_second": rounded(self._value(self._write, folder), 0),
            "restore_bytes_per_second": rounded(self._value(self._read, folder), 0),
            "skipped_saves": self.skipped.get(model, 0),
        }

    @staticmethod
    def _value(rates: dict[Any, _Rate], key: Any) -> float | None:
        rate = rates.get(key)
        return rate.value if rate is not None else None
