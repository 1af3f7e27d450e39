"""The slot saves on disk: one folder per model, what makes them stale, and the bound on their total size.

A model's folder (`${KV_DIR}`) holds `slot<N>.bin`, one file per llama-server slot, and `state.json`:

    {"fingerprint": "...", "clean": true, "slots": {"0": {"tokens": 3223, "bytes": 99000000, "seconds": 0.2}}}

`fingerprint` names what wrote the saves (the command line, and the size and modification time of every
file it names: the model's weights above all). llama-server restores any file of the same architecture
without checking which weights wrote it, so a save is restored only when the fingerprint still matches.
`clean` is false from the moment a server that restored its saves serves requests until llmswap saves and
stops it; a folder found unclean at the next start (the server died by itself, or llmswap was killed) holds
saves nobody vouches for, and they are deleted. A save is written as `slot<N>.bin.partial` and renamed
once llama-server says it is complete, so a save cut short is never restored.

Pure file work, no event loop: the caller (`keeper.py`) runs it between its HTTP calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("llmswap.kvcache")

STATE_FILE = "state.json"
PARTIAL = ".partial"
FOLDER_MODE = 0o700  # saves hold the conversations' state: nobody else on the machine reads them

def slot_file(slot: int) -> str:
    return f"slot{slot}.bin"


def fingerprint(cmd_text: str, argv: tuple[str, ...], *, cwd: Path | None = None) -> str:
    """A hash of the command line and of the size and mtime of each existing file an argument names
    (`-m model.gguf` and `--model=model.gguf` alike); folders are left out (the save folder is one)."""
    digest = hashlib.sha256(cmd_text.encode())
    base = cwd or Path.cwd()
    for part in argv:
        for candidate in {part, part.partition("=")[2]} - {""}:
            path = Path(candidate).expanduser()
            path = path if path.is_absolute() else base / path
            try:
                if path.is_file():
                    stat = path.stat()
                    digest.update(f"\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
            except OSError:
                continue
    return digest.hexdigest()


@dataclass(frozen=True)
class Save:
    """One slot's save as it is on disk."""

    model_dir: Path
    slot: int
    tokens: int  # -1: not known (no state entry)
    bytes: int
    used: float  # wall clock of its last save or restore (its mtime): what the disk bound orders by

    @property
    def path(self) -> Path:
        return self.model_dir / slot_file(self.slot)


class SaveFolder:
    """One model's folder of saves."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def prepare(self, current: str) -> list[int]:
        """Before a start: the folder exists with mode 0700, partial saves are gone, stale saves are deleted.
        Returns the slots whose saves may be restored."""
        self.path.parent.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        self.path.mkdir(mode=FOLDER_MODE, exist_ok=True)
        os.chmod(self.path, FOLDER_MODE)
        for leftover in self.path.glob("*" + PARTIAL):
            leftover.unlink(missing_ok=True)
        state = self._read()
        if state.get("fingerprint") != current or state.get("clean") is not True:
            saves = self.saves()
            if saves:
                why = "the model's command or files changed" if state.get("clean") is True else (
                    "its server stopped without llmswap saving it")
                log.info("kv cache: deleting %d stale save(s) in %s (%s)", len(saves), self.path, why)
            self.clear()
            self._write({"fingerprint": current, "clean": True, "slots": {}})
        return [save.slot for save in self.saves()]

    def serving(self) -> None:
        """The server restored what it could and now serves: until it is saved, the folder is not clean."""
        self._update(clean=False)

    def saved(self, slot: int, tokens: int, seconds: float) -> Save | None:
        """A save llama-server finished under the partial name: make it the slot's save."""
        partial = self.path / (slot_file(slot) + PARTIAL)
        final = self.path / slot_file(slot)
        try:
            os.replace(partial, final)
        except OSError as exc:
            log.warning("kv cache: cannot keep the save of slot %d in %s: %s", slot, self.path, exc)
            return None
        state = self._read()
        slots = state.setdefault("slots", {})
        slots[str(slot)] = {"tokens": tokens, "seconds": round(seconds, 4)}
        self._write(state)
        return self._save(slot, slots)

    def finished(self, current: str) -> None:
        """The server was saved and is stopping: its saves are vouched for again."""
        self._update(clean=True, fingerprint=current)

    def clear(self, restoring: Collection[Path] = ()) -> list[Save]:
        """Delete every save but one a restore is reading this moment (`restoring`: it goes at the next
        clear); returns what was deleted."""
        deleted = [save for save in self.saves() if save.path not in restoring]
        for save in deleted:
            save.path.unlink(missing_ok=True)
        self._update(slots={})
        return deleted

    def saves(self) -> list[Save]:
        slots = self._read().get("slots", {})
        found = []
        for path in self.path.glob("slot*.bin"):
            number = path.name[len("slot"):-len(".bin")]
            if number.isdigit():
                save = self._save(int(number), slots)
                if save is not None:
                    found.append(save)
        return sorted(found, key=lambda save: save.slot)

    def touch(self, slot: int) -> None:
        """A restore used the slot's save: it is the most recently used now."""
        try:
            os.utime(self.path / slot_file(slot))
        except OSError:
            pass

    def _save(self, slot: int, slots: dict[str, Any]) -> Save | None:
        try:
            stat = (self.path / slot_file(slot)).stat()
        except OSError:
            return None
        tokens = slots.get(str(slot), {}).get("tokens", -1)
        return Save(self.path, slot, int(tokens), stat.st_size, stat.st_mtime)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _update(self, **changes: object) -> None:
        state = self._read()
        state.update(changes)
        self._write(state)

    def _write(self, state: dict[str, Any]) -> None:
        target = self.path / STATE_FILE
        temporary = target.with_name(STATE_FILE + PARTIAL)
        try:
            temporary.write_text(json.dumps(state, sort_keys=True))
            os.replace(temporary, target)
        except OSError as exc:
            log.warning("kv cache: cannot write %s: %s", target, exc)


def all_saves(root: Path) -> list[Save]:
    """Every save of every model folder under `root`."""
    if not root.is_dir():
        return []
    found: list[Save] = []
    for folder in sorted(root.iterdir()):
        if folder.is_dir():
            found.extend(SaveFolder(folder).saves())
    return found


def hold_bound(root: Path, max_size: int, restoring: Collection[Path] = ()) -> list[Save]:
    """Delete the least recently used saves under `root` until their total is at most `max_size`, never one
    in `restoring` (being read by a restore); a single save larger than `max_size` is deleted whatever its
    age. Returns what was deleted. It reads every model's folder: run it on a worker thread."""
    protected = frozenset(restoring)
    saves = sorted(all_saves(root), key=lambda save: save.used)
    # A save larger than the bound is never kept, however recent (once its restore has read it).
    deleted = [save for save in saves if save.bytes > max_size and save.path not in protected]
    total = sum(save.bytes for save in saves) - sum(save.bytes for save in deleted)
    for save in saves:
        if save.bytes > max_size:
            continue
        if total <= max_size:
            break
        if save.path not in protected:
            deleted.append(save)
            total -= save.bytes
    for save in deleted:
        save.path.unlink(missing_ok=True)
    if deleted:
        log.info("kv cache: deleted %d least recently used save(s) (%d bytes) to stay within %d bytes",
                 len(deleted), sum(save.bytes for save in deleted), max_size)
    return deleted
