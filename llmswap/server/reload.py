"""Reloading the configuration of a running server, and noticing that the file changed.

`reload_from_file(state, path)` loads the file and, if it loads, `apply_config` swaps a successor router
into the state (`llmswap.router.handover`): unchanged models keep their running process, the others are
stopped and start again on demand. A file that does not load, or a config no router can be built for,
changes nothing: the running config keeps serving and the reason is logged.

`ConfigWatcher` polls the file (`--watch-config`): its size and mtime every interval, its content hash
when they move, so touching the file or rewriting the same text triggers nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmswap.config import Config, ConfigError, load_config
from llmswap.router.handover import Handover, adoptable, successor_router
from llmswap.server.state import ServerState

log = logging.getLogger("llmswap.reload")

WATCH_INTERVAL = 1.0  # seconds between looks at the config file


@dataclass(frozen=True)
class ReloadOutcome:
    """What a reload did; `applied` is False when the running config was kept (`error` says why)."""

    applied: bool
    error: str = ""
    kept: tuple[str, ...] = ()  # unchanged models: their process (running or not) carried over
    changed: tuple[str, ...] = ()  # their old process was stopped; the new one starts on demand
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    handover: Handover | None = None

    @property
    def to_preload(self) -> tuple[str, ...]:
        """Models to preload after the reload: the ones with a new process (unchanged ones keep theirs)."""
        return (*self.changed, *self.added)


def reload_from_file(state: ServerState, path: str | Path) -> ReloadOutcome:
    """Load `path` and apply it; on any error keep the running config and log why."""
    try:
        config = load_config(path)
    except ConfigError as err:
        log.error("config reload: %s does not load, the running config stays in use:\n%s", path, err)
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
    state.router = new
    state.config = config
    for warning in config.warnings:
        log.warning("config: %s", warning)
    kept = adoptable(old.config, config)
    outcome = ReloadOutcome(
        applied=True,
        kept=tuple(sorted(kept)),
        changed=tuple(sorted(m for m in config.models if m in old.config.models and m not in kept)),
        added=tuple(sorted(m for m in config.models if m not in old.config.models)),
        removed=tuple(sorted(m for m in old.config.models if m not in config.models)),
        handover=new.handover_in,
    )
    log.info("config reload: applied (unchanged %s, restarted %s, added %s, removed %s)",
             _names(outcome.kept), _names(outcome.changed), _names(outcome.added), _names(outcome.removed))
    return outcome


def _names(models: tuple[str, ...]) -> str:
    return "[" + ", ".join(models) + "]"


@dataclass(frozen=True)
class _Stamp:
    size: int
    mtime_ns: int
    inode: int


class ConfigWatcher:
    """Tells whether a config file's content changed since the last look (or since it was loaded)."""

    def __init__(self, path: str | Path, interval: float = WATCH_INTERVAL) -> None:
        self.path = Path(path)
        self.interval = interval
        self._stamp = self._stat()
        self._digest = self._hash()

    def _stat(self) -> _Stamp | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None  # being replaced, or gone: the next look tells
        return _Stamp(info.st_size, info.st_mtime_ns, info.st_ino)

    def _hash(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None

    def changed(self) -> bool:
        """Whether the content differs from the last look; cheap (one stat) while the file is untouched."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        digest = self._hash()
        if digest is None or digest == self._digest:
            return False
        self._digest = digest
        return True

    async def watch(self, on_change: Callable[[], None]) -> None:
        """Call `on_change` after every change of content, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                if self.changed():
                    on_change()
            except Exception:
                log.exception("config watcher: checking %s failed", self.path)
