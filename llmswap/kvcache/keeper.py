"""Save a llama-server's slots before llmswap stops it, restore them after llmswap starts it again.

The `Process` of a `kvCache: true` model owns one `KvKeeper` and calls it at three points of each life:
`prepare()` before the spawn (the folder, staleness), `restore()` once the server is healthy and before any
request is granted to it, `save()` when a stop llmswap asked for begins (a swap, a ttl, an unload, the
shutdown), before the stop signal. A server that dies by itself is never saved: its folder stays unclean
(see `disk.py`) and its saves are deleted at the next start.

llama-server's API (`tools/server`): `GET /slots` lists the slots; `n_prompt_tokens` is there only for a slot
that served a request since the server started, so a slot restored and not used since is not saved again
and keeps its earlier save (with `kvCache.save: auto`, also a slot whose save would not pay for itself:
`rates.py`). `POST /slots/{id}?action=save` and `?action=restore` take `{"filename": NAME}`
inside `--slot-save-path` and answer `n_saved`/`n_written` and `n_restored`/`n_read`. A save waits while
its slot is busy, so every call is bounded by a client timeout; a failed or late call is logged and the
stop or the start goes on without it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import aiohttp

from llmswap import calls
from llmswap.config.model import ModelConfig
from llmswap.kvcache.disk import PARTIAL, SaveFolder, fingerprint, hold_bound, slot_file
from llmswap.kvcache.rates import KvRates

log = logging.getLogger("llmswap.kvcache")


@dataclass(frozen=True)
class KvReport:
    """What one save or restore of a model's slots did (a `ProcessEvent`'s `kv`)."""

    action: Literal["save", "restore"]
    slots: int = 0  # slots saved or restored
    tokens: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failed: str = ""  # why a slot could not be saved or restored, when one could not
    skipped: int = 0  # slots not saved because processing their tokens again is cheaper (`save: auto`)


@dataclass(frozen=True)
class KvShared:
    """What the keepers of every model of one llmswap share (the router owns it; a reload's successor keeps
    it): the rates `kvCache.save: auto` decides from, and the saves a restore is reading right now, which the
    disk bound never deletes."""

    rates: KvRates = field(default_factory=KvRates)
    restoring: set[Path] = field(default_factory=set)


class KvKeeper:
    """The slot saves of one model's server (see the module's doc)."""

    def __init__(self, config: ModelConfig, shared: KvShared) -> None:
        assert config.kv_cache is not None and config.kv_dir is not None
        self.config = config
        self.settings = config.kv_cache
        self.shared = shared
        self.rates = shared.rates
        self.folder = SaveFolder(config.kv_dir)
        self.written_by = ""  # the fingerprint of this life's server (`disk.fingerprint`), once prepared
        self._restorable: list[int] = []

    def prepare(self) -> None:
        """Before a spawn (raises OSError when the folder cannot be made). The `${PORT}` the model was given
        is not part of what wrote the saves: adding a model to the config shifts the ports after it."""
        text, argv = self.config.cmd_text, self.config.cmd
        if self.config.port is not None:
            port = str(self.config.port)
            text = text.replace(port, "${PORT}")
            argv = tuple("${PORT}" if part == port else part for part in argv)
        self.written_by = fingerprint(text, argv)
        self._restorable = self.folder.prepare(self.written_by)

    async def restore(self) -> KvReport | None:
        """Restore every slot with a save, before the server gets its first request (None: none had one)."""
        report = await self._restore_all(time.monotonic()) if self._restorable else None
        self.folder.serving()
        return report

    async def save(self) -> KvReport | None:
        """Save every slot that holds tokens it has not saved; then the folder is clean again (None: no slot
        served a request since the start)."""
        began = time.monotonic()
        report = KvReport("save")
        try:
            async with self._session(self.settings.save_timeout) as session:
                slots = await calls.call_json(session, "GET", f"{self._base}/slots")
                used = [(slot["id"], int(slot.get("n_prompt_tokens") or 0)) for slot in slots
                        if isinstance(slot, dict) and isinstance(slot.get("id"), int)
                        and int(slot.get("n_prompt_tokens") or 0) > 0]
                for slot, tokens in used:
                    choice = self.rates.choose(self.config.id, self.settings.dir, tokens, self.settings.save)
                    if not choice.save:
                        self.rates.skip(self.config.id)
                        report = replace(report, skipped=report.skipped + 1)
                        log.info("[%s] kv cache: slot %d not saved: %s", self.config.id, slot, choice.reason)
                        continue
                    report = await self._save_one(session, slot, report)
        except (calls.CallFailed, *calls.UNREACHABLE) as exc:
            report = _failed(report, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        self.folder.finished(self.written_by)
        await asyncio.to_thread(hold_bound, self.settings.dir, self.settings.max_size,
                                frozenset(self.shared.restoring))
        if not report.slots and not report.failed and not report.skipped:
            return None
        report = _done(report, began)
        if report.failed:
            log.warning("[%s] kv cache: save incomplete (%s); the stop goes on", self.config.id,
                        report.failed)
        elif report.slots:
            log.info("[%s] kv cache: saved %d slot(s), %d tokens, %d bytes in %.3fs", self.config.id,
                     report.slots, report.tokens, report.bytes, report.seconds)
        return report

    async def _save_one(self, session: aiohttp.ClientSession, slot: int, report: KvReport) -> KvReport:
        began = time.monotonic()
        answer = await calls.call_json(session, "POST", f"{self._base}/slots/{slot}?action=save",
                                       {"filename": slot_file(slot) + PARTIAL})
        seconds = time.monotonic() - began
        saved = self.folder.saved(slot, int(answer.get("n_saved", 0)), seconds)
        if saved is None:
            return _failed(report, f"slot {slot} was not written")
        self.rates.learn_save(self.config.id, self.settings.dir, saved.tokens, saved.bytes, seconds)
        if saved.bytes > self.settings.max_size:
            saved.path.unlink(missing_ok=True)
            return _failed(report, f"slot {slot}'s save ({saved.bytes} bytes) is larger than kvCache.maxSize")
        return replace(report, slots=report.slots + 1, tokens=report.tokens + saved.tokens,
                       bytes=report.bytes + saved.bytes)

    async def _restore_all(self, began: float) -> KvReport:
        report = KvReport("restore")
        paths = {self.folder.path / slot_file(slot) for slot in self._restorable}
        self.shared.restoring.update(paths)
        try:
            async with self._session(self.settings.restore_timeout) as session:
                for slot in self._restorable:
                    one = time.monotonic()
                    try:
                        answer = await calls.call_json(session, "POST",
                                                       f"{self._base}/slots/{slot}?action=restore",
                                                       {"filename": slot_file(slot)})
                    except calls.CallFailed as failed:
                        report = _failed(report, f"slot {slot}: {failed.message}")
                        continue
                    self.rates.learn_restore(self.settings.dir, int(answer.get("n_read", 0)),
                                             time.monotonic() - one)
                    self.folder.touch(slot)
                    report = replace(report, slots=report.slots + 1,
                                     tokens=report.tokens + int(answer.get("n_restored", 0)),
                                     bytes=report.bytes + int(answer.get("n_read", 0)))
        except calls.UNREACHABLE as exc:
            report = _failed(report, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        finally:
            self.shared.restoring.difference_update(paths)
        report = _done(report, began)
        if report.failed:
            log.warning("[%s] kv cache: restore incomplete (%s); those slots start empty", self.config.id,
                        report.failed)
        log.info("[%s] kv cache: restored %d slot(s), %d tokens in %.3fs", self.config.id, report.slots,
                 report.tokens, report.seconds)
        return report

    @property
    def _base(self) -> str:
        return self.config.proxy.rstrip("/")

    def _session(self, seconds: float) -> aiohttp.ClientSession:
        return calls.session(seconds)


def prepare_kv_dir(config: ModelConfig, keeper: KvKeeper | None) -> None:
    """Before a spawn: the model's `${KV_DIR}` exists (llama-server exits when `--slot-save-path` does not)
    and, for a `kvCache` model, its saves are checked. Raises OSError."""
    if config.kv_dir is not None:
        config.kv_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if keeper is not None:
        keeper.prepare()


def _failed(report: KvReport, why: str) -> KvReport:
    return replace(report, failed=f"{report.failed}; {why}" if report.failed else why)


def _done(report: KvReport, began: float) -> KvReport:
    return replace(report, seconds=time.monotonic() - began)
