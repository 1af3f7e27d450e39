"""What each model occupies in memory: declared in the config, learned by measuring, remembered on disk.

A declaration (`models.<id>.vram`) is a floor: measurement can only raise a footprint, never lower it,
because a declaration below the truth risks an out-of-memory and one above it only costs sharing.
Learned values are the peak per-process-tree reading seen while the model was ready (or, without
per-process readings, the devices' growth across a start the vram router could attribute), per device,
kept across starts and persisted in `<stateDir>/footprints.json` together with the measured load
times, which the vram swapper uses as eviction costs. Last-used times only order evictions within one
run and are not persisted.

Reading a footprint never logs (the swapper asks speculatively); learning does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmswap.machine.units import format_bytes

if TYPE_CHECKING:  # the readers must import without the config package
    from llmswap.config.model import Config, ModelConfig

FOOTPRINTS_FILE = "footprints.json"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Footprint:
    """A model's footprint as the swapper uses it, with where the number came from."""

    model: str
    total: int  # bytes
    per_device: Mapping[int, int]  # device -> bytes; sums to `total` (or slightly above, from rounding up)
    source: str  # "declared" | "learned" | "default" (neither: the whole budget of its devices)
    declared: int | None
    learned: int | None  # total of the learned per-device peaks


@dataclass
class _Entry:
    learned: dict[int, int] = field(default_factory=dict)  # device -> peak bytes
    load_time: float | None = None  # seconds, last measured
    last_used: float | None = None  # the caller's clock (monotonic), this run only


