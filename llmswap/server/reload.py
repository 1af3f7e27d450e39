"""Reloading the configuration of a running server, and noticing that the file changed.

`reload_from_sources(state, sources)` loads the config again (the file, and the files of the config
directory as they are now) and, if it loads, `apply_config` swaps a successor router
into the state (`llmswap.router.handover`): unchanged models keep their running process, the others are
stopped and start again on demand. A file that does not load, or a config no router can be built for,
changes nothing: the running config keeps serving and the reason is logged.

`ConfigWatcher` polls the sources (`--watch-config`): the config file and the directory's listing, each
file's size and mtime every interval, a file's content hash when they move. A file added to or removed
from the directory is a change; touching a file or rewriting the same text is none. A config file or a
directory that is missing for a moment (an editor replacing it) is not a change either: the next look
tells.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmswap.config import Config, ConfigError, ConfigSources
from llmswap.router.handover import adoptable, successor_router
from llmswap.server.state import ServerState

log = logging.getLogger("llmswap.reload")

WATCH_INTERVAL = 1.0  # seconds between looks at the config file


@dataclass(frozen=True)
class ReloadOutcome:
    """What a reload did; `applied` is False when the running config was kept (`error` says why)."""

    applied: bool
    error: str = ""
    kept: tuple[str, ...] = ()  # unchanged models: their process (running or not) carried over
    running: tuple[str, ...] = ()  # the kept ones whose process was running then
    changed: tuple[str, ...] = ()  # their old process was stopped; the new one starts on demand
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def to_preload(self) -> tuple[str, ...]:
        """Models to preload after the reload: the ones with a new process (unchanged ones keep theirs)."""
        return (*self.changed, *self.added)


def reload_from_sources(state: ServerState, sources: ConfigSources) -> ReloadOutcome:
    """Load the config again and apply it; on any error keep the running config and log why."""
    try:
        config = sources.load()
    except ConfigError as err:
        log.error("config reload: %s does not load, the running config stays in use:\n%s", sources, err)
        return ReloadOutcome(applied=False, error=str(err))
    return apply_config(state, config)


def apply_config(state: ServerState, config: Config) -> ReloadOutcome:
    """Make `config` the running config, keeping every unchanged model's process.

    Synchronous on purpose: between reading the old router and publishing the new one nothing else runs,
    so no request can fall between the two.
    """
    old = state.router
    try:
        new = successor_router(old, config)
    except (ValueError, RuntimeError) as err:
        log.error("config reload: %s cannot be used, the running config stays in use: %s",
                  config.path or "the new config", err)
        return ReloadOutcome(applied=False, error=str(err))
    new.start()
    state.install(new, config)
    for warning in config.warnings:
        log.warning("config: %s", warning)
    kept = adoptable(old.config, config)
    outcome = ReloadOutcome(
        applied=True,
        kept=tuple(sorted(kept)),
        running=tuple(sorted(m for m in kept if m in old.processes and old.processes[m].state.is_running)),
        changed=tuple(sorted(m for m in config.models if m in old.config.models and m not in kept)),
        added=tuple(sorted(m for m in config.models if m not in old.config.models)),
        removed=tuple(sorted(m for m in old.config.models if m not in config.models)),
    )
    log.info("config reload: applied; %s", describe_outcome(outcome))
    return outcome


def describe_outcome(outcome: ReloadOutcome) -> str:
    """What a reload did to each model, in one line: only the groups that have any."""
    idle = tuple(m for m in outcome.kept if m not in outcome.running)
    parts = [
        (outcome.running, "kept running"),
        (idle, "kept, not running"),
        (outcome.changed, "changed, stopped (they start again on demand)"),
        (outcome.removed, "removed, stopped"),
        (outcome.added, "added"),
    ]
    said = [f"{what}: {', '.join(models)}" for models, what in parts if models]
    return "; ".join(said) if said else "no model is configured"


@dataclass(frozen=True)
class _Stamp:
    size: int
    mtime_ns: int
    inode: int


class ConfigWatcher:
    """Tells whether the config's content changed since the last look (or since it was loaded)."""

    def __init__(self, sources: ConfigSources | str | Path, interval: float = WATCH_INTERVAL) -> None:
        self.sources = sources if isinstance(sources, ConfigSources) else ConfigSources(Path(sources))
        self.interval = interval
        self._stamps = self._look() or {}
        self._digests = {path: digest for path in self._stamps if (digest := _hash(path)) is not None}

    def _look(self) -> dict[Path, _Stamp] | None:
        """Each source file's stamp, or None when the config file or the directory is missing just now."""
        paths = [] if self.sources.file is None else [self.sources.file]
        try:
            paths += self.sources.directory_files()
        except ConfigError:
            return None
        stamps: dict[Path, _Stamp] = {}
        for path in paths:
            try:
                info = os.stat(path)
            except OSError:
                if path == self.sources.file:
                    return None  # being replaced, or gone: the next look tells
                continue  # a directory file gone since the listing: removed
            stamps[path] = _Stamp(info.st_size, info.st_mtime_ns, info.st_ino)
        return stamps

    def changed(self) -> bool:
        """Whether the content differs from the last look; cheap (a listing and stats) while untouched."""
        stamps = self._look()
        if stamps is None or stamps == self._stamps:
            return False
        digests: dict[Path, str] = {}
        for path, stamp in stamps.items():
            known = self._digests.get(path)
            if known is not None and self._stamps.get(path) == stamp:
                digests[path] = known
                continue
            digest = _hash(path)
            if digest is None:
                return False  # gone between the stat and the read: the next look tells
            digests[path] = digest
        self._stamps = stamps
        if digests == self._digests:
            return False
        self._digests = digests
        return True

    async def watch(self, on_change: Callable[[], None]) -> None:
        """Call `on_change` after every change of content, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                if self.changed():
                    on_change()
            except Exception:
                log.exception("config watcher: checking %s failed", self.sources)


def _hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