class FootprintBook:
    """Footprints, load times and last-used times per model.

    `budgets` (device -> bytes) decides where an unpinned model lives (every device) and what the
    conservative default is. Call `load()` once after construction, even without a file: it also
    warns about models that have neither a declaration nor a learned value.
    """

    def __init__(
        self,
        models: Mapping[str, ModelConfig],
        budgets: Mapping[int, int],
        *,
        path: Path | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._models = models
        self._budgets = dict(budgets)
        self.path = path
        self._log = logger or logging.getLogger("llmswap.machine.footprints")
        self._entries: dict[str, _Entry] = {}
        # Entries for models absent from the current config: kept as read and written back, so that
        # commenting a model out for a while does not lose what was learned about it.
        self._dormant: dict[str, Any] = {}
        self._warned_default: set[str] = set()

    @classmethod
    def for_config(
        cls, config: Config, budgets: Mapping[int, int], *, logger: logging.Logger | None = None
    ) -> FootprintBook:
        """A book persisted under `config.state_dir` (in memory only when it is not set), already loaded."""
        path = config.state_dir / FOOTPRINTS_FILE if config.state_dir is not None else None
        book = cls(config.models, budgets, path=path, logger=logger)
        book.load()
        return book

    # reading: pure, never logs

    def devices_of(self, model: str) -> tuple[int, ...]:
        """The model's pinned `gpus`, else every budgeted device."""
        cfg = self._models.get(model)
        if cfg is not None and cfg.gpus:
            return tuple(cfg.gpus)
        return tuple(sorted(self._budgets))

    def declared(self, model: str) -> int | None:
        cfg = self._models.get(model)
        # 0 is a declaration too: a model that runs on the CPU beside the GPU ones takes no room.
        return cfg.vram if cfg is not None else None

    def learned(self, model: str) -> dict[int, int]:
        entry = self._entries.get(model)
        return dict(entry.learned) if entry is not None else {}

    def footprint(self, model: str) -> int:
        return self.footprint_of(model).total

    def footprint_of(self, model: str) -> Footprint:
        declared = self.declared(model)
        learned = self.learned(model)
        learned_total = sum(learned.values()) if learned else None
        if learned_total is not None and (declared is None or learned_total >= declared):
            return Footprint(model, learned_total, learned, "learned", declared, learned_total)
        if declared is not None and learned:
            # Measured where it lives, but declared bigger: keep the measured shape, scaled up to the floor.
            scale = declared / learned_total if learned_total else 1.0
            per_device = {d: math.ceil(b * scale) for d, b in learned.items()}
            return Footprint(model, declared, per_device, "declared", declared, learned_total)
        devices = self.devices_of(model)
        if declared is not None:
            return Footprint(model, declared, _split_evenly(declared, devices), "declared", declared, None)
        per_device = {d: self._budgets.get(d, 0) for d in devices}
        return Footprint(model, sum(per_device.values()), per_device, "default", None, None)

    def load_time(self, model: str) -> float | None:
        entry = self._entries.get(model)
        return entry.load_time if entry is not None else None

    def last_used(self, model: str) -> float | None:
        entry = self._entries.get(model)
        return entry.last_used if entry is not None else None

    # learning

    def observe(self, model: str, bytes_by_device: Mapping[int, int]) -> bool:
        """Record a reading of the model's process tree; True when it set a new peak (worth a `save()`)."""
        readings = {d: int(b) for d, b in bytes_by_device.items() if b > 0}
        if not readings:
            # Nothing attributed (not yet allocated, or a PID namespace hides it): a zero is no measurement.
            return False
        entry = self._entries.setdefault(model, _Entry())
        before = sum(entry.learned.values())
        raised = False
        for device, size in readings.items():
            if size > entry.learned.get(device, 0):
                entry.learned[device] = size
                raised = True
        if not raised:
            return False
        after = sum(entry.learned.values())
        declared = self.declared(model)
        if declared is not None and after > declared:
            self._log.warning(
                "model %s measured %s, above its declared vram %s: using %s from now on. "
                "The declaration was too low and risked an out-of-memory; set models.%s.vram to at least %s",
                model, format_bytes(after), format_bytes(declared), format_bytes(after), model,
                format_bytes(after),
            )  # fmt: skip
        elif declared is None and after > before:
            self._log.info("model %s measured %s (learned footprint)", model, format_bytes(after))
        return True

    def forget(self, model: str) -> None:
        """Drop what was learned about `model` (its command changed and it now needs less, say)."""
        entry = self._entries.get(model)
        if entry is not None:
            entry.learned.clear()
            entry.load_time = None
        self._dormant.pop(model, None)

    def record_load_time(self, model: str, seconds: float) -> None:
        if seconds >= 0:
            self._entries.setdefault(model, _Entry()).load_time = float(seconds)

    def mark_used(self, model: str, now: float) -> None:
        self._entries.setdefault(model, _Entry()).last_used = now

    # persistence

    def load(self) -> None:
        """Read the state file if there is one; a missing or unreadable file starts the book empty."""
        if self.path is not None:
            self._load_file(self.path)
        self._warn_defaults()

    def save(self) -> bool:
        """Write learned values and load times atomically; False (with a warning) when that fails."""
        if self.path is None:
            return False
        models: dict[str, Any] = dict(self._dormant)
        for model, entry in sorted(self._entries.items()):
            record: dict[str, Any] = {}
            if entry.learned:
                record["learned"] = {str(d): b for d, b in sorted(entry.learned.items())}
            if entry.load_time is not None:
                record["load_time"] = entry.load_time
            if record:
                models[model] = record
        text = json.dumps({"version": _FORMAT_VERSION, "models": models}, indent=2, sort_keys=True) + "\n"
        try:
            _write_atomically(self.path, text)
        except OSError as exc:
            self._log.warning(
                "cannot save learned footprints to %s (%s): they will be relearned after a restart; "
                "make stateDir writable",
                self.path, exc,
            )  # fmt: skip
            return False
        return True

    def _load_file(self, path: Path) -> None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            # The normal first run: nothing learned yet.
            self._log.info("no learned footprints at %s yet; they are measured as models start", path)
            return
        except OSError as exc:
            self._log.warning("cannot read learned footprints from %s (%s): starting empty", path, exc)
            return
        try:
            entries = _parse(text)
        except ValueError as exc:
            self._log.warning(
                "learned footprints in %s are unreadable (%s): starting empty; the file is rewritten "
                "at the next save",
                path, exc,
            )  # fmt: skip
            return
        self._entries.clear()
        self._dormant.clear()
        for model, (entry, raw) in entries.items():
            if model in self._models:
                self._entries[model] = entry
            else:
                self._dormant[model] = raw

    def _warn_defaults(self) -> None:
        for model in sorted(self._models):
            if model in self._warned_default or self.footprint_of(model).source != "default":
                continue
            self._warned_default.add(model)
            fp = self.footprint_of(model)
            self._log.warning(
                "model %s has no declared vram and has not been measured yet: until it has run once it "
                "is treated as needing the whole budget (%s) and runs alone; set models.%s.vram to let "
                "it share",
                model, format_bytes(fp.total), model,
            )  # fmt: skip


def _split_evenly(total: int, devices: tuple[int, ...]) -> dict[int, int]:
    if not devices:
        return {}
    share, rest = divmod(total, len(devices))
    # The remainder goes to the first devices so the shares sum to the declaration exactly.
    return {d: share + (1 if i < rest else 0) for i, d in enumerate(devices)}


def _parse(text: str) -> dict[str, tuple[_Entry, Any]]:
    """model -> (entry, its raw JSON); ValueError naming the first thing that is wrong."""
    data = json.loads(text)  # JSONDecodeError is a ValueError
    if not isinstance(data, dict) or data.get("version") != _FORMAT_VERSION:
        raise ValueError(f"expected an object with version {_FORMAT_VERSION}")
    models = data.get("models")
    if not isinstance(models, dict):
        raise ValueError("`models` must be an object")
    result: dict[str, tuple[_Entry, Any]] = {}
    for model, raw in models.items():
        if not isinstance(raw, dict):
            raise ValueError(f"models.{model} must be an object")
        entry = _Entry()
        learned = raw.get("learned", {})
        if not isinstance(learned, dict):
            raise ValueError(f"models.{model}.learned must be an object")
        for device, size in learned.items():
            if not (isinstance(device, str) and device.isdigit()) or type(size) is not int or size < 0:
                raise ValueError(f"models.{model}.learned.{device} must map a device index to bytes")
            if size:
                entry.learned[int(device)] = size
        load_time = raw.get("load_time")
        if load_time is not None:
            if type(load_time) not in (int, float) or load_time < 0 or not math.isfinite(load_time):
                raise ValueError(f"models.{model}.load_time must be seconds >= 0")
            entry.load_time = float(load_time)
        result[model] = (entry, raw)
    return result


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
